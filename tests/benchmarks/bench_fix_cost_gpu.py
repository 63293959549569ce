"""Per-step cost of every fix with per-step work, on a GPU (issue #31 item 1).

For each fix, the step it touches (target verify, draft extend, draft decode, decode, or the
CUDA-graph input fill) is built from sglang's real backends, pools and kernels (the objects of
tests/gpu/test_*_gpu.py and the testbed), at batch 1 and 32 (requests of 600-1000 tokens),
CUDA graphs on, and timed against a reference path that is right by construction:
  fix-off  the same captured graph and the same batch, refreshed without the fix's hooks: the
           fix's buffers still hold what its last refresh wrote for this very batch, so the
           replay is right and only the fix's per-step work is taken out;
  stock    sglang's own path where it is right for this batch (fa3_spec_translate: a hybrid
           pool whose full and SWA ids coincide, so the untranslated tables are the right ones);
  upstream the release's own verify planning with only the crash repaired (flashinfer: what
           0.5.14+ do);
  fa3      the path upstream supports for the same step (XQA verify: fa3 verify, same pool kind).
On a release where upstream has the fix (detection NOT_NEEDED) a row times stock's own step on
both sides ("upstream (stock, fix not needed)"): upstream's fixed form, beside the fixed step of
a release that needs the fix (same GPU, same shapes).
A step is the replay-time metadata refresh (sglang's, plus the fix's hooks) and the graph
replay, timed with CUDA events over blocks of PER_BLOCK steps, reference and fixed blocks
alternating (ABAB) in one process; medians per step over BLOCKS * PER_BLOCK >= 200 steps.
``replay`` is the graph replay alone (the attention kernels). Host-device syncs of one step
are counted (torch.cuda.set_sync_debug_mode("warn"), warnings recorded) on both sides.

Each fix runs in its own child process (one failing or faulting row prints its error line,
the rest go on; ROW_TIMEOUT seconds each). Prints one table; writes $OUT/bench_fix_cost.json.

    python tests/benchmarks/bench_fix_cost_gpu.py [--rows a,b] [--blocks 15] [--per-block 20]
    python tests/benchmarks/bench_fix_cost_gpu.py --dry-run   # CPU: registry, fixes, harness

A new fix: one ``@row(fix, step)`` function returning a ``Pair``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
import random
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "gpu"))

BATCHES = (1, 32)
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64
WINDOW, CHUNK = 100, 256
LENGTHS = [random.Random(0).randrange(600, 1000) for _ in range(32)]
DEVICE = "cuda"


@dataclass
class Side:
    """One path of a step: ``refresh()`` (host-side metadata, None: nothing), ``graph`` (a
    CUDAGraph) and the fixes installed while it runs."""
    graph: object
    refresh: "Callable[[], None] | None" = None
    fixes: list = field(default_factory=list)

    def step(self) -> None:
        if self.refresh is not None:
            self.refresh()
        if self.graph is not None:
            self.graph.replay()

    def replay(self) -> None:
        if self.graph is not None:
            self.graph.replay()


@dataclass
class Pair:
    ref: Side
    fixed: Side
    ref_label: str
    note: str = ""
    same_output: bool = False  # one graph for both, or ids that coincide: outputs must agree


@dataclass
class Row:
    fix: str
    step: str
    build: Callable[[int], Pair]


ROWS: "dict[str, Row]" = {}


def row(fix: str, step: str, key: "str | None" = None):
    """Register ``build(bs) -> Pair`` for ``fix`` (``key``: where one fix has several steps)."""
    def deco(fn):
        ROWS[key or fix] = Row(fix, step, fn)
        return fn
    return deco


def hook(name: str):
    return importlib.import_module(f"sglang_swa_plugin.hooks.{name}")


def installed(fixes):
    from sglang_swa_plugin.core import temporarily_installed

    return temporarily_installed(*fixes)


# ----------------------------------------------------------------------------- shared builders


def torch():
    import torch as t

    return t


def torch_form():
    """While it lasts, ``triton_rail``'s layouts run as torch ops (its CPU form) on a GPU too: the
    references of the triton rail rows, against which the fixed side's kernels are held."""
    from unittest import mock

    from sglang_swa_plugin import triton_rail

    return mock.patch.object(triton_rail, "kernel_lays_out", lambda seq: False)


def capture(forward) -> object:
    """sglang's capture: two eager warm-up passes, then the pass captured into a CUDA graph."""
    t = torch()
    forward()
    forward()
    t.cuda.synchronize()
    g = t.cuda.CUDAGraph()
    with t.cuda.graph(g):
        out = forward()
    t.cuda.synchronize()
    g.outputs = out if isinstance(out, (list, tuple)) else [out]  # what each replay writes
    return g


def to_device(batch) -> None:
    for name in ("req_pool_indices", "seq_lens", "out_cache_loc", "positions", "input_ids", "orig_seq_lens"):
        if getattr(batch, name, None) is not None:
            setattr(batch, name, getattr(batch, name).to(DEVICE))


def replay_refresh(backend, batch, lens) -> Callable[[], None]:
    """sglang's replay-time metadata call for ``batch`` (what its CUDA-graph runner does before
    each replay), with the step's inputs already on the device (no host copies of our own)."""
    from graph_steps import graph_api

    t = torch()
    bs = batch.batch_size
    rows = batch.req_pool_indices.clone()
    lens_d = batch.seq_lens.clone()
    lens_h = t.tensor(list(lens), dtype=t.int64)
    total = int(sum(lens))

    def refresh():
        batch.req_pool_indices.copy_(rows)
        batch.seq_lens.copy_(lens_d)
        if graph_api(backend) == "out_graph":
            batch.seq_lens_cpu = lens_h
            backend.init_forward_metadata_out_graph(batch, in_capture=False)
        else:
            backend.init_forward_metadata_replay_cuda_graph(bs, batch.req_pool_indices, batch.seq_lens, total, None,
                                                            batch.forward_mode, batch.spec_info, lens_h)
    return refresh


def multi_step_metadata(multi, batch, bs: int, in_capture: bool) -> None:
    """A multi-step draft backend's CUDA-graph metadata for ``batch``, by either API sglang has had
    (capture/replay; ``init_forward_metadata_out_graph`` 0.5.13+)."""
    from graph_steps import graph_api

    if graph_api(multi) == "out_graph":
        multi.init_forward_metadata_out_graph(batch, in_capture=in_capture)
    elif in_capture:
        multi.init_forward_metadata_capture_cuda_graph(batch)
    else:
        multi.init_forward_metadata_replay_cuda_graph(batch, bs)


