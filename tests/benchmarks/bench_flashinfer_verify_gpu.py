"""Cost of flashinfer_swa_verify on one TARGET_VERIFY step under CUDA-graph replay (GPU).

The set-up of tests/gpu/test_flashinfer_swa_verify_gpu.py (real FlashInferAttnBackend over a
real SWAKVPool, window 100, 4 requests past the window), one sliding and one full layer
captured in a ``torch.cuda.CUDAGraph``; a step is sglang's replay metadata
(``init_forward_metadata_replay_cuda_graph`` / ``init_forward_metadata_out_graph``) plus
``graph.replay()``, synchronized. Rows, per topk:
  baseline: the release's own verify planning with only the None-prefix repair (what 0.5.14+
            do; on 0.5.10-0.5.13 stock cannot run a verify step at all);
  fixed:    the whole fix (retained keys, re-laid mask, own mask buffer), keys and mask by
            Triton kernels (one launch each).
Printed: median and p90 microseconds per step over ITERS steps, interleaved in blocks.

    python tests/benchmarks/bench_flashinfer_verify_gpu.py [ITERS]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))


def _baseline_fix():
    """Only the None-prefix repair (the crash form's TypeError), nothing else."""
    from sglang_swa_plugin.hooks import flashinfer_swa_verify as m

    class Repair(type(m.FIX)):
        name = "flashinfer_swa_verify_prefix_only"

        def install(self, hooks):
            hooks.around(m.UPDATE_SW, m._update_sliding_window)

    return Repair()


def bench(topk, which, iters):
    import test_flashinfer_swa_verify_gpu as t
    from graph_steps import prepare_capture, prepare_replay
    from sglang_swa_plugin.core import temporarily_installed
    from sglang_swa_plugin.hooks import flashinfer_swa_verify as m

    fix = m.FIX if which == "fixed" else _baseline_fix()
    gen = torch.Generator(device="cuda").manual_seed(0)
    n = t.draft_shape(topk)[0]
    with temporarily_installed(fix):
        tb, pool, rtt, runner, backend, layers = t.setup(topk, True, gen)
        bs = len(t.SETS[0])
        batch = t.make_batch(tb, runner, backend, range(bs), t.SETS[0], topk)
        q = torch.randn(bs * n, t.HEADS * t.HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)

        def forward():
            return [backend.forward_extend(q, None, None, layer, batch, save_kv_cache=False) for layer in layers]

        prepare_capture(backend, batch, n)
        forward()
        forward()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            forward()
        rows, lens = t.REPLAYS[1]
        batch.spec_info.custom_mask = t.tree_mask(lens, topk)
        times = []
        for i in range(iters + 20):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            prepare_replay(backend, batch, n, rows, lens)
            g.replay()
            torch.cuda.synchronize()
            if i >= 20:
                times.append((time.perf_counter() - t0) * 1e6)
    return times


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    for topk in (1, 2):
        res = {"baseline": [], "fixed": []}
        for _ in range(3):  # interleaved blocks
            for which in res:
                res[which] += bench(topk, which, iters // 3)
        for which, ts in res.items():
            ts.sort()
            print(f"BENCH_FI_VERIFY topk={topk} {which}: median {statistics.median(ts):.1f} us, "
                  f"p90 {ts[int(0.9 * len(ts))]:.1f} us per verify step (metadata + graph replay, 2 layers)")


if __name__ == "__main__":
    main()
