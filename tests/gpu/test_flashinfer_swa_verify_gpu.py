"""flashinfer_swa_verify with flashinfer's real kernels (H100): a real FlashInferAttnBackend
(two wrappers) over a real SWAKVPool (page size 1, full and SWA index spaces apart), an EAGLE
TARGET_VERIFY batch whose prefixes are longer (and one shorter) than the window, a chain
(topk 1, 4 draft tokens) and a tree (topk 2, 6 draft tokens, siblings at one depth). Each
layer's output is compared with float32 torch attention over the same KV: the sliding layer
sees positions ``[p - window, p]`` of its prefix plus the row's tree ancestors (p = prefix +
depth), the full layer the whole prefix plus the ancestors. Eager, and inside a
``torch.cuda.CUDAGraph`` (sglang's capture metadata, warm-up, capture, replays with other
requests and lengths, one padded), refreshed through sglang's own replay metadata.

    python -m pytest -q -m gpu tests/gpu/test_flashinfer_swa_verify_gpu.py   # OUT=dir for JSON

Stock rows: 0.5.10-0.5.13 raise the TypeError; 0.5.14+ differ on the sliding layer."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
pytestmark = pytest.mark.gpu

HEADS, KV_HEADS, HEAD_DIM, WINDOW = 4, 2, 64, 100
SWA_LAYER, FULL_LAYER = 0, 1
SETS = [(150, 300, 77, 229), (310, 95, 180, 260)]
REPLAYS = [((0, 1, 2, 3), (150, 300, 77, 229)), ((4, 5, 6, 7), (310, 95, 180, 260)),
           ((5, 2, 7, 0), (90, 60, 255, 140)), ((6, 1, 3), (170, 280, 201))]
REL_TOL = 0.03
DEVICE = "cuda"


def _needs_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def draft_shape(topk):
    from sglang_swa_plugin.check import flashinfer_swa_verify as sc

    n = 4 if topk == 1 else 6
    parents = sc.tree_parents(topk, n)
    depth = [len(sc.ancestors(parents, i)) - 1 for i in range(n)]
    return n, parents, depth


def tree_mask(prefix_lens, topk):
    """sglang's full-prefix verify mask (q_len x (prefix + q_len) per request, flattened)."""
    from sglang_swa_plugin.check import flashinfer_swa_verify as sc

    n, parents, _ = draft_shape(topk)
    parts = []
    for P in prefix_lens:
        m = torch.zeros(n, P + n, dtype=torch.bool)
        m[:, :P] = True
        for i in range(n):
            for a in sc.ancestors(parents, i):
                m[i, P + a] = True
        parts.append(m.view(-1))
    return torch.cat(parts).to(DEVICE)


def build(topk, lengths=tuple(t for s in SETS for t in s)):
    """Pool, allocator, req_to_token rows 0.. (prefix + drafts), runner, real backend. Build it
    inside the fix's installation: the updater binds its ``update`` in its constructor."""
    os.environ.setdefault("SGLANG_FLASHINFER_WORKSPACE_SIZE", str(256 << 20))
    from sglang_swa_plugin.check import testbed as tb
    from sglang_swa_plugin.probe import swapped

    n = draft_shape(topk)[0]
    cls = tb.swa_classes()
    total = sum(t + n for t in lengths)
    kw = dict(size=total + 512, size_swa=total + 256, page_size=1, dtype=torch.bfloat16, head_num=KV_HEADS,
              head_dim=HEAD_DIM, swa_attention_layer_ids=[0, 2], full_attention_layer_ids=[1, 3], device=DEVICE)
    if "enable_kvcache_transpose" in inspect.signature(cls.SWAKVPool.__init__).parameters:
        kw["enable_kvcache_transpose"] = False
    pool = cls.SWAKVPool(**kw)
    alloc = cls.SWATokenToKVPoolAllocator(size=kw["size"], size_swa=kw["size_swa"], page_size=1, dtype=torch.bfloat16,
                                          device=DEVICE, kvcache=pool, need_sort=False)
    alloc.full_attn_allocator.alloc(37)  # full-only slots: the two index spaces differ
    rtt = cls.ReqToTokenPool(size=len(lengths), max_context_len=1024, device=DEVICE, enable_memory_saver=False)
    for row, t in enumerate(lengths):
        full = alloc.alloc(t + n)
        rtt.req_to_token[row, : t + n] = full.to(rtt.req_to_token.dtype)
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtt, spec_algorithm="EAGLE",
                                  topk=topk, num_steps=n - 1 if topk == 1 else 3, num_draft_tokens=n,
                                  sliding_window_size=WINDOW, attention_backend="flashinfer")
    runner.device = DEVICE
    runner.model_config.head_dim = HEAD_DIM  # the tiny config's 8 is below flashinfer's smallest
    fi = importlib.import_module("sglang.srt.layers.attention.flashinfer_backend")
    with contextlib.ExitStack() as st:
        if hasattr(fi, "get_attention_tp_size"):
            st.enter_context(swapped(fi, "get_attention_tp_size", lambda: 1))
        st.enter_context(tb._single_rank_parallel())
        backend = fi.FlashInferAttnBackend(runner)
    return tb, pool, rtt, runner, backend