def hybrid_pool(lengths, per_req: int, swa_ids, full_ids, diverge: int = 0, max_context: int = 1100):
    """Real SWAKVPool + allocator (page size 1) on the GPU and req_to_token rows 0.. holding
    ``lengths[i] + per_req`` tokens. ``diverge`` = 0: full and SWA ids coincide (the SWA
    allocator hands out the same ids), so a path that forgets to translate reads right."""
    from sglang_swa_plugin.check import testbed as tb

    t = torch()
    cls = tb.swa_classes()
    size = sum(n + per_req for n in lengths) + diverge + 256
    kw = dict(size=size, size_swa=size, page_size=1, dtype=t.bfloat16, head_num=KV_HEADS, head_dim=HEAD_DIM,
              swa_attention_layer_ids=list(swa_ids), full_attention_layer_ids=list(full_ids), device=DEVICE)
    if "enable_kvcache_transpose" in inspect.signature(cls.SWAKVPool.__init__).parameters:
        kw["enable_kvcache_transpose"] = False
    pool = cls.SWAKVPool(**kw)
    alloc = cls.SWATokenToKVPoolAllocator(size=size, size_swa=size, page_size=1, dtype=t.bfloat16, device=DEVICE,
                                          kvcache=pool, need_sort=False)
    if diverge:
        alloc.full_attn_allocator.alloc(diverge)
    rtt = cls.ReqToTokenPool(size=max(len(lengths), 2), max_context_len=max_context, device=DEVICE,
                             enable_memory_saver=False)
    for r, n in enumerate(lengths):
        rtt.req_to_token[r, : n + per_req] = alloc.alloc(n + per_req).to(rtt.req_to_token.dtype)
    gen = t.Generator(device=DEVICE).manual_seed(1)
    for lid in list(swa_ids) + list(full_ids):
        for buf in pool.get_kv_buffer(lid):
            buf.copy_(t.randn(buf.shape, generator=gen, device=DEVICE).to(buf.dtype))
    return tb, pool, alloc, rtt


def layer(lid: int, window: int = -1, irope: bool = False):
    from sglang.srt.layers.radix_attention import RadixAttention

    kw = {"use_irope": True} if irope else {}
    return RadixAttention(HEADS, HEAD_DIM, HEAD_DIM ** -0.5, KV_HEADS, lid, sliding_window_size=window, **kw)


# ----------------------------------------------------------------------------- FA3 verify


def tree_depths(topk: int, n: int) -> list:
    from sglang_swa_plugin.check import fa3_spec_translate as fa3_check

    return [0, 1, 2, 3][:n] if topk == 1 else [len(a) - 1 for a in fa3_check.TREE]


def fa3_verify(bs: int, topk: int, model: str, fixes: list) -> tuple:
    """FA3 TARGET_VERIFY (4 draft tokens; topk 2: fa3_check.TREE) over a hybrid pool, the
    backend built and the step captured with ``fixes`` installed. gpt_oss: layers 0, 2
    sliding (window WINDOW), 1, 3 full; llama4: layers 0-2 chunked (CHUNK), 3 global."""
    from sglang_swa_plugin.check import fa3_spec_translate as fa3_check

    t = torch()
    n, lens = 4, LENGTHS[:bs]
    llama4 = model == "llama4"
    swa_ids, full_ids = ((0, 1, 2), (3,)) if llama4 else ((0, 2), (1, 3))
    tb, pool, alloc, rtt = hybrid_pool(lens, n, swa_ids, full_ids)
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtt, spec_algorithm="EAGLE3",
                                  topk=topk, num_steps=3 if topk == 1 else 2, num_draft_tokens=n, attention_backend="fa3", model=model,
                                  **({} if llama4 else {"sliding_window_size": WINDOW}))
    runner.device = DEVICE
    if llama4:
        runner.attention_chunk_size = runner.sliding_window_size = CHUNK  # as ModelRunner sets them for Llama 4
    depth = tree_depths(topk, n)
    positions = t.tensor([p + d for p in lens for d in depth], dtype=t.int64, device=DEVICE)
    mask = t.zeros(n, n, dtype=t.bool)
    for i, attends in enumerate(fa3_check.TREE):
        mask[i, list(attends)] = True
    custom = t.cat([t.cat([t.ones(n, p, dtype=t.bool), mask], 1).flatten() for p in lens]).to(DEVICE)
    with installed(fixes):
        backend = tb.build_fa3_backend(runner)
        batch = tb.make_forward_batch(runner, "target_verify", req_pool_indices=list(range(bs)), seq_lens=lens,
                                      out_cache_loc=t.zeros(bs * n, dtype=t.int64),
                                      spec_info=fa3_check.verify_input(custom, lens, topk, n, positions))
        to_device(batch)
        layers = ([layer(i, irope=True) for i in swa_ids] + [layer(3)] if llama4
                  else [layer(i, WINDOW if i in swa_ids else -1) for i in range(4)])
        q = t.randn(bs * n, HEADS * HEAD_DIM, device=DEVICE, dtype=t.bfloat16)
        from graph_steps import prepare_capture

        prepare_capture(backend, batch, n)
        graph = capture(lambda: [backend.forward_extend(q, None, None, lay, batch, save_kv_cache=False)
                                 for lay in layers])
        refresh = replay_refresh(backend, batch, lens)
        refresh()  # the fix's buffers now hold this batch: the fix-off reference replays right
        t.cuda.synchronize()
    return graph, refresh


@row("fa3_spec_translate", "target verify (EAGLE3 topk 2, 4 layers)")
def _fa3_spec_translate(bs):
    fix = hook("fa3_spec_translate").FIX
    graph, refresh = fa3_verify(bs, 2, "gpt_oss", [fix])
    return Pair(Side(graph, refresh), Side(graph, refresh, [fix]), "stock, ids equal",
                "one pool's ids: stock's untranslated tables are right; upstream's fix is the same two gathers", True)


@row("fa3_local_attn_verify", "target verify (EAGLE topk 1, Llama 4 chunked)")
def _fa3_local_attn_verify(bs):
    fix = hook("fa3_local_attn_verify").FIX
    graph, refresh = fa3_verify(bs, 1, "llama4", [fix])
    return Pair(Side(graph, refresh), Side(graph, refresh, [fix]), "fix-off", same_output=True)


@row("fa3_local_attn_tree_verify", "target verify (EAGLE3 topk 2, Llama 4 chunked)")
def _fa3_local_attn_tree_verify(bs):
    fix = hook("fa3_local_attn_tree_verify").FIX
    graph, refresh = fa3_verify(bs, 2, "llama4", [fix])
    return Pair(Side(graph, refresh), Side(graph, refresh, [fix]), "fix-off", same_output=True)


