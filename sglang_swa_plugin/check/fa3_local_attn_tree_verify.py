"""CPU scenario of ``fa3_local_attn_tree_verify``: the keys a Llama 4 chunked layer's two
cascade kernels read in FA3's topk > 1 TARGET_VERIFY (eager, or CUDA-graph capture then
replay), through sglang's own ``forward_extend`` on a real ``FlashAttentionBackend`` over a
real ``SWAKVPool``, with FA3's kernel recorded."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from ..fa3_local import FA3_MODULE as MODULE
from ..hooks.fa3_spec_translate import KERNEL as SWA_SPEC_KERNEL
from ..probe import optional_module, swapped
from . import Outcome
from . import testbed as tb
from .fa3_local_attn_verify import CHUNK, CUDA_ONLY, LENS, SWA_LAYER, capture, graph_outcome, make_bench, replay  # noqa: F401
from .fa3_spec_translate import TREE, verify_input
from .kernels import cpu_kernels

DEPTH = tuple(len(t) - 1 for t in TREE)  # draft token j sits at position prefix + DEPTH[j]


def tree_batch(bench, lens=LENS, which=None):
    """A real TARGET_VERIFY ``ForwardBatch`` of the bench's requests ``which`` (default: the
    first ``len(lens)``) at ``lens`` with the EAGLE tree ``TREE`` (topk 2): sglang's
    full-prefix mask and the draft tokens' positions on a real ``EagleVerifyInput``."""
    import torch

    n = len(TREE)
    tree = torch.zeros(n, n, dtype=torch.bool)
    for i, attends in enumerate(TREE):
        tree[i, list(attends)] = True
    mask = torch.cat([torch.cat([torch.ones(n, p, dtype=torch.bool), tree], 1).flatten() for p in lens])
    positions = torch.cat([p + torch.tensor(DEPTH) for p in lens])
    spec = verify_input(mask, list(lens), 2, n, positions=positions)
    which = list(range(len(lens))) if which is None else list(which)
    out_loc = torch.cat([bench.reqs[i][p:p + n] for i, p in zip(which, lens)])
    batch = tb.make_forward_batch(bench.runner, "target_verify", seq_lens=list(lens), spec_info=spec,
                                  req_pool_indices=[int(bench.rows[i]) for i in which], out_cache_loc=out_loc)
    batch.positions = positions  # as sglang sets them for verify: the tree's, not consecutive
    return batch


@contextlib.contextmanager
def recorded_kernels(calls: list, backend):
    """FA3's kernel (the module's, or the backend's own binding up to 0.5.10) recorded (its tensors kept by reference, as a CUDA graph holds them),
    the merge of the two cascade parts and the SWA-window layers' spec page-table kernel
    (a Triton kernel; no chunked layer reads its output) stood in for."""
    import torch

    def kernel(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q=None, max_seqlen_q=None,
               causal=False, return_softmax_lse=False, **kw):
        calls.append(SimpleNamespace(k_cache=k_cache, table=page_table, seqused_k=cache_seqlens, cu_q=cu_seqlens_q,
                                     max_q=max_seqlen_q, causal=causal))
        o = torch.zeros_like(q)
        return (o, torch.zeros(q.shape[1], q.shape[0]), None) if return_softmax_lse else o

    mod = optional_module(MODULE)
    with contextlib.ExitStack() as stack:
        stack.enter_context(swapped(mod, "flash_attn_with_kvcache", kernel))
        if "flash_attn_with_kvcache" in vars(backend):
            stack.enter_context(swapped(backend, "flash_attn_with_kvcache", kernel))
        stack.enter_context(swapped(mod, "merge_state_v2_wrapper", lambda o, s_a, o_exp, s_b: (o, s_a)))
        if hasattr(mod, SWA_SPEC_KERNEL):
            stack.enter_context(swapped(mod, SWA_SPEC_KERNEL, lambda *a, **k: None))
        stack.enter_context(cpu_kernels(MODULE))
        yield


