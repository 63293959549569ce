"""trtllm_xqa_spec_decode inside a real CUDA graph, with flashinfer's real XQA kernels (H100).

A real ``TRTLLMHAAttnBackend`` over a real ``SWAKVPool`` (page size 64, full and SWA index
spaces apart), EAGLE TARGET_VERIFY with 4 draft tokens per request: sglang's own capture
metadata, two eager warm-up passes, the pass captured into a ``torch.cuda.CUDAGraph``, then
several replays with other requests, other lengths (past the window) and other page tables,
one of them padded, each refreshed through sglang's own replay metadata code. After every
replay each layer's output is compared with attention computed in torch (float32) over the
same KV: the sliding layer with its window, the full layer causally over the whole request.

    python -m pytest -q -m gpu tests/gpu/test_xqa_graph_replay_gpu.py   # OUT=dir for JSON

On stock 0.5.10-0.5.21 XQA refuses this call (no mask): the fix must be in place. The test
fails if any replay of any layer differs from the reference; with the plugin of 6b08c25
(rows derived once in the eager warm-up, stale at replay) it did."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
pytestmark = pytest.mark.gpu

PAGE, Q, HEADS, KV_HEADS, HEAD_DIM, WINDOW = 64, 4, 4, 2, 64, 100
SWA_LAYER, FULL_LAYER = 0, 1
# Requests (tokens before the drafts). Capture with the first set; replays: the same, a
# second set in other pages, a mix with other lengths, and 3 real requests in the graph of 4.
SETS = [(150, 300, 77, 229), (310, 95, 180, 260)]
REPLAYS = [((0, 1, 2, 3), (150, 300, 77, 229)), ((4, 5, 6, 7), (310, 95, 180, 260)),
           ((5, 2, 7, 0), (90, 60, 255, 140)), ((6, 1, 3), (170, 280, 201))]
REL_TOL = 0.03
DEVICE = "cuda"  # the CPU smoke of the set-up code sets "cpu"


def _needs_xqa():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if torch.cuda.get_device_capability() not in ((9, 0), (12, 0)):
        pytest.skip("XQA runs on sm90/sm120")


def _bench(kv_dtype, lengths=tuple(t for s in SETS for t in s), backend_name="trtllm_mha"):
    """Pool, allocator, req_to_token rows 0.. (``lengths``: tokens before the drafts), runner,
    backend (``backend_name``: trtllm_mha or fa3, over the same kind of pool)."""
    os.environ.setdefault("SGLANG_FLASHINFER_WORKSPACE_SIZE", str(256 << 20))
    from sglang_swa_plugin.check import testbed as tb

    cls = tb.swa_classes()
    pages_needed = sum(-(-(n + Q) // PAGE) for n in lengths) + 5
    kw = dict(size=pages_needed * PAGE, size_swa=(pages_needed - 3) * PAGE, page_size=PAGE, dtype=kv_dtype, head_num=KV_HEADS,
              head_dim=HEAD_DIM, swa_attention_layer_ids=[0, 2], full_attention_layer_ids=[1, 3], device=DEVICE)
    if "enable_kvcache_transpose" in inspect.signature(cls.SWAKVPool.__init__).parameters:
        kw["enable_kvcache_transpose"] = False
    pool = cls.SWAKVPool(**kw)
    alloc = cls.SWATokenToKVPoolAllocator(size=kw["size"], size_swa=kw["size_swa"], page_size=PAGE, dtype=kv_dtype,
                                          device=DEVICE, kvcache=pool, need_sort=False)
    alloc.full_attn_allocator.alloc(3 * PAGE)  # full-only pages: the two index spaces differ
    req_to_token = cls.ReqToTokenPool(size=len(lengths), max_context_len=4096, device=DEVICE, enable_memory_saver=False)
    for row, n in enumerate(t + Q for t in lengths):
        pages = -(-n // PAGE)
        full = alloc.full_attn_allocator.alloc(pages * PAGE)
        swa = alloc.swa_attn_allocator.alloc(pages * PAGE)
        alloc.full_to_swa_index_mapping[full] = swa  # what the SWA allocator records
        req_to_token.req_to_token[row, :n] = full[:n].to(req_to_token.req_to_token.dtype)
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=req_to_token,
                                  spec_algorithm="EAGLE", num_draft_tokens=Q, page_size=PAGE,
                                  sliding_window_size=WINDOW, attention_backend=backend_name)
    runner.device = DEVICE
    runner.kv_cache_dtype = kv_dtype
    backend = tb.build_trtllm_backend(runner) if backend_name == "trtllm_mha" else tb.build_fa3_backend(runner)
    return tb, pool, req_to_token, runner, backend


def _fill_kv(pool, gen):
    for lid in (SWA_LAYER, FULL_LAYER):
        for buf in pool.get_kv_buffer(lid):
            buf.copy_(torch.randn(buf.shape, generator=gen, device=DEVICE).to(buf.dtype))


def _reference(tb, pool, req_to_token, layer, q, rows, prefix_lens, sinks=None):
    """float32 attention per draft row: row r of a request with P tokens before its drafts
    sits at position P + r and sees positions max(0, P + r - window)..P + r of its own pool;
    ``sinks`` (per head) add exp(sink) to the softmax denominator, as GPT-OSS's do."""
    k_buf, v_buf = pool.get_kv_buffer(layer.layer_id)
    sliding = layer.sliding_window_size >= 0
    out = []
    for b, (row, p) in enumerate(zip(rows, prefix_lens)):
        for r in range(Q):
            pos = p + r
            lo = max(0, pos - layer.sliding_window_size) if sliding else 0
            slots = req_to_token.req_to_token[row, lo:pos + 1].long()
            slots = tb.translate(pool, slots).to(DEVICE) if sliding else slots
            k = k_buf[slots].float().repeat_interleave(HEADS // KV_HEADS, dim=1)
            v = v_buf[slots].float().repeat_interleave(HEADS // KV_HEADS, dim=1)
            qm = q[b * Q + r].view(HEADS, HEAD_DIM).float()
            scores = torch.einsum("hd,lhd->hl", qm, k) * layer.scaling
            if sinks is not None:
                scores = torch.cat([scores, sinks.float()[:, None]], dim=1)
            w = torch.softmax(scores, dim=-1)[:, : k.shape[0]]
            out.append(torch.einsum("hl,lhd->hd", w, v).reshape(-1))
    return torch.stack(out)


def run_graph(kv_dtype=torch.bfloat16, with_sinks=False) -> dict:
    """Capture once, replay REPLAYS; per replay and layer the relative max error. The query
    is what a model hands over: a view of its fused qkv projection (rows strided by q+k+v,
    as GPT-OSS's ``qkv.split``); ``with_sinks``: GPT-OSS-style attention sinks (float32)."""
    from sglang.srt.layers.radix_attention import RadixAttention

    from sglang_swa_plugin.core import temporarily_installed
    from sglang_swa_plugin.fix import Verdict
    from sglang_swa_plugin.hooks import trtllm_xqa_spec_decode as xqa
    from sglang_swa_plugin.probe import target_class

    from graph_steps import prepare_capture, prepare_replay
    from helpers import without_fix

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    tb, pool, req_to_token, runner, backend = _bench(kv_dtype)
    _fill_kv(pool, gen)
    layers = [RadixAttention(HEADS, HEAD_DIM, HEAD_DIM ** -0.5, KV_HEADS, lid,
                             sliding_window_size=WINDOW if lid == SWA_LAYER else -1)
              for lid in (SWA_LAYER, FULL_LAYER)]
    bs = len(SETS[0])
    batch = tb.make_forward_batch(runner, "target_verify", req_pool_indices=list(range(bs)), seq_lens=list(SETS[0]),
                                  out_cache_loc=torch.zeros(bs * Q, dtype=torch.int64))
    for name in ("req_pool_indices", "seq_lens", "out_cache_loc", "positions", "input_ids", "orig_seq_lens"):
        if getattr(batch, name, None) is not None:
            setattr(batch, name, getattr(batch, name).to(DEVICE))
    needed = xqa.FIX.detect().verdict is Verdict.NEEDED
    qkv = torch.empty(bs * Q, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=DEVICE, dtype=torch.bfloat16)
    q = qkv[:, : HEADS * HEAD_DIM]
    sinks = torch.randn(HEADS, generator=gen, device=DEVICE) if with_sinks else None
    extra = {"sinks": sinks} if with_sinks else {}
    res = {"kv_dtype": str(kv_dtype), "sinks": with_sinks, "q_row_stride": q.stride(0), "fix_needed": needed,
           "window_left": WINDOW, "page_size": PAGE, "replays": []}
    with without_fix(target_class(xqa.CLASS), "forward_extend", xqa.FIX.name), \
            temporarily_installed(*([xqa.FIX] if needed else [])):
        def forward():
            return [backend.forward_extend(q, None, None, layer, batch, save_kv_cache=False, **extra) for layer in layers]

        prepare_capture(backend, batch, Q)
        q.copy_(torch.randn(q.shape, generator=gen, device=DEVICE))
        forward()  # sglang's two warm-up runs
        forward()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = forward()
        for rows, prefix_lens in REPLAYS:
            prepare_replay(backend, batch, Q, rows, prefix_lens)
            q.copy_(torch.randn(q.shape, generator=gen, device=DEVICE))
            for out in outs:
                out.fill_(float("nan"))  # every element must be written by the replay
            graph.replay()
            torch.cuda.synchronize()
            row = {"rows": list(rows), "prefix_lens": list(prefix_lens)}
            n = len(rows) * Q
            # With an FP8 KV cache 0.5.10-0.5.13 cast the query to FP8 before the kernel (the
            # fix hands it over upcast): the reference takes the same rounded query.
            q_ref = q.to(kv_dtype).to(q.dtype) if kv_dtype == torch.float8_e4m3fn else q
            for layer, out in zip(layers, outs):
                ref = _reference(tb, pool, req_to_token, layer, q_ref, rows, prefix_lens, sinks)
                got = out[:n].float()
                err = ((got - ref).abs().max() / ref.abs().max()).item()
                row[f"layer{layer.layer_id}_rel_err"] = round(err, 5) if err == err else "nan"
            res["replays"].append(row)
    return res


def _report(name, data):
    from helpers import report_json

    report_json("xqa_graph_replay_gpu.json", name, data)


@pytest.mark.parametrize("kv,sinks", [("bf16", False), ("fp8_e4m3", False), ("bf16", True), ("fp8_e4m3", True)])
def test_every_replay_matches_torch_attention(kv, sinks):
    _needs_xqa()
    dtype = torch.bfloat16 if kv == "bf16" else torch.float8_e4m3fn
    res = run_graph(dtype, sinks)
    _report(f"{kv}{'_sinks' if sinks else ''}_{os.environ.get('XQA_GRAPH_LABEL', 'plugin')}", res)
    tol = REL_TOL if kv == "bf16" else 2 * REL_TOL
    bad = [r for r in res["replays"] for k, v in r.items() if k.endswith("rel_err") and not (isinstance(v, float) and v < tol)]
    assert not bad, res