# ----------------------------------------------------------------------------- XQA (trtllm_mha)


def xqa_verify_side(backend_name: str, bs: int) -> Side:
    """bench_xqa_verify_gpu's set-up (test_xqa_graph_replay_gpu's pool, page size 64; layers
    sliding, full, sliding, full; window 100; 4 draft tokens), refreshed sync-free."""
    import test_xqa_graph_replay_gpu as g
    from graph_steps import prepare_capture

    t = torch()
    fixes = [hook("trtllm_xqa_spec_decode").FIX] if backend_name == "trtllm_mha" else []
    lens = LENGTHS[:bs]
    with installed(fixes):
        tb, pool, rtt, runner, backend = g._bench(t.bfloat16, tuple(LENGTHS), backend_name)
        gen = t.Generator(device=DEVICE).manual_seed(1)
        for lid in range(4):
            for buf in pool.get_kv_buffer(lid):
                buf.copy_(t.randn(buf.shape, generator=gen, device=DEVICE).to(buf.dtype))
        layers = [layer(lid, g.WINDOW if lid % 2 == 0 else -1) for lid in range(4)]
        batch = tb.make_forward_batch(runner, "target_verify", req_pool_indices=list(range(bs)), seq_lens=lens,
                                      out_cache_loc=t.zeros(bs * g.Q, dtype=t.int64))
        to_device(batch)
        q = t.randn(bs * g.Q, HEADS * HEAD_DIM, device=DEVICE, dtype=t.bfloat16)
        prepare_capture(backend, batch, g.Q)
        graph = capture(lambda: [backend.forward_extend(q, None, None, lay, batch, save_kv_cache=False)
                                 for lay in layers])
        refresh = replay_refresh(backend, batch, lens)
        refresh()
    return Side(graph, refresh, fixes)


@row("trtllm_xqa_spec_decode", "target verify (EAGLE topk 1, XQA decode kernel)")
def _xqa_spec_decode(bs):
    return Pair(xqa_verify_side("fa3", bs), xqa_verify_side("trtllm_mha", bs), "fa3 verify",
                "target: replay (attention) <= 1.10x fa3's")


@row("trtllm_xqa_dense_query", "decode (XQA, query a view of fused qkv)")
def _xqa_dense_query(bs):
    """Single-token XQA decode of 2 layers; fixed: the query a strided view of a fused qkv
    (GPT-OSS's split) with the fix's .contiguous(); reference: the same call with a dense query
    (the fix does nothing there)."""
    import test_xqa_graph_replay_gpu as g
    from graph_steps import prepare_capture

    t = torch()
    fix = hook("trtllm_xqa_dense_query").FIX
    sides = []
    for strided in (False, True):
        with installed([fix] if strided else []):
            tb, pool, rtt, runner, backend = g._bench(t.bfloat16, tuple(LENGTHS), "trtllm_mha")
            lens = [n + 1 for n in LENGTHS[:bs]]
            batch = tb.make_forward_batch(runner, "decode", req_pool_indices=list(range(bs)), seq_lens=lens,
                                          out_cache_loc=t.zeros(bs, dtype=t.int64))
            to_device(batch)
            qkv = t.randn(bs, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=DEVICE, dtype=t.bfloat16)
            q = qkv[:, : HEADS * HEAD_DIM] if strided else qkv[:, : HEADS * HEAD_DIM].contiguous()
            layers = [layer(0, g.WINDOW), layer(1)]
            prepare_capture(backend, batch, 1)
            graph = capture(lambda: [backend.forward_decode(q, None, None, lay, batch, save_kv_cache=False)
                                     for lay in layers])
            sides.append(Side(graph, replay_refresh(backend, batch, lens), [fix] if strided else []))
    return Pair(sides[0], sides[1], "dense query")


# ----------------------------------------------------------------------------- flashinfer


def flashinfer_side(bs: int, topk: int, fix) -> Side:
    """tests/gpu/test_flashinfer_swa_verify_gpu's backend (window 100, page 1), batch of bs."""
    import test_flashinfer_swa_verify_gpu as tf
    from graph_steps import prepare_capture

    t = torch()
    n = tf.draft_shape(topk)[0]
    lens = LENGTHS[:bs]
    with installed([fix]):
        tb, pool, rtt, runner, backend = tf.build(topk, tuple(LENGTHS[:max(bs, 2)]))
        gen = t.Generator(device=DEVICE).manual_seed(0)
        for lid in (0, 1):
            for buf in pool.get_kv_buffer(lid):
                buf.copy_(t.randn(buf.shape, generator=gen, device=DEVICE).to(buf.dtype))
        layers = [layer(0, WINDOW), layer(1)]
        batch = tf.make_batch(tb, runner, backend, range(bs), lens, topk)
        q = t.randn(bs * n, HEADS * HEAD_DIM, device=DEVICE, dtype=t.bfloat16)
        prepare_capture(backend, batch, n)
        graph = capture(lambda: [backend.forward_extend(q, None, None, lay, batch, save_kv_cache=False)
                                 for lay in layers])
        refresh = replay_refresh(backend, batch, lens)
        refresh()
    return Side(graph, refresh, [fix])


def _flashinfer(bs, topk):
    import bench_flashinfer_verify_gpu as bf

    return Pair(flashinfer_side(bs, topk, bf._baseline_fix()), flashinfer_side(bs, topk, hook("flashinfer_swa_verify").FIX),
                "upstream 0.5.14 form", "reference: only the None-prefix crash repaired (0.5.14+'s planning)")


row("flashinfer_swa_verify", "target verify (EAGLE topk 1, 2 layers)", "flashinfer_swa_verify_topk1")(
    lambda bs: _flashinfer(bs, 1))
row("flashinfer_swa_verify", "target verify (EAGLE topk 2, 2 layers)", "flashinfer_swa_verify_topk2")(
    lambda bs: _flashinfer(bs, 2))


# ----------------------------------------------------------------------------- Triton drafts


def triton_parts(bs: int, per_req: int, steps: int = 4):
    """A TritonAttnBackend runner (gpt_oss, sliding window WINDOW, EAGLE topk 1) over a hybrid
    pool, as check/triton_bench.build does on the CPU."""
    from sglang_swa_plugin.check import triton_bench as ct

    tb, pool, alloc, rtt = hybrid_pool(LENGTHS[:bs], per_req, (0, 2), (1, 3), max_context=1100)
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtt, spec_algorithm="EAGLE",
                                  topk=1, num_steps=steps, num_draft_tokens=steps + 1, sliding_window_size=WINDOW,
                                  attention_backend="triton")
    runner.device = DEVICE
    for name in ("hybrid_gdn_config", "kimi_linear_config", "linear_attn_model_spec"):
        setattr(runner, name, getattr(runner, name, None))
    runner.decode_num_tokens_per_req = lambda **_: steps + 1
    return tb, pool, rtt, runner, ct