def chunked_layer(bench):
    """Layer 0 as Llama 4 builds its chunked layers: ``use_irope``, no window."""
    layer = tb.attention_layer(bench.pool, SWA_LAYER, bench.runner)
    layer.sliding_window_size, layer.use_irope = -1, True
    return layer


def run_layer(bench, batch, calls: list) -> None:
    import torch

    n_q = batch.positions.numel()
    q = torch.zeros(n_q, bench.runner.model_config.num_attention_heads, bench.runner.model_config.head_dim)
    bench.backend.forward_extend(q, None, None, chunked_layer(bench), batch, save_kv_cache=False)


def seen(call, t: int) -> list:
    """Markers of the keys query ``t`` reads in one recorded call (FA3 varlen semantics:
    causal query i of q_len sees keys [0, k_len - q_len + i] of its row; else all k_len)."""
    cu = call.cu_q.tolist()
    b = max(i for i in range(len(cu) - 1) if cu[i] <= t < cu[i + 1]) if cu[-1] > t else None
    if b is None:
        return []
    q_len, k_len = cu[b + 1] - cu[b], int(call.seqused_k[b])
    n = k_len - q_len + (t - cu[b]) + 1 if call.causal else k_len
    if n <= 0:
        return []
    k = call.k_cache
    flat = k.reshape(-1, *k.shape[2:])[:, 0, 0].float()
    per_page = k.shape[1]
    slots = [int(call.table[b][i // per_page]) * per_page + i % per_page for i in range(n)]
    if max(slots) >= flat.shape[0]:
        return [None]  # past the layer's buffer: FA3 would read out of bounds
    return [float(flat[s]) for s in slots]


def reads(bench, calls, lens=LENS):
    """Per draft token: (markers its two kernels read, in order, markers of its chunk it must
    read: the prefix from the chunk's start and its ancestors from there)."""
    out = []
    for r, p in enumerate(lens):
        m = bench.markers[r].tolist()
        for j, attends in enumerate(TREE):
            t, pos = r * len(TREE) + j, p + DEPTH[j]
            start = pos - pos % CHUNK
            want = m[start:p] + [m[p + a] for a in attends if p + DEPTH[a] >= start]
            got = [x for c in calls for x in seen(c, t)]
            out.append((sorted(got, key=lambda x: -1 if x is None else x), sorted(want)))
    return out


def eager_verify(bench, lens=LENS):
    calls: list = []
    batch = tree_batch(bench, lens)
    with recorded_kernels(calls, bench.backend):
        bench.backend.init_forward_metadata(batch)
        run_layer(bench, batch, calls)
    return calls


def graph_verify(bench, lens=LENS):
    """sglang's CUDA-graph runner steps: state, capture at lengths 1 (the chunked layer's
    forward run under it, its kernel tensors kept), then a replay of ``lens``."""
    import torch

    be, bs, n = bench.backend, len(lens), len(TREE)
    calls: list = []
    with recorded_kernels(calls, bench.backend):
        be.init_cuda_graph_state(8, 8 * n)
        cap = tree_batch(bench, [1] * bs)
        cap.out_cache_loc = torch.zeros(bs * n, dtype=torch.int64)
        capture(be, bs, cap)
        run_layer(bench, cap, calls)
        replay(be, bs, tree_batch(bench, lens))
    return calls


def scenario() -> Outcome:
    """FA3's CUDA-graph target verify with an EAGLE tree (topk 2, 4 draft tokens, chunk 32,
    page size 1) over a real SWAKVPool: does each draft token of a chunked layer read
    exactly its chunk's prefix and ancestors from the SWA pool, once. ``seen``: draft tokens
    that read other KV, of all."""
    def run():
        bench = make_bench(1, topk=2)
        return reads(bench, graph_verify(bench))

    return graph_outcome(run)


def reproduce() -> bool:
    return scenario().bug