def spec_input(prefix_lens, topk):
    import dataclasses

    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    n, _, depth = draft_shape(topk)
    required = [f.name for f in dataclasses.fields(EagleVerifyInput)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    fields = {f.name for f in dataclasses.fields(EagleVerifyInput)}
    seq = torch.tensor(prefix_lens)
    values = dict(draft_token=torch.zeros(len(prefix_lens) * n, dtype=torch.int64, device=DEVICE),
                  custom_mask=tree_mask(prefix_lens, topk),
                  positions=torch.cat([P + torch.tensor(depth) for P in prefix_lens]).to(DEVICE),
                  spec_steps=n - 1 if topk == 1 else 3, topk=topk, draft_token_num=n, capture_hidden_mode=None,
                  seq_lens_sum=int(seq.sum()), seq_lens_cpu=seq)
    return EagleVerifyInput(**{**dict.fromkeys(required), **{k: v for k, v in values.items() if k in fields}})


def reference(tb, pool, rtt, layer, q, rows, prefix_lens, topk):
    from sglang_swa_plugin.check import flashinfer_swa_verify as sc

    n, parents, depth = draft_shape(topk)
    k_buf, v_buf = pool.get_kv_buffer(layer.layer_id)
    sliding = layer.sliding_window_size >= 0
    out = []
    for b, (row, P) in enumerate(zip(rows, prefix_lens)):
        for i in range(n):
            p = P + depth[i]
            lo = max(0, p - layer.sliding_window_size) if sliding else 0
            pos = list(range(lo, P)) + [P + a for a in sorted(sc.ancestors(parents, i))]
            slots = rtt.req_to_token[row, pos].long()
            slots = tb.translate(pool, slots).to(DEVICE) if sliding else slots
            k = k_buf[slots].float().repeat_interleave(HEADS // KV_HEADS, dim=1)
            v = v_buf[slots].float().repeat_interleave(HEADS // KV_HEADS, dim=1)
            qm = q[b * n + i].view(HEADS, HEAD_DIM).float()
            w = torch.softmax(torch.einsum("hd,lhd->hl", qm, k) * layer.scaling, dim=-1)
            out.append(torch.einsum("hl,lhd->hd", w, v).reshape(-1))
    return torch.stack(out)


def setup(topk, fix_on, gen):
    """Everything a run needs, the fix installed for the block where ``fix_on``."""
    from sglang.srt.layers.radix_attention import RadixAttention

    tb, pool, rtt, runner, backend = build(topk)
    for lid in (SWA_LAYER, FULL_LAYER):
        for buf in pool.get_kv_buffer(lid):
            buf.copy_(torch.randn(buf.shape, generator=gen, device=DEVICE).to(buf.dtype))
    layers = [RadixAttention(HEADS, HEAD_DIM, HEAD_DIM ** -0.5, KV_HEADS, lid,
                             sliding_window_size=WINDOW if lid == SWA_LAYER else -1) for lid in (SWA_LAYER, FULL_LAYER)]
    return tb, pool, rtt, runner, backend, layers


def make_batch(tb, runner, backend, rows, prefix_lens, topk):
    n = draft_shape(topk)[0]
    bs = len(rows)
    batch = tb.make_forward_batch(runner, "target_verify", req_pool_indices=list(rows), seq_lens=list(prefix_lens),
                                  out_cache_loc=torch.zeros(bs * n, dtype=torch.int64), num_tokens_per_req=n,
                                  spec_info=spec_input(prefix_lens, topk), attn_backend=backend)
    for name in ("req_pool_indices", "seq_lens", "out_cache_loc", "positions", "input_ids", "orig_seq_lens"):
        if getattr(batch, name, None) is not None:
            setattr(batch, name, getattr(batch, name).to(DEVICE))
    return batch


def rel_err(got, ref):
    return ((got.float() - ref).abs().max() / ref.abs().max()).item()


def run(topk, graph, fix_on) -> dict:
    from sglang_swa_plugin.core import temporarily_installed
    from sglang_swa_plugin.hooks import flashinfer_swa_verify as m

    from graph_steps import prepare_capture, prepare_replay

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    n = draft_shape(topk)[0]
    res = {"topk": topk, "graph": graph, "fix": fix_on, "window_left": WINDOW, "replays": []}
    with temporarily_installed(*([m.FIX] if fix_on else [])):
        tb, pool, rtt, runner, backend, layers = setup(topk, fix_on, gen)
        bs = len(SETS[0])
        batch = make_batch(tb, runner, backend, range(bs), SETS[0], topk)
        q = torch.empty(bs * n, HEADS * HEAD_DIM, device=DEVICE, dtype=torch.bfloat16)

        def forward():
            return [backend.forward_extend(q, None, None, layer, batch, save_kv_cache=False) for layer in layers]

        try:
            if graph:
                prepare_capture(backend, batch, n)
                q.copy_(torch.randn(q.shape, generator=gen, device=DEVICE))
                forward()
                forward()
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    outs = forward()
            steps = REPLAYS if graph else [(tuple(range(bs)), SETS[0])]
            for rows, prefix_lens in steps:
                if graph:
                    batch.spec_info.custom_mask = tree_mask(prefix_lens, topk)
                    prepare_replay(backend, batch, n, rows, prefix_lens)
                    q.copy_(torch.randn(q.shape, generator=gen, device=DEVICE))
                    for o in outs:
                        o.fill_(float("nan"))
                    g.replay()
                else:
                    backend.init_forward_metadata(batch)
                    q.copy_(torch.randn(q.shape, generator=gen, device=DEVICE))
                    outs = forward()
                torch.cuda.synchronize()
                row = {"rows": list(rows), "prefix_lens": list(prefix_lens)}
                k = len(rows) * n
                for layer, out in zip(layers, outs):
                    err = rel_err(out[:k], reference(tb, pool, rtt, layer, q, rows, prefix_lens, topk))
                    row[f"layer{layer.layer_id}_rel_err"] = round(err, 5) if err == err else "nan"
                res["replays"].append(row)
        except TypeError as e:
            res["error"] = f"TypeError: {e}"
    return res


def _bad(res):
    return [r for r in res["replays"] for k, v in r.items() if k.endswith("rel_err") and not (isinstance(v, float) and v < REL_TOL)]


def _report(name, data):
    from helpers import report_json

    report_json("flashinfer_swa_verify_gpu.json", name, data)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("topk", [1, 2])
def test_fixed_verify_matches_torch_attention(topk, graph):
    _needs_gpu()
    res = run(topk, graph, fix_on=True)
    _report(f"fixed_topk{topk}_{'graph' if graph else 'eager'}", res)
    assert "error" not in res and res["replays"] and not _bad(res), res


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("topk", [1, 2])
def test_stock_verify_is_wrong(topk, graph):
    """What the fix is for: stock raises the TypeError or the sliding layer differs."""
    _needs_gpu()
    res = run(topk, graph, fix_on=False)
    _report(f"stock_topk{topk}_{'graph' if graph else 'eager'}", res)
    assert "error" in res or _bad(res), res


@pytest.mark.parametrize("topk", [1, 2])
def test_kernels_equal_their_cpu_twins(topk):
    """The CUDA path (sglang's kv-indices kernel and the plugin's mask kernel) hands the plan
    exactly what the torch twins of the CPU scenario do (``check.flashinfer_swa_verify``
    ``KvIndicesTwin`` and ``mask_twin``, which the CPU tests check rule by rule): random batches
    with prefixes below and past the window, padded CUDA-graph rows (seq_len 1, no mask bits
    of their own), sglang's tree mask and random mask bits."""
    _needs_gpu()
    from sglang_swa_plugin.check import flashinfer_swa_verify as sc
    from sglang_swa_plugin.hooks import flashinfer_swa_verify as m
    from sglang_swa_plugin.probe import optional_module, swapped

    assert m._mask_kernel is not None
    eagle_info = optional_module(m.EAGLE_INFO)
    g = torch.Generator().manual_seed(100 + topk)
    rtt = torch.randint(0, 1 << 20, (16, 1024), generator=g, dtype=torch.int32).to(DEVICE)
    checked = 0
    for trial in range(40):
        bs = int(torch.randint(1, 9, (1,), generator=g))
        real = max(1, bs - int(torch.randint(0, 3, (1,), generator=g)))
        seq = [int(x) for x in torch.randint(1, 2 * WINDOW + 200, (real,), generator=g)] + [1] * (bs - real)
        seq[0] = (WINDOW - 3, WINDOW, WINDOW + 1, 5 * WINDOW)[trial % 4]
        spec = spec_input(seq[:real], topk)
        if trial % 2:
            spec.custom_mask = torch.rand(spec.custom_mask.numel(), generator=g).lt(0.5).to(DEVICE)
        seq_d = torch.tensor(seq, dtype=torch.int32, device=DEVICE)
        kept = torch.minimum(seq_d, torch.full_like(seq_d, WINDOW))
        start = seq_d - kept
        rows = torch.randperm(16, generator=g)[:bs].to(DEVICE)
        args = (spec, rows, kept, int(kept.sum()), rtt, start, WINDOW)
        got = m._windowed_args(*args)
        with swapped(m, "windowed_verify_mask", sc.mask_twin), \
                swapped(eagle_info, "create_flashinfer_kv_indices_triton", sc.KvIndicesTwin()):
            ref = m._windowed_args(*args)
        for name, a, b in zip(("kv_indices", "kv_indptr", "qo_indptr", "mask"), got, ref):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (trial, name, seq)
        checked += 1
    _report(f"kernels_vs_twins_topk{topk}", {"batches": checked, "equal": True})
    assert checked == 40