@contextlib.contextmanager
def triton_construction(ct):
    with ct.single_rank() as tri:
        yield tri


def draft_decode_locations(bs: int, steps: int):
    """A multi-step draft decode batch's write locations: one per request, or one per step and
    request where sglang splits them per step (``eagle_utils.per_step_draft_out_cache_loc``,
    0.5.23+, which asserts their number)."""
    t = torch()
    per_step = hasattr(importlib.import_module("sglang.srt.speculative.eagle_utils"), "per_step_draft_out_cache_loc")
    return t.zeros(bs * (steps if per_step else 1), dtype=t.int64)


@row("triton_swa_draft", "draft decode (multi-step, 3 steps, sliding layer)", "triton_swa_draft_decode")
def _triton_draft_decode(bs):
    """Each draft step's forward_decode on a sliding layer. Fix-off: sglang's own refresh (the
    step rails) leaves the window rails alone, so they hold what the fix's last refresh wrote
    for this batch; both releases' CUDA-graph APIs (capture/replay, out_graph 0.5.13+)."""
    from graph_steps import in_graph

    t = torch()
    fix = hook("triton_swa_draft").FIX
    steps = 4  # TritonMultiStepDraftBackend runs steps - 1 backends
    tb, pool, rtt, runner, ct = triton_parts(bs, 2 * steps)
    lens = LENGTHS[:bs]
    with installed([fix]):
        with triton_construction(ct) as tri:
            multi = tri.TritonMultiStepDraftBackend(runner, 1, steps)
        multi.init_cuda_graph_state(bs, bs)
        batch = tb.make_forward_batch(runner, "draft_decode", req_pool_indices=list(range(bs)), seq_lens=lens,
                                      attn_backend=multi, out_cache_loc=draft_decode_locations(bs, steps))
        to_device(batch)
        batch.positions = batch.seq_lens.clone()
        multi_step_metadata(multi, batch, bs, in_capture=True)
        lay = layer(0, WINDOW)
        q = t.randn(bs, HEADS * HEAD_DIM, device=DEVICE, dtype=t.bfloat16)
        k = t.randn(bs, KV_HEADS, HEAD_DIM, device=DEVICE, dtype=t.bfloat16)

        def forward():
            in_graph(multi, batch)
            return [be.forward_decode(q, k, k, lay, batch, save_kv_cache=False) for be in multi.attn_backends]

        graph = capture(forward)

        def refresh():
            multi_step_metadata(multi, batch, bs, in_capture=False)

        refresh()
        t.cuda.synchronize()
    return Pair(Side(graph, refresh), Side(graph, refresh, [fix]), "fix-off", same_output=True)


@row("triton_swa_draft", "draft extend (DRAFT_EXTEND_V2, 4 tokens, sliding layer)", "triton_swa_draft_extend")
def _triton_draft_extend(bs):
    """A DRAFT_EXTEND_V2 forward_extend on a sliding layer. Fix-off: sglang's own refresh (the
    full rail) leaves the window rail alone, so it holds what the fix's last refresh wrote for
    this batch. The graph takes as many query tokens per request as the batch has (q, k and
    extend lengths), else its kernel reads and writes past them and both sides' outputs are
    noise. The note holds the graph's output against sglang's own eager draft extend (stock,
    the prefix's window built by sglang itself): the reference is right, not only equal."""
    from types import SimpleNamespace

    from graph_steps import in_graph, prepare_capture

    t = torch()
    fix = hook("triton_swa_draft").FIX
    n = 4
    # query tokens per request of sglang's draft-extend graph: num_draft_tokens (0.5.13+),
    # num_steps + 1 (before): both n with n - 1 steps
    tb, pool, rtt, runner, ct = triton_parts(bs, n, steps=n - 1)
    lens = [p + n for p in LENGTHS[:bs]]  # draft extend: seq_lens count the extended tokens

    def draft_batch(backend):
        batch = tb.make_forward_batch(runner, "draft_extend_v2", req_pool_indices=list(range(bs)), seq_lens=lens,
                                      out_cache_loc=t.zeros(bs * n, dtype=t.int64), extend_seq_lens=[n] * bs,
                                      num_tokens_per_req=n, attn_backend=backend)
        to_device(batch)
        for name in ("extend_seq_lens", "extend_prefix_lens", "extend_start_loc"):
            if getattr(batch, name, None) is not None:
                setattr(batch, name, getattr(batch, name).to(DEVICE))
        batch.spec_info = SimpleNamespace(extend_seq_lens_tensor=batch.extend_seq_lens, custom_mask=None)
        return batch

    lay = layer(0, WINDOW)
    q = t.randn(bs * n, HEADS * HEAD_DIM, device=DEVICE, dtype=t.bfloat16)
    k = t.randn(bs * n, KV_HEADS, HEAD_DIM, device=DEVICE, dtype=t.bfloat16)
    with installed([fix]):
        with triton_construction(ct) as tri:
            backend = tri.TritonAttnBackend(runner)
        batch = draft_batch(backend)
        prepare_capture(backend, batch, n)

        def forward():
            in_graph(backend, batch)
            return backend.forward_extend(q, k, k, lay, batch, save_kv_cache=False)

        graph = capture(forward)
        refresh = replay_refresh(backend, batch, lens)
        refresh()
        graph.replay()
        t.cuda.synchronize()
        replayed = [o.clone().float() for o in graph.outputs]
    with triton_construction(ct) as tri:  # stock sglang's eager draft extend of the same batch
        eager_backend = tri.TritonAttnBackend(runner)
    eager_batch = draft_batch(eager_backend)
    eager_backend.init_forward_metadata(eager_batch)
    eager = eager_backend.forward_extend(q, k, k, lay, eager_batch, save_kv_cache=False).float()
    t.cuda.synchronize()
    check = float((replayed[0] - eager).abs().max())
    return Pair(Side(graph, refresh), Side(graph, refresh, [fix]), "fix-off", same_output=True,
                note=f"graph vs stock eager draft extend, max diff {check:.3g}")


@row("swa_write_loc", "draft decode (multi-step, 3 steps writing a sliding layer's KV), triton 0.5.13+",
     "swa_write_loc_triton")
