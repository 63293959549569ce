#!/bin/bash
# Several releases' selftests side by side on one GPU, in the call that carries the last payload part:
#   RELEASES="23 17" ARGS_23="--targets ..." ARGS_17="..." PROMPT_SEEDS=91,92,93 bash tests/gpu/run_releases.sh
# Each release NN: its parts staged by earlier calls (run_on_device.sh release, PAYLOAD=.gpu-payloadNN), unpacked
# here into /root/siteNN with the plugin wheel; then `selftest` per release at once (STEP_TIMEOUT each); everything
# under $OUT packed into one archive (at most 8 files come back).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for r in ${RELEASES:?}; do
  PAYLOAD=.gpu-payload$r SITE=/root/site$r bash tests/gpu/run_on_device.sh release 2>&1 | tee -a "$OUT/release.txt" | tail -3
done
for r in $RELEASES; do
  a=ARGS_$r
  mkdir -p "$OUT/r$r"
  (OUT=$OUT/r$r SITE=/root/site$r SELFTEST_ARGS="${!a:-}" bash tests/gpu/run_on_device.sh selftest > "$OUT/r$r/step.txt" 2>&1) &
done
wait
for r in $RELEASES; do echo "=== $r"; grep -E "selftest exit|rows:|targets \(|^  [a-z_0-9]+ " "$OUT/r$r/selftest.txt" | cut -c1-220 | head -14; tail -25 "$OUT/r$r/step.txt" | cut -c1-240; done
bash tests/gpu/run_on_device.sh pack > /dev/null
