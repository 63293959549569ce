#!/bin/bash
# A release's wheels as transfer parts, without recompressing (xz of a 1.5 GB tree takes most of an hour on 2 busy
# cores; the wheels are compressed already):  bash tests/gpu/wheel_parts.sh WHEELS_DIR OUTDIR
# OUTDIR/p1..pN each hold one wheels.tar.partNN of at most 55 MiB, p1 also PARTS; `run_on_device.sh release`
# (PAYLOAD=OUTDIR) stages them call by call and unzips the wheels there in parallel once all have arrived.
# WHEELS_DIR: e.g. the wheels build-payloads downloads (its work dir's wheels/), with --extra torch==X triton==Y
# nvidia-nccl-cu13==Z for a release that pins another torch than the device's.
set -eu
W=${1:?wheels dir}; O=${2:?out dir}
rm -rf "$O"; mkdir -p "$O/tmp"
tar -C "$W" -cf - . | split -b 55M -d -a 2 --numeric-suffixes=1 - "$O/tmp/wheels.tar.part"
k=0; for f in "$O"/tmp/wheels.tar.part*; do k=$((k+1)); mkdir -p "$O/p$k"; mv "$f" "$O/p$k/"; done
rmdir "$O/tmp"; echo $k > "$O/p1/PARTS"
echo "$(ls "$W"/*.whl | wc -l) wheels, $(du -sh "$O" | cut -f1) in $k parts under $O/p1..p$k"