def _swa_write_loc_triton(bs):
    """Each draft step's forward_decode with its KV write (the multi-step triton draft of a
    sliding-window draft). Reference: every step's metadata handed its own SWA write locations
    before the capture (right by construction, upstream 0.5.23's form); fixed: the fix's gather
    captured with each step. Both with triton_swa_draft (the window rails)."""
    from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc

    t = torch()
    fix, draft_fix = hook("swa_write_loc").FIX, hook("triton_swa_draft").FIX
    if not any(h.fn is hook("swa_write_loc")._triton_step_writes for h in fix.detect().plan):
        raise RuntimeError(f"swa_write_loc has no triton step form here: {fix.detect().reason[:120]}")
    steps = 4  # TritonMultiStepDraftBackend runs steps - 1 backends
    tb, pool, rtt, runner, ct = triton_parts(bs, 2 * steps)
    lens = LENGTHS[:bs]
    whole = runner.token_to_kv_pool_allocator.alloc(bs * steps).to(DEVICE)
    per_step = per_step_draft_out_cache_loc(whole, bs, 1, steps)
    lay = layer(0, WINDOW)
    q = t.randn(bs, HEADS * HEAD_DIM, device=DEVICE, dtype=t.bfloat16)
    k = t.randn(bs, KV_HEADS, HEAD_DIM, device=DEVICE, dtype=t.bfloat16)

    def side(fixes, own_locations: bool) -> Side:
        with installed(fixes):
            with triton_construction(ct) as tri:
                multi = tri.TritonMultiStepDraftBackend(runner, 1, steps)
            multi.init_cuda_graph_state(bs, bs)
            batch = tb.make_forward_batch(runner, "draft_decode", req_pool_indices=list(range(bs)), seq_lens=lens,
                                          attn_backend=multi, out_cache_loc=whole)
            to_device(batch)
            batch.positions = batch.seq_lens.clone()
            multi_step_metadata(multi, batch, bs, in_capture=True)
            if own_locations:
                for i, be in enumerate(multi.attn_backends):
                    be.forward_metadata.swa_out_cache_loc = pool.translate_loc_from_full_to_swa(per_step[i])

            def forward():  # fresh step views per pass, as sglang's draft_forward makes them
                outs, views = [], per_step_draft_out_cache_loc(whole, bs, 1, steps)
                for i, be in enumerate(multi.attn_backends):
                    batch.out_cache_loc = views[i]
                    outs.append(be.forward_decode(q, k, k, lay, batch))
                batch.out_cache_loc = whole
                return outs

            graph = capture(forward)

            def refresh():
                batch.out_cache_loc = whole
                multi_step_metadata(multi, batch, bs, in_capture=False)

            refresh()
            graph.replay()
            t.cuda.synchronize()
            replayed = [o.clone().float() for o in graph.outputs]
            eager = [o.float() for o in forward()]  # the same step without the graph
            t.cuda.synchronize()
            checks.append(max(float((a - b).abs().max()) for a, b in zip(replayed, eager)))
        return Side(graph, refresh, list(fixes))

    checks = []
    ref = side([draft_fix], True)
    fixed = side([draft_fix, fix], False)
    return Pair(ref, fixed, "own locations", same_output=True,
                note=f"graph vs eager, max diff: reference {checks[0]:.3g}, fixed {checks[1]:.3g}")


# ----------------------------------------------------------------------------- graph input fill


@row("swa_graph_padding", "CUDA-graph input fill of a padded verify batch (host part of a step)")
def _swa_graph_padding(bs):
    """sglang's DecodeInputBuffers (hybrid SWA pool) filled for ``bs`` requests padded to
    ``bs + 1`` rows (the only case the fix works in): the fix's one zero_ against the fill
    alone. No graph: the smallest step holding the fix's work (an upper bound on its share)."""
    from sglang.srt.model_executor import cuda_graph_runner as cgr
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang_swa_plugin.check import testbed as tb

    t = torch()
    n, padded = 4, bs + 1
    fix = hook("swa_graph_padding").FIX
    buffers = tb._call_with_supported(
        cgr.DecodeInputBuffers.create, device=t.device(DEVICE), max_bs=padded, max_num_token=padded * n,
        hidden_size=64, vocab_size=128, dtype=t.bfloat16, dp_size=1, pp_size=1, is_encoder_decoder=False,
        require_mlp_tp_gather=False, seq_len_fill_value=1, encoder_len_fill_value=0, num_tokens_per_bs=n,
        cache_loc_dtype=t.int64, enable_mamba_track=False, is_hybrid_swa=True)
    loc = t.arange(10, 10 + bs * n, dtype=t.int64, device=DEVICE)
    batch = ForwardBatch(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs,
                         input_ids=t.zeros(bs * n, dtype=t.int64, device=DEVICE),
                         req_pool_indices=t.arange(bs, device=DEVICE),
                         seq_lens=t.tensor(LENGTHS[:bs], dtype=t.int32, device=DEVICE), out_cache_loc=loc,
                         seq_lens_sum=sum(LENGTHS[:bs]))
    batch.out_cache_loc_swa = loc + 1000
    batch.positions = t.zeros(bs * n, dtype=t.int64, device=DEVICE)
    batch.seq_lens_cpu = t.tensor(LENGTHS[:bs])
    batch.num_token_non_padded = t.tensor([bs * n], dtype=t.int32, device=DEVICE)

    def refresh():
        tb._call_with_supported(
            buffers.populate_from_forward_batch, forward_batch=batch, raw_bs=bs, raw_num_token=bs * n, bs=padded,
            seq_len_fill_value=1, require_gathered_buffer=False, num_tokens_per_bs=n, nsa_enable_prefill_cp=False,
            enable_num_token_non_padded_flag=False)

    return Pair(Side(None, refresh), Side(None, refresh, [fix]), "fix-off", "no graph: input fill only")


def triton_decode(bs: int, lens, chunk: "int | None" = None, fixes=()) -> tuple:
    """A TritonAttnBackend (built with ``fixes`` in; ``chunk``: the runner's Llama 4 chunk, as
    ModelRunner sets it, window and chunk alike) and a plain decode batch of ``lens``, prepared
    for a CUDA-graph capture."""
    from graph_steps import prepare_capture

    t = torch()
    tb, pool, rtt, runner, ct = triton_parts(bs, 1)
    if chunk is not None:
        runner.attention_chunk_size = runner.sliding_window_size = chunk
    with installed(list(fixes)):
        with triton_construction(ct) as tri:
            backend = tri.TritonAttnBackend(runner)
    batch = tb.make_forward_batch(runner, "decode", req_pool_indices=list(range(bs)), seq_lens=lens,
                                  out_cache_loc=t.zeros(bs, dtype=t.int64), attn_backend=backend)
    to_device(batch)
    with installed(list(fixes)):
        prepare_capture(backend, batch, 1)
    return backend, batch


