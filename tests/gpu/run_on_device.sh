#!/bin/bash
# Runs on the H100 machine, from the repository root, after the sglang payload's parts were
# transferred (see ../shared/gpu/README.md): unpacks once, installs the plugin wheel built
# here into the payload's site dir (sglang then finds it through its entry point), and runs
# the named steps. Output goes to $OUT.
#   bash tests/gpu/run_on_device.sh STEP [STEP ...]
# Steps: unpack | unpack12 | release | smoke | trtllm_eagle_accept | xqa_verify | fa3_seq | fa3_eagle3 | fa3_control | cost | fp8 | fp8w |
#        guard_kernel | guard_server | gpu_tests | bench_decode | bench_fix_step | graph_kernel | bench_xqa | servers | fi7 | pack |
#        llama4 | llama4_eagle | llama4_tree | llama4_tree_wide | llama4_exact | gptoss_exact | gemma4_exact | fi_kernel | bench_fi | fi_verify | triton_mtp |
#        bench_fix_cost | throughput | throughput_rows | selftest | bg | bg_selftest | wait_bg
# servers: SCENARIOS="xqa_verify trtllm_eagle_accept ..." PARALLEL=N (side by side on the GPU); SITE: another unpacked release
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
for step in "$@"; do
  echo "=== step $step $(date +%T)"
  case $step in
    unpack)
      bash .gpu-payload/unpack.sh .gpu-payload true
      python3 -m pip install -q --no-index --no-deps --upgrade --target /root/site .gpu-payload/plugin/*.whl
      [ -d .gpu-payload/fi ] && python3 -m pip install -q --no-index --no-deps --upgrade --target /root/fi .gpu-payload/fi/*.whl
      # another build of the plugin (e.g. an older commit), for "before" rows: OLD_PLUGIN=/root/oldplugin
      for d in oldplugin variant; do  # other builds of the plugin, for "before" rows: /root/oldplugin, /root/variant
        [ -d .gpu-payload/$d ] && python3 -m pip install -q --no-index --no-deps --upgrade --target /root/$d .gpu-payload/$d/*.whl
      done
      ls /root/site | grep -i -E "swa|sglang-|sglang_swa" ;;
    release)  # PAYLOAD=.gpu-payloadNN SITE=/root/siteNN: one release beside others. Each call carries some of the
              # payload's parts (the machine keeps them while warm); once all are staged they are unpacked into SITE
              # and the plugin wheel (.gpu-plugin/) installed there. Parts: build-payloads' site.tar.xz.partNN, or
              # wheels.tar.partNN (the release's wheels as they are: no compression here, unzipped there in parallel).
              # A release whose payload carries its own torch (0.5.18+) shadows the machine's through PYTHONPATH=SITE.
      st=/root/stage_$(basename ${PAYLOAD:?PAYLOAD=.gpu-payloadNN}); mkdir -p $st ${SITE:?SITE=/root/siteNN}
      cp -n $PAYLOAD/p*/* $st/ 2>/dev/null
      n=$(cat $st/PARTS 2>/dev/null || echo 0); have=$(ls $st/*.part* 2>/dev/null | wc -l)
      if [ "$n" != 0 ] && [ "$have" = "$n" ] && [ ! -f $st/unpacked ]; then
        t0=$(date +%s)
        if ls $st/wheels.tar.part* > /dev/null 2>&1; then
          # -i: parts appended later (another tar, e.g. wheels build-payloads skips) follow the first tar's end
          mkdir -p $st/w && cat $st/wheels.tar.part* | tar -x -i -C $st/w && rm -f $st/wheels.tar.part* \
            && ls $st/w/*.whl | xargs -P 16 -I{} python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" {} $SITE \
            && find $SITE -path "*/bin/*" -type f -exec chmod +x {} +  # zipfile keeps no mode bits (triton's ptxas)
        elif command -v xz > /dev/null; then cat $st/site.tar.xz.part* | xz -dc -T0 | tar -x -C $SITE; else
          cat $st/site.tar.xz.part* | python3 -c "import sys,tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall(sys.argv[1])" $SITE; fi \
          && touch $st/unpacked && echo "payload unpacked into $SITE in $(( $(date +%s) - t0 )) s"
      fi
      [ -f $st/unpacked ] || { echo "have $have of $n parts"; exit 0; }
      # unpacked from wheels: their .pth files, and no torchvision against the payload's own torch (see the file)
      if [ -d $st/w ]; then cp tests/gpu/payload_sitecustomize.py $SITE/sitecustomize.py; fi
      python3 -m pip install -q --no-index --no-deps --upgrade --target $SITE .gpu-plugin/*.whl
      # PAYLOAD/extra: wheels build-payloads leaves out that the release imports where the selftest runs
      # (0.5.17: sgl-deep-gemm; 0.5.23: sgl-flash-mla, imported by the EAGLE draft's CUDA-graph capture);
      # carried with the last part's call (installed once all parts are staged)
      ls $PAYLOAD/extra/*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --upgrade --target $SITE $PAYLOAD/extra/*.whl
      (cd /tmp && PYTHONPATH=$SITE python3 -c "import torch, sglang, sgl_kernel, flashinfer, triton; from importlib.metadata import version as v; print('$SITE: sglang', v('sglang'), 'sglang-kernel', v('sglang-kernel'), 'flashinfer', v('flashinfer-python'), 'torch', torch.__version__, 'triton', triton.__version__, 'plugin', v('sglang-swa-plugin'), torch.cuda.get_device_name())" 2>&1 | tail -3) ;;
    unpack12)  # a second release beside the first: .gpu-payload12/unpack.sh unpacks into /root/site12
      bash .gpu-payload12/unpack.sh .gpu-payload12 true
      python3 -m pip install -q --no-index --no-deps --upgrade --target /root/site12 .gpu-payload/plugin/*.whl
      PYTHONPATH=/root/site12 python3 -c "from importlib.metadata import version as v; print('site12: sglang', v('sglang'), 'plugin', v('sglang-swa-plugin'))" ;;
    smoke)
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
      PYTHONPATH=/root/site python3 -c "import sglang, sgl_kernel, flashinfer, torch; from importlib.metadata import version as v; print('sglang', v('sglang'), 'flashinfer', v('flashinfer-python'), 'torch', torch.__version__, torch.cuda.get_device_name())"
      (cd /tmp && PYTHONPATH=/root/site python3 -m sglang_swa_plugin.cli doctor) ;;
    fi_kernel)  # flashinfer_swa_verify against torch attention, eager and CUDA graph, topk 1/2, stock rows too
      repo=$(pwd); (cd /tmp && OUT=$OUT PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-500} python3 -m pytest -q -rs -s -m gpu \
        "$repo/tests/gpu/test_flashinfer_swa_verify_gpu.py" -p no:cacheprovider 2>&1 | tee "$OUT/fi_kernel.log" | grep -E "^(fixed|stock)_|passed|failed|Error" | tail -20) ;;
    bench_fi)
      PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-400} python3 tests/benchmarks/bench_flashinfer_verify_gpu.py ${ITERS:-300} 2>&1 | tee "$OUT/bench_fi.log" | grep -E "BENCH_FI|Error" ;;
    trtllm_eagle_accept|xqa_verify|fa3_seq|fa3_eagle3|fa3_control|cost)
      PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-560} python3 tests/gpu/e2e_server.py $step --out "$OUT" ;;
    fi_verify)  # issue #17: 8 servers side by side (make_gemma4_pair's readout target + real EAGLE draft), and the
                # target's float32 greedy output on the CPU under sglang's math (cpu_float32) and transformers'
                # (cpu_transformers); fi_verify.json + fi_*.log in $OUT
      PARALLEL=${PARALLEL:-8} MEM_FRACTION=${MEM_FRACTION:-0.8} PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-560} \
        python3 tests/gpu/e2e_server.py fi_verify --out "$OUT" 2>&1 | tail -3 ;;
    triton_mtp)  # issue #18: 12 servers side by side (tests/gpu/e2e_server.py triton_mtp)
      PARALLEL=${PARALLEL:-12} MEM_FRACTION=${MEM_FRACTION:-0.8} PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-530} \
        python3 tests/gpu/e2e_server.py triton_mtp --out "$OUT" 2>&1 | tail -5 ;;
    fp8)
      PYTHONPATH=/root/fi:/root/site timeout ${STEP_TIMEOUT:-400} python3 tests/gpu/fp8_xqa_probe.py --json "$OUT/fp8_xqa.json" ;;
    fp8w)  # the plugin's calls and the sanity cases again on a sliding-window layer
      PYTHONPATH=/root/fi:/root/site timeout ${STEP_TIMEOUT:-400} python3 tests/gpu/fp8_xqa_probe.py --window-left 31 \
        --cases bf16_q1,bf16_qN_mask,bf16_qN_nomask,plugin_bf16_qN,plugin_fp8cast_qN --json "$OUT/fp8_xqa_window31.json" ;;
    guard_kernel|guard_server)
      sel=$([ $step = guard_kernel ] && echo "not server and not throughput" || echo "seed_002_server")
      repo=$(pwd); (cd /tmp && OUT=$OUT PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-560} python3 -m pytest -q -rs -s -m gpu \
        "$repo/tests/gpu/test_swa_index_guard_gpu.py" -k "$sel" -p no:cacheprovider 2>&1 | tee "$OUT/$step.log" | tail -40) ;;
    bench_decode)
      PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-560} python3 tests/benchmarks/bench_decode_gpu.py ${PAIRS:-3} --out "$OUT" 2>&1 | tail -12 ;;
    bench_fix_step)  # SITE=/root/site12 runs it on another unpacked release
      PYTHONPATH=${SITE:-/root/site} timeout ${STEP_TIMEOUT:-400} python3 tests/benchmarks/bench_fix_step_gpu.py ${ITERS:-300} 2>&1 | tail -5 ;;
    graph_kernel)  # the fix inside a real CUDA graph; then the same test with the old plugin build
      repo=$(pwd)
      (cd /tmp && PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-400} python3 -m pytest -q -rs -m gpu \
        "$repo/tests/gpu/test_xqa_graph_replay_gpu.py" -p no:cacheprovider 2>&1 | tee "$OUT/graph_kernel.log" | tail -15)
      for d in oldplugin variant; do
        [ -d /root/$d ] && (cd /tmp && XQA_GRAPH_LABEL=$d PYTHONPATH=/root/$d:/root/site timeout ${STEP_TIMEOUT:-400} \
          python3 -m pytest -q -rs -m gpu "$repo/tests/gpu/test_xqa_graph_replay_gpu.py" -p no:cacheprovider 2>&1 \
          | tee "$OUT/graph_kernel_$d.log" | grep -E "passed|failed" | tail -2 | sed "s/^/$d: /")
      done ;;
    bench_xqa)
      PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-300} python3 tests/benchmarks/bench_xqa_verify_gpu.py ${BLOCKS:-15} 2>&1 | tail -12 ;;
    servers)
      PARALLEL=${PARALLEL:-8} MEM_FRACTION=${MEM_FRACTION:-0.8} OLD_PLUGIN=$([ -d /root/oldplugin ] && echo /root/oldplugin) \
        PYTHONPATH=${SITE:-/root/site} timeout ${STEP_TIMEOUT:-560} python3 tests/gpu/e2e_server.py ${SCENARIOS:-xqa_verify} --out "$OUT" ;;
    fi7)  # XQA's windowed multi-token path with the flashinfer releases sglang 0.5.22/0.5.23 pin
      python3 -m pip install -q --no-index --no-deps --upgrade --target /root/tvm .gpu-payload/fi7/apache_tvm_ffi*.whl
      for v in ${FI_VERSIONS:-071 072}; do
        [ $v = site ] || { mkdir -p /root/fi$v && tar -C /root/fi$v -xJf .gpu-payload/fi7/fi$v.tar.xz; }
        for W in 31 16; do
          W=$W PYTHONPATH=/root/fi$v:/root/tvm:/root/site timeout ${STEP_TIMEOUT:-300} python3 tests/gpu/xqa_window_semantics.py 2>&1 \
            | tee -a "$OUT/fi7.log" | grep -E "XQA_WINDOW|Error" | sed "s/^/flashinfer $v: /"
        done
      done ;;
    llama4)  # issue #19: 15 servers side by side (tests/gpu/e2e_server.py llama4_fa3)
      PARALLEL=${PARALLEL:-15} MEM_FRACTION=${MEM_FRACTION:-0.85} START_TIMEOUT=${START_TIMEOUT:-420} \
        PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-590} python3 tests/gpu/e2e_server.py llama4_fa3 --out "$OUT" 2>&1 | tail -5 ;;
    llama4_eagle)  # issue #19 item 2 (fa3_local_attn_verify): 13 servers side by side
      PARALLEL=${PARALLEL:-13} MEM_FRACTION=${MEM_FRACTION:-0.85} START_TIMEOUT=${START_TIMEOUT:-420} \
        PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-530} python3 tests/gpu/e2e_server.py llama4_eagle --out "$OUT" 2>&1 | tail -5 ;;
    llama4_tree)  # issue #19 item 2, topk > 1 (fa3_local_attn_tree_verify): 8 servers side by side
      PARALLEL=${PARALLEL:-8} MEM_FRACTION=${MEM_FRACTION:-0.85} START_TIMEOUT=${START_TIMEOUT:-420} \
        PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-530} python3 tests/gpu/e2e_server.py llama4_tree --out "$OUT" 2>&1 | tail -5 ;;
    llama4_exact)  # issue #26: the Llama 4 target against transformers' float32 output, PROMPT_SEEDS from the environment
      # the target's own checks (bf16 = float32, chunk +-1 changes most requests) on the CPU beside the servers
      (PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-560} python3 tests/gpu/llama4_target.py > "$OUT/llama4_target_check.log" 2>&1 &)
      PARALLEL=${PARALLEL:-9} MEM_FRACTION=${MEM_FRACTION:-0.85} START_TIMEOUT=${START_TIMEOUT:-420} \
        PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-560} python3 tests/gpu/e2e_server.py llama4_exact --out "$OUT" 2>&1 | grep -E "LLAMA4_EXACT|== llama4_exact|Error" | cut -c1-3000
      for i in $(seq 60); do pgrep -f llama4_target.py > /dev/null || break; sleep 2; done; grep -E "^seed" "$OUT/llama4_target_check.log" ;;
    gptoss_exact)  # issues #27/#28: the GPT-OSS window target against transformers' float32 output, per backend
      (PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-560} python3 tests/gpu/gptoss_target.py > "$OUT/gptoss_target_check.log" 2>&1 &)
      PARALLEL=${PARALLEL:-17} MEM_FRACTION=${MEM_FRACTION:-0.85} START_TIMEOUT=${START_TIMEOUT:-420} \
        PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-560} python3 tests/gpu/e2e_server.py gptoss_exact --out "$OUT" 2>&1 | grep -E "GPTOSS_EXACT|Error" | cut -c1-3000
      for i in $(seq 60); do pgrep -f gptoss_target.py > /dev/null || break; sleep 2; done; grep -E "^seed" "$OUT/gptoss_target_check.log" ;;
    gemma4_exact)  # issue #27: the Gemma 4 window target against transformers' float32 output, per backend
      (PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-560} python3 tests/gpu/gemma4_target.py > "$OUT/gemma4_target_check.log" 2>&1 &)
      PARALLEL=${PARALLEL:-17} MEM_FRACTION=${MEM_FRACTION:-0.85} START_TIMEOUT=${START_TIMEOUT:-420} \
        PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-560} python3 tests/gpu/e2e_server.py gemma4_exact --out "$OUT" 2>&1 | grep -E "GEMMA4_EXACT|Error" | cut -c1-3000
      for i in $(seq 60); do pgrep -f gemma4_target.py > /dev/null || break; sleep 2; done; grep -E "^seed" "$OUT/gemma4_target_check.log" ;;
    llama4_tree_wide)  # the rounding control of llama4_tree: 4 servers side by side
      PARALLEL=${PARALLEL:-4} MEM_FRACTION=${MEM_FRACTION:-0.85} START_TIMEOUT=${START_TIMEOUT:-420} \
        PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-530} python3 tests/gpu/e2e_server.py llama4_tree_wide --out "$OUT" 2>&1 | tail -5 ;;
    bench_fix_cost)  # issue #31 item 1: per fix, its step with the fix against a reference path, batch 1 and 32,
                     # CUDA graphs on, ABAB, medians of BLOCKS x PER_BLOCK replays; one child process per fix (ROWS: a
                     # comma list of row keys, default all); the table on stdout, $OUT/bench_fix_cost.json
      PYTHONPATH=${SITE:-/root/site} timeout ${STEP_TIMEOUT:-470} python3 tests/benchmarks/bench_fix_cost_gpu.py \
        ${ROWS:+--rows $ROWS} --budget ${BUDGET:-440} 2>&1 | tee "$OUT/bench_fix_cost.log" | tail -45 ;;
    throughput)  # issue #31 item 2: 6 warm servers side by side (plugin / stock x fa3, fa3 EAGLE3 topk 1, trtllm_mha),
                 # 64 concurrent greedy requests, TP_ROUNDS alternating rounds each; $OUT/throughput.json
      MEM_FRACTION=${MEM_FRACTION:-0.85} START_TIMEOUT=${START_TIMEOUT:-300} PYTHONPATH=${SITE:-/root/site} timeout ${STEP_TIMEOUT:-470} \
        python3 tests/gpu/e2e_server.py throughput --out "$OUT" 2>&1 | grep -E "^(row|fa3|trtllm)|THROUGHPUT|Error" | cut -c1-3000 ;;
    throughput_rows)  # issue #48 item 3: TP_ROWS (target/backend/mode, comma list) with the plugin and stock, warm, rounds
                      # alternating (TP_ARGS: more options of tests/gpu/throughput_rows.py); SITE: another unpacked release
      repo=$(pwd); (cd /tmp && PYTHONPATH=${SITE:-/root/site} timeout ${STEP_TIMEOUT:-470} python3 "$repo/tests/gpu/throughput_rows.py" \
        --rows "${TP_ROWS:?TP_ROWS=target/backend/mode,...}" ${TP_ARGS:-} --out "$OUT/tp_$(basename ${SITE:-site})" 2>&1 \
        | grep -E "^(sglang|row|[a-z0-9_]+/)|THROUGHPUT_ROWS|Error" | cut -c1-3000) ;;
    selftest)  # issue #27 item 7: the user's command on this GPU (SELFTEST_ARGS; SITE: another unpacked release); $OUT/selftest.json, the
               # progress and target checks in $OUT/selftest.txt, the servers' logs in $OUT/selftest_logs
      st=/tmp/selftest_$(date +%H%M%S)
      (cd /tmp && PYTHONPATH=${SITE:-/root/site} timeout ${STEP_TIMEOUT:-560} python3 -m sglang_swa_plugin.cli selftest \
        --out $st --json ${PROMPT_SEEDS:+--seeds $PROMPT_SEEDS} ${SELFTEST_ARGS:-} > "$OUT/selftest.json" 2> "$OUT/selftest.txt"; echo "selftest exit $?")
      cp -r $st/logs "$OUT/selftest_logs" 2>/dev/null
      tail -8 "$OUT/selftest.txt"
      (cd /tmp && PYTHONPATH=${SITE:-/root/site} python3 -c "import json, sys; from sglang_swa_plugin.selftest.command import print_matrix; print_matrix(json.load(open(sys.argv[1])))" "$OUT/selftest.json") ;;
    bg|bg_selftest)  # NAME=NN BG_STEP=step (default selftest): that step, with its environment, in a process session of
                     # its own, which outlives this call (the machine keeps it while warm): later calls carry payload parts meanwhile.
                     # It runs from a copy of tests/ (a later call's working copy replaces this one's)
      d=/root/bg_${NAME:?NAME=NN}; rm -rf $d; mkdir -p $d/out $d/repo; cp -r tests $d/repo/
      # only the step holds its output file: nothing of this call's stdout stays open (a pipe after it returns)
      (cd $d/repo || exit 1; OUT=$d/out setsid nohup bash -c "bash tests/gpu/run_on_device.sh ${BG_STEP:-selftest}; echo \"bg exit \$?\"" \
        > $d/step.txt 2>&1 < /dev/null &) > /dev/null 2>&1
      sleep 2; echo "started ${BG_STEP:-selftest} in $d: $(head -c 300 $d/step.txt)" ;;
    wait_bg)  # NAME=NN WAIT=seconds: until that step has ended (or WAIT), then its output into $OUT
      d=/root/bg_${NAME:?NAME=NN}; for _ in $(seq ${WAIT:-500}); do grep -q "^bg exit" $d/step.txt 2>/dev/null && break; sleep 1; done
      tail -c 6000 $d/step.txt; mkdir -p "$OUT/r$NAME"; cp -r $d/out/. "$OUT/r$NAME/"; cp $d/step.txt "$OUT/r$NAME/" ;;
    pack)  # at most 8 files come back: everything under $OUT into one archive
      (cd "$OUT" && tar czf "/tmp/results.tgz" . && find . -mindepth 1 -delete && mv /tmp/results.tgz "$OUT/results_$(date +%H%M%S).tgz") ;;
    gpu_tests)
      repo=$(pwd); (cd /tmp && PYTHONPATH=/root/site timeout ${STEP_TIMEOUT:-400} python3 -m pytest -q -rs -m gpu "$repo/tests/gpu" -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log") ;;
  esac
done
