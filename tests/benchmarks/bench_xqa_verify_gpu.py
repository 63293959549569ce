"""Verify-step cost with CUDA graphs on: the plugin's XQA verify path (trtllm_mha decode
kernel + trtllm_xqa_spec_decode) against fa3 verify (the path upstream supports), on an H100.

Per backend: a real backend over a real SWAKVPool (page size 64), EAGLE TARGET_VERIFY with 4
draft tokens per request, 4 attention layers (sliding, full, sliding, full; window 100),
batch 1 and 32 of requests with 900-1100 tokens each; the layers' forward captured into one
CUDA graph per backend and batch, as sglang does. Timed with CUDA events, alternating the two
backends in one run (ABAB), blocks of 20 replays:
  replay       the graph replay alone (the attention kernels and, for XQA, the fix's rows build)
  step         sglang's replay metadata refresh + the graph replay (what a verify step pays)
Prints a table of medians (µs per verify step) and writes $OUT/bench_xqa_verify.json.

    python tests/benchmarks/bench_xqa_verify_gpu.py [BLOCKS]

Needs a Hopper GPU, sglang and the plugin installed (it runs where tests/gpu runs)."""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "gpu"))

import test_xqa_graph_replay_gpu as g  # noqa: E402
from graph_steps import prepare_capture, prepare_replay  # noqa: E402

PER_BLOCK = 20
LAYER_IDS = (0, 1, 2, 3)


def setup(backend_name: str, bs: int, lengths: list):
    from sglang.srt.layers.radix_attention import RadixAttention

    from sglang_swa_plugin.core import temporarily_installed
    from sglang_swa_plugin.hooks import trtllm_xqa_spec_decode as xqa

    tb, pool, req_to_token, runner, backend = g._bench(torch.bfloat16, lengths, backend_name)
    g._fill_kv(pool, torch.Generator(device="cuda").manual_seed(1))
    for lid in (2, 3):
        for buf in pool.get_kv_buffer(lid):
            buf.normal_()
    layers = [RadixAttention(g.HEADS, g.HEAD_DIM, g.HEAD_DIM ** -0.5, g.KV_HEADS, lid,
                             sliding_window_size=g.WINDOW if lid % 2 == 0 else -1) for lid in LAYER_IDS]
    batch = tb.make_forward_batch(runner, "target_verify", req_pool_indices=list(range(bs)), seq_lens=lengths[:bs],
                                  out_cache_loc=torch.zeros(bs * g.Q, dtype=torch.int64))
    for name in ("req_pool_indices", "seq_lens", "out_cache_loc", "positions", "input_ids", "orig_seq_lens"):
        if getattr(batch, name, None) is not None:
            setattr(batch, name, getattr(batch, name).cuda())
    q = torch.randn(bs * g.Q, g.HEADS * g.HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    ctx = temporarily_installed(xqa.FIX) if backend_name == "trtllm_mha" else None
    if ctx is not None:
        ctx.__enter__()
    try:
        def forward():
            return [backend.forward_extend(q, None, None, layer, batch, save_kv_cache=False) for layer in layers]

        prepare_capture(backend, batch, g.Q)
        forward()
        forward()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward()
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    rows, lens = list(range(bs)), lengths[:bs]
    return {"graph": graph, "refresh": lambda: prepare_replay(backend, batch, g.Q, rows, lens)}


def time_block(case, with_refresh: bool) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(PER_BLOCK):
        if with_refresh:
            case["refresh"]()
        case["graph"].replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / PER_BLOCK  # µs per step


def main():
    blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    rng = random.Random(0)
    lengths = [rng.randrange(900, 1100) for _ in range(32)]
    res = {"blocks": blocks, "per_block": PER_BLOCK, "rows": []}
    for bs in (1, 32):
        cases = {}
        for name in ("trtllm_mha", "fa3"):
            try:
                cases[name] = setup(name, bs, lengths)
            except Exception as e:  # noqa: BLE001 - report, go on with the other backend
                res["rows"].append({"bs": bs, "backend": name, "error": f"{type(e).__name__}: {e}"[:400]})
        for c in cases.values():  # warm-up
            c["refresh"]()
            c["graph"].replay()
        torch.cuda.synchronize()
        times = {(n, m): [] for n in cases for m in ("replay", "step")}
        for _ in range(blocks):
            for n, c in cases.items():  # alternating
                times[(n, "replay")].append(time_block(c, False))
                times[(n, "step")].append(time_block(c, True))
        for (n, m), ts in times.items():
            res["rows"].append({"bs": bs, "backend": n, "what": m, "median_us": round(statistics.median(ts), 1),
                                "min_us": round(min(ts), 1), "max_us": round(max(ts), 1)})
    print(f"{'bs':>3} {'what':>7} {'XQA+plugin µs':>14} {'fa3 µs':>9} {'ratio':>6}")
    for bs in (1, 32):
        for m in ("replay", "step"):
            x = next((r for r in res["rows"] if r["bs"] == bs and r.get("what") == m and r["backend"] == "trtllm_mha"), None)
            f = next((r for r in res["rows"] if r["bs"] == bs and r.get("what") == m and r["backend"] == "fa3"), None)
            if x and f:
                print(f"{bs:>3} {m:>7} {x['median_us']:>14} {f['median_us']:>9} {x['median_us'] / f['median_us']:>6.2f}")
    errors = [r for r in res["rows"] if "error" in r]
    for r in errors:
        print("error:", r)
    out = os.environ.get("OUT")
    if out:
        Path(out, "bench_xqa_verify.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