@row("triton_swa_window", "decode (Triton, a sliding and a full layer)")
def _triton_swa_window(bs):
    """Plain decode on a TritonAttnBackend (window WINDOW) over a hybrid pool, CUDA graphs on,
    the graph state built and the step captured with the fix in (its window buffer holds
    window + 1 keys per token). The fix's per-step work: its builders' window argument + 1.
    Fix-off refreshes the same graph with sglang's window-key rail, so outputs differ by one
    key per request by design (the fix's point), not compared."""
    t = torch()
    fix = hook("triton_swa_window").FIX
    lens = [n + 1 for n in LENGTHS[:bs]]  # the token being decoded included
    backend, batch = triton_decode(bs, lens, fixes=[fix])
    with installed([fix]):
        layers = [layer(0, WINDOW), layer(1)]
        q = t.randn(bs, HEADS * HEAD_DIM, device=DEVICE, dtype=t.bfloat16)
        k = t.randn(bs, KV_HEADS, HEAD_DIM, device=DEVICE, dtype=t.bfloat16)
        graph = capture(lambda: [backend.forward_decode(q, k, k, lay, batch, save_kv_cache=False)
                                 for lay in layers])
        refresh = replay_refresh(backend, batch, lens)
        refresh()
        t.cuda.synchronize()
    return Pair(Side(graph, refresh), Side(graph, refresh, [fix]), "fix-off",
                "fix-off: sglang's window-key rail in the same graph (outputs differ by design)")


@row("triton_local_attn", f"decode (Triton, Llama 4: two chunked layers and two full ones, chunk {CHUNK})")
def _triton_local_attn(bs, chunk: int = CHUNK):
    """Plain decode on a TritonAttnBackend for Llama 4 (``chunk``, requests of 600-1000 tokens)
    over a hybrid pool, CUDA graphs on. Fixed: the fix's chunk rail (a gather and a translation
    per step) captured in the graph. Reference: the same rail built once before the capture, in
    torch ops (``triton_rail``'s CPU form; the fixed side's graph holds ``rail_kernel``'s kernel),
    and handed to the chunked layers (right for this batch by construction; the fix's per-step
    work taken out). Outputs must agree."""
    import dataclasses

    t = torch()
    fix, mod = hook("triton_local_attn").FIX, hook("triton_local_attn")
    lens = [n + 1 for n in LENGTHS[:bs]]  # the token being decoded included
    layers = [layer(0, irope=True), layer(1), layer(2, irope=True), layer(3)]
    q = t.randn(bs, HEADS * HEAD_DIM, device=DEVICE, dtype=t.bfloat16)
    k = t.randn(bs, KV_HEADS, HEAD_DIM, device=DEVICE, dtype=t.bfloat16)

    def side(fixed: bool) -> Side:
        backend, batch = triton_decode(bs, lens, chunk, [fix])  # the backend keeps its runner's chunk either way
        with torch_form():
            prebuilt = mod._decode_fields(backend, batch, chunk, True)

        def forward():
            if fixed:
                with installed([fix]):
                    return [backend.forward_decode(q, k, k, lay, batch, save_kv_cache=False) for lay in layers]
            outs, metadata = [], backend.forward_metadata
            for lay in layers:
                if lay.use_irope:
                    backend.forward_metadata = dataclasses.replace(metadata, **prebuilt)
                outs.append(backend.forward_decode(q, k, k, lay, batch, save_kv_cache=False))
                backend.forward_metadata = metadata
            return outs

        graph = capture(forward)
        graph.kept = (prebuilt, q, k)  # what every replay reads: kept alive with its graph (q, k: else freed)
        refresh = replay_refresh(backend, batch, lens)
        refresh()
        t.cuda.synchronize()
        return Side(graph, refresh, [fix] if fixed else [])

    return Pair(side(False), side(True), "rail before capture", same_output=True)


# Llama 4's own chunk: the fix's rail is bs * 8192 ids per step (longer than these requests)
row("triton_local_attn", "decode (Triton, Llama 4, chunk 8192)", "triton_local_attn_8k")(
    lambda bs: _triton_local_attn(bs, 8192))


def triton_tree_verify(bs: int, size: int, model: str, fixes) -> tuple:
    """A TritonAttnBackend (EAGLE3 topk 2, 4 draft tokens as fa3_check.TREE; ``model`` llama4:
    chunk ``size``, gpt_oss: window ``size``) and its TARGET_VERIFY batch (requests of 600-1000
    tokens), prepared for a CUDA-graph capture with ``fixes`` in."""
    from sglang_swa_plugin.check import fa3_spec_translate as fa3_check
    from sglang_swa_plugin.check import triton_bench as ct
    from graph_steps import prepare_capture

    t = torch()
    n, lens = 4, LENGTHS[:bs]
    tb, pool, alloc, rtt = hybrid_pool(lens, n, (0, 2), (1, 3))
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtt, spec_algorithm="EAGLE3",
                                  topk=2, num_steps=2, num_draft_tokens=n, attention_backend="triton", model=model,
                                  **({} if model == "llama4" else {"sliding_window_size": size}))
    runner.device = DEVICE
    if model == "llama4":
        runner.attention_chunk_size = runner.sliding_window_size = size  # as ModelRunner sets them for Llama 4
    for name in ("hybrid_gdn_config", "kimi_linear_config", "linear_attn_model_spec"):
        setattr(runner, name, getattr(runner, name, None))
    runner.decode_num_tokens_per_req = lambda **_: n
    with installed(list(fixes)):
        with triton_construction(ct) as tri:
            backend = tri.TritonAttnBackend(runner)
    positions = t.tensor([p + d for p in lens for d in tree_depths(2, n)], dtype=t.int64, device=DEVICE)
    mask = t.zeros(n, n, dtype=t.bool)
    for i, attends in enumerate(fa3_check.TREE):
        mask[i, list(attends)] = True
    custom = t.cat([t.cat([t.ones(n, p, dtype=t.bool), mask], 1).flatten() for p in lens]).to(DEVICE)
    batch = tb.make_forward_batch(runner, "target_verify", req_pool_indices=list(range(bs)), seq_lens=lens,
                                  out_cache_loc=t.zeros(bs * n, dtype=t.int64), attn_backend=backend,
                                  spec_info=fa3_check.verify_input(custom, lens, 2, n, positions))
    to_device(batch)
    batch.positions = positions
    with installed(list(fixes)):
        prepare_capture(backend, batch, n)
    return backend, batch, lens, n


