"""Per-step cost of fa3_spec_translate on a GPU: ``FlashAttentionBackend.init_forward_metadata``
for an EAGLE3 topk-2 TARGET_VERIFY batch (the call the fix wraps, two gathers added) and the
verify attention of one sliding and one full layer, with the fix installed vs not, on the
real backend and kernels of the installed sglang (the objects of
tests/gpu/test_fa3_spec_translate_gpu.py). Prints medians of CUDA-synchronized timings.

    python tests/benchmarks/bench_fix_step_gpu.py [iterations]

Without the fix (where it is needed) the SWA page table holds full-pool indices: the timing
is of the buggy call, for comparison only."""

import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu"))
import test_fa3_spec_translate_gpu as g

from sglang_swa_plugin.core import temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import fa3_spec_translate as fa3
from sglang_swa_plugin.check import fa3_spec_translate as fa3_check


def timed(fn, n):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t) * 1e6)
    return round(statistics.median(out), 1)


def main(n=300):
    pool, backend, batch, layers, prefixes, drafts = g._cuda_bench()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for layer in layers.values():
        g._write_kv(pool, layer, prefixes, drafts, gen)
    q = torch.randn(len(g.PREFIX_LENS) * len(fa3_check.TREE), g.HEADS * g.HEAD_DIM, device="cuda").to(torch.bfloat16)
    needed = fa3.FIX.detect().verdict is Verdict.NEEDED

    def step():
        backend.init_forward_metadata(batch)
        for layer in layers.values():
            backend.forward_extend(q, None, None, layer, batch, save_kv_cache=False)

    rows = {"without_fix": [], "with_fix": []}
    settings = (("without_fix", []), ("with_fix", [fa3.FIX] if needed else []))
    for order in (settings, settings[::-1], settings, settings[::-1]):  # alternate: no order bias
        for label, fixes in order:
            with temporarily_installed(*fixes):
                rows[label].append({"init_forward_metadata_us": timed(lambda: backend.init_forward_metadata(batch), n),
                                    "metadata_plus_2_layers_us": timed(step, n)})
    print("FIX_STEP=" + json.dumps({"fix_needed": needed, "iterations": n, **rows,
                                    "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
