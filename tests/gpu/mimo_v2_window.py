"""Which window sglang's MiMo-V2 attends, against transformers' MiMoV2FlashForCausalLM (the
model's definition: a sliding layer sees the keys at distance 0 .. sliding_window - 1).

sglang hands ``config.sliding_window_size`` to RadixAttention, whose rule is "distance <= size"
(one key more). The selftest's MiMo-V2 target (window 16) is served as it is and with
``sliding_window_size`` 15 in its config; each row's greedy outputs are compared with the float32
reference at window 16 (the model) and 17 (one key more). If sglang attends one key more, the
rows of the target as it is equal the window-17 reference and the rows of the window-15 config
equal the window-16 reference.

    PYTHONPATH=/root/site PROMPT_SEEDS=81,82,83 python3 tests/gpu/mimo_v2_window.py OUT
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

from sglang_swa_plugin.selftest import judging, rows, server
from sglang_swa_plugin.selftest.targets import mimo_v2, readout


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    seeds = [int(s) for s in os.environ.get("PROMPT_SEEDS", "81,82,83").split(",")]
    root = tempfile.mkdtemp(prefix="mimo_window_")
    target, _ = mimo_v2.save(root)
    narrow = os.path.join(root, "mimo_v2_w15")
    shutil.copytree(target, narrow)
    with open(os.path.join(narrow, "config.json")) as f:
        cfg = json.load(f)
    cfg["sliding_window_size"] = mimo_v2.WINDOW - 1
    with open(os.path.join(narrow, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    opts = rows.sglang_options()
    reqs = [p for s in seeds for p in readout.prompts(32, 130, s)]
    table = {}
    for name, path in (("w16", target), ("w15", narrow)):
        for b in os.environ.get("BACKENDS", "fa3,triton").split(","):
            args, _ = rows.backend_args(b, (9, 0), opts)
            base = rows.exact_base(path, flags=opts.flags) + args + ["--trust-remote-code"]
            table[f"{name}_{b}_plain_on"] = (base, server.ON)
            if name == "w15":
                table[f"{name}_{b}_mtp_on"] = (base + rows.eagle3(path, 1, 3, 4, "EAGLE"), server.ON)
    table["w16_fa3_plain_off"] = (rows.exact_base(target, flags=opts.flags) + ["--attention-backend", "fa3",
                                                                               "--trust-remote-code"], server.OFF)
    runs = {k: (f"mimo_window_{k}", out, a, env, reqs, 64) for k, (a, env) in table.items()}
    import torch
    from concurrent.futures import ThreadPoolExecutor

    torch.set_num_threads(4)
    with ThreadPoolExecutor(1) as cpu:  # the float32 references on the CPU while the servers run
        refs = cpu.submit(lambda: {w: [o for s in seeds for o in mimo_v2.reference([s], window=w)[s]] for w in (16, 17)})
        res = server.run_many(runs, parallel=len(runs))
        ref = refs.result()
    report = {}
    for k, r in res.items():
        line = {"state": r.get("state"), "accept": r.get("accept_length"), "error": r.get("error")}
        for w, outs in ref.items():
            j = judging.judge(r, outs, 32)
            line[f"vs_window_{w}"] = [c["identical"] for c in j.get("per_seed", [])]
        report[k] = line
        print(f"MIMO_WINDOW {k}: {json.dumps(line)}", flush=True)
    with open(os.path.join(out, "mimo_v2_window.json"), "w") as f:
        json.dump({"seeds": seeds, "rows": report, "outputs": {k: r.get("outputs") for k, r in res.items()}}, f)


if __name__ == "__main__":
    main(sys.argv[1])