def _triton_tree(bs: int, fix_name: str, model: str, size: int, layers, rail, kernel_args: dict) -> Pair:
    """A tree's target verify (4 draft tokens) of ``layers`` (two in the SWA part, two full) on a
    TritonAttnBackend, CUDA graphs on. Fixed: the fix's rail (a gather, a translation and the
    tree mask re-laid) captured in the graph. Reference: the same rail (``rail(backend, batch)``)
    built once before the capture, in torch ops (``triton_rail``'s CPU form; the fixed side's
    graph holds the Triton kernel of ``rail_kernel``), and handed to the SWA-part layers with the
    fix's kernel arguments (right for this batch by construction; the fix's per-step work taken
    out). Outputs must agree."""
    import dataclasses

    from sglang_swa_plugin.triton_rail import kernel_with

    t = torch()
    fix = hook(fix_name).FIX

    def side(fixed: bool) -> Side:
        backend, batch, lens, n = triton_tree_verify(bs, size, model, [fix])
        q = t.randn(bs * n, HEADS * HEAD_DIM, device=DEVICE, dtype=t.bfloat16, generator=t.Generator(DEVICE).manual_seed(2))
        k = t.randn(bs * n, KV_HEADS, HEAD_DIM, device=DEVICE, dtype=t.bfloat16, generator=t.Generator(DEVICE).manual_seed(3))
        refresh = replay_refresh(backend, batch, lens)
        refresh()  # the tree mask into the graph's buffer: the reference's rail is built from it
        with torch_form():
            prebuilt = rail(backend, batch)
        kernel = backend.extend_attention_fwd

        def forward():
            if fixed:
                with installed([fix]):
                    return [backend.forward_extend(q, k, k, lay, batch, save_kv_cache=False) for lay in layers]
            outs, metadata = [], backend.forward_metadata
            for lay in layers:
                if lay.layer_id in (0, 2):
                    backend.forward_metadata = dataclasses.replace(metadata, **prebuilt)
                    backend.extend_attention_fwd = kernel_with(kernel, kernel_args)
                outs.append(backend.forward_extend(q, k, k, lay, batch, save_kv_cache=False))
                backend.forward_metadata, backend.extend_attention_fwd = metadata, kernel
            return outs

        graph = capture(forward)
        graph.kept = (prebuilt, q, k)  # what every replay reads: kept alive with its graph
        refresh()
        t.cuda.synchronize()
        return Side(graph, refresh, [fix] if fixed else [])

    return Pair(side(False), side(True), "rail before capture", same_output=True)


def _local_attn_tree(bs: int, chunk: int) -> Pair:
    mod = hook("triton_local_attn")
    return _triton_tree(bs, "triton_local_attn", "llama4", chunk,
                        [layer(0, irope=True), layer(1), layer(2, irope=True), layer(3)],
                        lambda be, fb: mod._tree_fields(be, fb, chunk, True), {"skip_prefix_custom_mask": False})


row("triton_local_attn", f"target verify, EAGLE3 topk 2 (Triton, Llama 4, chunk {CHUNK}; the tree rail)",
    "triton_local_attn_tree")(lambda bs: _local_attn_tree(bs, CHUNK))
# Llama 4's own chunk: the re-laid mask is bs * 4 * (8192 + 4) cells per step
row("triton_local_attn", "target verify, EAGLE3 topk 2 (Triton, Llama 4, chunk 8192; the tree rail)",
    "triton_local_attn_tree_8k")(lambda bs: _local_attn_tree(bs, 8192))


@row("triton_swa_tree_verify", f"target verify, EAGLE3 topk 2 (Triton, two sliding layers of window {WINDOW}, "
     "two full)")
def _swa_tree_verify(bs):
    mod = hook("triton_swa_tree_verify")
    return _triton_tree(bs, "triton_swa_tree_verify", "gpt_oss", WINDOW,
                        [layer(i, WINDOW if i in (0, 2) else -1) for i in range(4)],
                        lambda be, fb: mod._window_fields(be, fb, WINDOW, True), mod.KERNEL_ARGS)


# ----------------------------------------------------------------------------- timing


def count_syncs(fn) -> int:
    """Host-device synchronizations in one call of ``fn`` (torch's sync debug mode, warned)."""
    t = torch()
    t.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        t.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            t.cuda.set_sync_debug_mode("default")
    t.cuda.synchronize()
    return sum(1 for w in seen if "synchroniz" in str(w.message))


def output_diff(pair: Pair) -> float:
    """Largest difference between the reference step's outputs and the fixed step's (where both
    replay one graph, or stock reads the right ids: 0 up to kernel nondeterminism). Shows
    that the reference is right and that the fix's refresh rewrote what its buffers held."""
    t = torch()
    got = []
    for side in (pair.ref, pair.fixed):
        with installed(side.fixes):
            side.step()
        t.cuda.synchronize()
        got.append([o.clone().float() for o in side.graph.outputs])
    return max(float((a - b).abs().max()) for a, b in zip(*got))


def time_block(fn, per_block: int) -> float:
    """µs per call of ``fn`` over ``per_block`` calls, by CUDA events (host time between
    launches included: the step's refresh runs on the host)."""
    t = torch()
    start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(per_block):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / per_block


def measure(pair: Pair, blocks: int, per_block: int) -> dict:
    times = {(s, w): [] for s in ("ref", "fixed") for w in ("step", "replay")}
    syncs = {}
    for name, side in (("ref", pair.ref), ("fixed", pair.fixed)):
        with installed(side.fixes):
            side.step()
            syncs[name] = count_syncs(side.step)
    diff = output_diff(pair) if pair.same_output else None
    for _ in range(blocks):  # ABAB: no drift or order bias between the two
        for name, side in (("ref", pair.ref), ("fixed", pair.fixed)):
            with installed(side.fixes):
                side.step()
                times[(name, "step")].append(time_block(side.step, per_block))
                if side.graph is not None:
                    times[(name, "replay")].append(time_block(side.replay, per_block))
    med = {f"{s}_{w}_us": round(statistics.median(v), 2) for (s, w), v in times.items() if v}
    out = {**med, "ref_syncs_per_step": syncs["ref"], "fixed_syncs_per_step": syncs["fixed"],
           "steps_timed": blocks * per_block, "ref": pair.ref_label, "note": pair.note, "output_max_diff": diff}
    for w in ("step", "replay"):
        if f"ref_{w}_us" in med:
            out[f"{w}_ratio"] = round(med[f"fixed_{w}_us"] / med[f"ref_{w}_us"], 4)
    return out


