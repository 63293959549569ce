"""The preview ``triton_swa_draft_kernels`` on a GPU (no sglang needed): the draft rails' Triton
kernels (``rail_kernel.window_of_rail_layout``, ``translate_head``) compiled for the GPU and held
against ``hooks.triton_swa_draft``'s torch forms on the random cases of
tests/interpreted_swa_draft_rail.py (seeds ``SEEDS``), then each form timed (bench_fix_cost_gpu's capture and CUDA-event blocks) at batch 1 and 32
(window 128, rails of 1000 keys a request): eager (host launches included) and replayed from a
CUDA graph, medians of ``ROUNDS`` interleaved rounds. One JSON line per seed and per timing.

    python3 tests/gpu/rail_kernel_gpu.py   (the plugin installed: its hooks package is built from hooks/)
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_fix_cost_gpu import capture, time_block
from interpreted_swa_draft_rail import backend, seed_row

from sglang_swa_plugin.hooks import triton_swa_draft as tsd
from sglang_swa_plugin.rail_kernel import translate_head, window_of_rail_layout

ROUNDS = int(os.environ.get("ROUNDS", "200"))


def forms(bs: int, window: int = 128, length: int = 1000, size: int = 1 << 20):
    """The two forms of one draft step's window rail and translation, as callables on fixed buffers."""
    gen = torch.Generator().manual_seed(bs)
    mapping = torch.randint(0, size // 4, (size,), generator=gen).cuda()
    be = backend(window, mapping)
    kv_indptr = (torch.arange(bs + 1, dtype=torch.int32) * length).cuda()
    kv_indices = torch.randint(0, size, (bs * length,), generator=gen).cuda()
    out_indptr = torch.zeros(bs + 2, dtype=torch.int32, device="cuda")
    out_ids = torch.zeros(bs * window, dtype=torch.int64, device="cuda")
    head = torch.randint(0, size, (bs * (window + 1),), generator=gen).cuda()
    win_indptr = (torch.arange(bs + 1, dtype=torch.int32) * window).cuda()
    state = tsd._rail_state(be)

    def torch_rail():
        tsd.window_rails(be, kv_indptr[None], kv_indices[None], bs)

    def kernel_rail():
        window_of_rail_layout(kv_indptr, kv_indices, mapping, bs, window, out_indptr, out_ids)

    def torch_translate():
        state["kernel"] = False
        tsd.translate_window(be, win_indptr, bs, head)

    def kernel_translate():
        translate_head(head, win_indptr, bs, bs * (window + 1), mapping)

    return {"rail": (torch_rail, kernel_rail), "translate": (torch_translate, kernel_translate)}


def main() -> int:
    bad = 0
    for seed in (int(s) for s in os.environ.get("SEEDS", "0,1,2").split(",")):
        row = seed_row(seed, "cuda")
        bad += row["differ"] + row["translate_differ"]
        print(json.dumps(row), flush=True)
    for bs in (1, 32):
        for name, pair in forms(bs).items():
            for graph in (False, True):
                fns = [capture(f).replay if graph else f for f in pair]
                times = ([], [])
                for _ in range(ROUNDS):  # interleaved
                    for t, fn in zip(times, fns):
                        t.append(time_block(fn, 10))
                print(json.dumps({"timing": name, "bs": bs, "graph": graph,
                                  "us_torch": round(statistics.median(times[0]), 2),
                                  "us_kernel": round(statistics.median(times[1]), 2)}), flush=True)
    print(json.dumps({"result": "OK" if bad == 0 else f"{bad} slots differ"}), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