def child(key: str, blocks: int, per_block: int) -> None:
    """One fix's rows, each batch size on its own: prints ROW=<json> per batch."""
    from sglang_swa_plugin.fix import Verdict

    spec = ROWS[key]
    found = hook(spec.fix).FIX.detect()
    for bs in BATCHES:
        res = {"key": key, "fix": spec.fix, "step": spec.step, "bs": bs}
        try:
            if found.verdict not in (Verdict.NEEDED, Verdict.NOT_NEEDED):
                raise RuntimeError(f"not measured: {found.verdict.name.lower()} on this sglang ({found.reason[:150]})")
            res.update(measure(spec.build(bs), blocks, per_block))
            if found.verdict is Verdict.NOT_NEEDED:  # the fix installs nothing: both sides are stock's
                res["ref"] = "upstream (stock, fix not needed)"  # step, upstream's fixed form here
        except Exception as e:  # noqa: BLE001 - the row says why; the other batch goes on
            res["error"] = f"{type(e).__name__}: {e}"[:300]
            import traceback

            traceback.print_exc()  # into the children's log
        print("ROW=" + json.dumps(res), flush=True)


# ----------------------------------------------------------------------------- the table


TARGET_STEP, TARGET_XQA = 1.02, 1.10


def verdict(r: dict) -> str:
    if "error" in r:
        return "error"
    if r["fix"] == "trtllm_xqa_spec_decode":
        ok = r.get("replay_ratio", 9) <= TARGET_XQA
    else:
        ok = r.get("step_ratio", 9) <= TARGET_STEP
    return (("ok" if ok else "missed") + ("" if r["fixed_syncs_per_step"] <= r["ref_syncs_per_step"] else " +sync")
            + (" OUTPUTS DIFFER" if (r.get("output_max_diff") or 0) > 1e-2 else ""))


def table(rows: list) -> str:
    head = ("| fix | step | batch | reference | ref µs | fixed µs | ratio | replay ref µs | replay fixed µs "
            "| replay ratio | syncs ref/fixed | output diff | target |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['fix']} | {r['step']} | {r['bs']} | error: {r['error'][:160]} ||||||||||")
            continue
        g = lambda k: r.get(k, "-")  # noqa: E731
        lines.append(f"| {r['fix']} | {r['step']} | {r['bs']} | {r['ref']} | {g('ref_step_us')} | {g('fixed_step_us')} "
                     f"| {g('step_ratio')} | {g('ref_replay_us')} | {g('fixed_replay_us')} | {g('replay_ratio')} "
                     f"| {r['ref_syncs_per_step']}/{r['fixed_syncs_per_step']} | {g('output_max_diff')} | {verdict(r)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS), help="comma list of row keys (default: all)")
    ap.add_argument("--blocks", type=int, default=int(os.environ.get("BLOCKS", "15")))
    ap.add_argument("--per-block", type=int, default=int(os.environ.get("PER_BLOCK", "20")))
    ap.add_argument("--row-timeout", type=float, default=float(os.environ.get("ROW_TIMEOUT", "100")))
    ap.add_argument("--budget", type=float, default=float(os.environ.get("BUDGET", "420")),
                    help="seconds for all rows together; a row not started in time says so")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--dry-run", action="store_true", help="CPU: list rows, resolve their fixes, run the harness")
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.blocks, a.per_block)
    keys = [k for k in a.rows.split(",") if k]
    unknown = [k for k in keys if k not in ROWS]
    if unknown:
        ap.error(f"unknown rows {unknown}; known: {sorted(ROWS)}")
    if a.blocks * a.per_block < 200:
        ap.error("at least 200 steps per side (blocks * per-block)")
    if a.dry_run:
        return dry_run(keys)
    results, t0 = [], time.time()
    for key in keys:
        cmd = [sys.executable, __file__, "--child", key, "--blocks", str(a.blocks), "--per-block", str(a.per_block)]
        left = a.budget - (time.time() - t0)
        try:
            if left < 15:
                raise subprocess.TimeoutExpired(cmd, 0, output="")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=min(a.row_timeout, left))
            out, err = proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = f"timed out ({min(a.row_timeout, max(left, 0)):.0f} s left for it)"
        got = [json.loads(l[4:]) for l in out.splitlines() if l.startswith("ROW=")]
        if os.environ.get("OUT"):  # every child's output, for the rows that failed
            with open(Path(os.environ["OUT"], "bench_fix_cost_children.log"), "a") as f:
                f.write(f"===== {key}\n{out}\n{(err or '')[-20000:]}\n")
        for bs in BATCHES:
            if not any(r["bs"] == bs for r in got):
                last = [l for l in (err or "").strip().splitlines() if l.strip()][-1:] or ["no output"]
                got.append({"key": key, "fix": ROWS[key].fix, "step": ROWS[key].step, "bs": bs,
                            "error": f"child: {last[0][:250]}"})
        for r in sorted(got, key=lambda r: r["bs"]):
            print(f"{r['fix']} bs={r['bs']}: " + (r["error"] if "error" in r else
                  f"ratio {r.get('step_ratio')} (replay {r.get('replay_ratio')}), syncs "
                  f"{r['ref_syncs_per_step']}/{r['fixed_syncs_per_step']}"), flush=True)
            results.append(r)
    print(table(results))
    out_dir = os.environ.get("OUT")
    if out_dir:
        import torch as t

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        Path(out_dir, "bench_fix_cost.json").write_text(json.dumps(
            {"device": t.cuda.get_device_name() if t.cuda.is_available() else None, "blocks": a.blocks,
             "per_block": a.per_block, "seconds": round(time.time() - t0, 1), "rows": results}, indent=1))


def dry_run(keys) -> None:
    """CPU: every row's fix module and FIX resolve and say their verdict on the installed
    sglang; the table and the harness run on a synthetic pair (perf_counter, no GPU)."""
    from sglang_swa_plugin.fix import Verdict

    for key in keys:
        fix = hook(ROWS[key].fix).FIX
        det = fix.detect()
        print(f"{key}: {fix.name} {det.verdict.value}{'' if det.verdict is Verdict.NEEDED else ' (' + det.reason[:80] + ')'}")
    fake = [{"key": k, "fix": ROWS[k].fix, "step": ROWS[k].step, "bs": bs, "ref": "fix-off", "note": "",
             "ref_step_us": 10.0, "fixed_step_us": 10.1, "step_ratio": 1.01, "ref_replay_us": 8.0,
             "fixed_replay_us": 8.0, "replay_ratio": 1.0, "ref_syncs_per_step": 0, "fixed_syncs_per_step": 0}
            for k in keys for bs in BATCHES]
    fake[0] = {**fake[0], "error": "RuntimeError: example"}
    print(table(fake))


if __name__ == "__main__":
    main()
