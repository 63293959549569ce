"""The CPU bench the Triton scenarios share: a real ``TritonAttnBackend`` built on one rank
(``make_backend``, ``triton_backend``), the testbed's EAGLE runner over a real SWAKVPool whose full
and SWA index spaces differ, window 7 (``build``), and the backend's kernels recorded on the
CPU (``cpu_triton``: the extend and decode kernels' arguments; sglang's Triton gathers as their
torch twins). ``decode_graph_metadata`` drives a plain decode through the backend's CUDA-graph metadata,
``layer_call`` a batch through a sliding layer."""

from __future__ import annotations

import contextlib
import importlib
import inspect
from types import SimpleNamespace

MODULE = "sglang.srt.layers.attention.triton_backend"
WINDOW = 7
NUM_STEPS, DRAFT_TOKENS = 3, 4
REQUEST_TOKENS = 28  # per request: a prefix of up to 20 keys and two rounds of drafts


@contextlib.contextmanager
def cpu_triton(backend, calls: list):
    """The backend's extend and decode kernels recorded into ``calls`` (their arguments, cloned),
    sglang's Triton gathers as their torch twins in the modules that launch them."""
    import torch

    from sglang_swa_plugin.probe import optional_module, swapped
    from sglang_swa_plugin.triton_rail import GATHER, GATHER_MODULES

    from .flashinfer_swa_verify import KvIndicesTwin, kernel_twins

    signature = inspect.signature(backend.extend_attention_fwd)  # sglang's kernel, wherever it lives

    def record(*args, **kwargs):
        a = signature.bind(*args, **kwargs).arguments
        clone = lambda t: t.clone() if isinstance(t, torch.Tensor) else t
        calls.append({k: clone(a.get(k)) for k in ("kv_indptr", "kv_indices", "window_kv_offsets",
                                                    "sliding_window_size", "qo_indptr", "max_len_extend",
                                                    "custom_mask", "mask_indptr", "is_causal",
                                                    "skip_prefix_custom_mask")})

    decode_signature = inspect.signature(backend.decode_attention_fwd)

    def record_decode(*args, **kwargs):
        a = decode_signature.bind(*args, **kwargs).arguments
        calls.append({"kv_indptr": a["kv_indptr"].clone(),
                      "kv_indices": a["kv_indices"].clone() if a["kv_indices"] is not None else None,
                      "window_kv_offsets": None, "sliding_window_size": None})

    with contextlib.ExitStack() as stack:
        stack.enter_context(swapped(backend, "extend_attention_fwd", record))
        stack.enter_context(swapped(backend, "decode_attention_fwd", record_decode))
        stack.enter_context(kernel_twins())
        mod = optional_module(MODULE)
        # sglang's gather wherever a release keeps it: the triton module's name (sglang's own rails)
        # and the kernel modules the fixes' rails take it from
        for gather in dict.fromkeys(optional_module(m) for m in GATHER_MODULES):
            if not torch.cuda.is_available() and hasattr(gather, GATHER):
                stack.enter_context(swapped(gather, GATHER, KvIndicesTwin()))
        if not torch.cuda.is_available() and hasattr(mod, "generate_draft_decode_kv_indices"):
            stack.enter_context(swapped(mod, "generate_draft_decode_kv_indices", DraftDecodeTwin()))
        yield


class DraftDecodeTwin:
    """``generate_draft_decode_kv_indices[grid](...)`` of 0.5.10-0.5.22 in torch (CPU only), for
    topk 1 at page size 1, reading ``req_to_token`` rows as they are (0.5.22 hands it the KV
    index translator's source: that passthrough here, no ``v2p``): step ``s`` (``s + 1`` draft
    tokens) of request ``b`` reads ``req_to_token[row, :seq_len + s + 1]``, packed from
    ``seq_lens``; ``kv_indptr[s]``, as the kernel does, from ``positions``
    (``sum(positions[:b]) + b * (s + 1)``): the two agree where positions are the draft tokens'
    (``seq_lens``), not on a CUDA-graph capture whose position buffer the warm-up runs of a
    larger batch advanced."""

    def __getitem__(self, grid):
        steps, num_seqs, topk = (int(g) for g in grid)
        assert topk == 1, "the twin covers topk 1"

        def run(req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, positions, pool_len,
                kv_indices_stride, kv_indptr_stride, *rest, ENTRY_PAGE_SIZE=1, v2p=None, **_):
            assert ENTRY_PAGE_SIZE == 1 and v2p is None, "the twin reads req_to_token rows as they are"
            for s in range(steps):
                off = 0
                kv_indptr[s, 0] = 0
                for b in range(num_seqs):
                    n = int(seq_lens[b]) + s + 1
                    kv_indices[s, off:off + n] = req_to_token[int(req_pool_indices[b]), :n].to(kv_indices.dtype)
                    off += n
                    kv_indptr[s, b + 1] = int(positions[: b + 1].sum()) + (b + 1) * (s + 1)
        return run


def decode_graph_metadata(backend, fb, phase: str) -> None:
    """sglang's CUDA-graph metadata call of a plain DECODE batch ``fb`` at ``phase`` ("capture" or
    "replay"), in the release's form (0.5.13+: ``init_forward_metadata_out_graph``)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    bs = fb.batch_size
    if hasattr(backend, "init_forward_metadata_out_graph"):
        backend.init_forward_metadata_out_graph(fb, **({"in_capture": True} if phase == "capture" else {}))
    elif phase == "capture":
        backend.init_forward_metadata_capture_cuda_graph(bs, bs, fb.req_pool_indices, fb.seq_lens, None,
                                                         ForwardMode.DECODE, None)
    else:
        backend.init_forward_metadata_replay_cuda_graph(bs, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_sum, None,
                                                        ForwardMode.DECODE, None, fb.seq_lens_cpu)


def no_decode_context_parallel():
    """0.5.15+ reads the decode context-parallel rank from the runtime context: one rank."""
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        return contextlib.nullcontext()
    try:
        get_parallel().attn_dcp_rank
        return contextlib.nullcontext()
    except AttributeError:  # a release without decode context parallelism
        return contextlib.nullcontext()
    except Exception:  # noqa: BLE001 - "has not been written in this process"
        return get_parallel().override(attn_dcp_size=1, attn_dcp_rank=0)


@contextlib.contextmanager
def single_rank():
    """What the Triton backends read of the parallel state at construction, as one rank (the
    testbed's, decode context parallelism off, the attention TP size the module binds: the
    testbed's ``attn_tp()``); yields the backend module."""
    import torch

    from sglang_swa_plugin.probe import swapped

    from . import testbed as tb

    tri = importlib.import_module(MODULE)
    with contextlib.ExitStack() as stack:
        stack.enter_context(tb._single_rank_parallel())
        stack.enter_context(no_decode_context_parallel())
        if hasattr(tri, "get_attention_tp_size"):
            stack.enter_context(swapped(tri, "get_attention_tp_size", tb.attn_tp))
        if hasattr(tri, "is_arch_support_pdl") and not torch.cuda.is_available():  # a device query (some main builds)
            stack.enter_context(swapped(tri, "is_arch_support_pdl", lambda: False))
        yield tri


def make_backend(runner, cls: str = "TritonAttnBackend", *args):
    """``TritonAttnBackend(runner)`` (or another class of the module, e.g.
    ``TritonMultiStepDraftBackend(runner, topk, steps)``) on one rank, looked up on its module at
    call time (hooks included)."""
    with single_rank() as tri:
        return getattr(tri, cls)(runner, *args)


def triton_backend(runner, tokens_per_req: int = 1):
    """A real ``TritonAttnBackend`` of the testbed's ``runner`` on one rank."""
    # What TritonAttnBackend reads off a ModelRunner beyond the testbed's fields: no hybrid
    # linear-attention config, and (0.5.23) the verify rows per request.
    for name in ("hybrid_gdn_config", "kimi_linear_config", "linear_attn_model_spec"):
        setattr(runner, name, getattr(runner, name, None))
    runner.decode_num_tokens_per_req = lambda **_: tokens_per_req
    return make_backend(runner)


def build():
    """Pool, runner, TritonAttnBackend (CUDA-graph state for 4 requests) and three requests'
    tokens (``REQUEST_TOKENS`` each)."""
    import torch

    from . import testbed as tb

    pool = tb.make_swa_pool(size=256, size_swa=128)
    alloc = tb.make_swa_allocator(pool)
    tb.diverge(alloc, 11)
    rtt = tb.make_req_to_token_pool(size=8, max_context_len=64)
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtt, spec_algorithm="EAGLE",
                                  topk=1, num_steps=NUM_STEPS, num_draft_tokens=DRAFT_TOKENS,
                                  sliding_window_size=WINDOW, attention_backend="triton")
    be = triton_backend(runner, DRAFT_TOKENS)
    be.init_cuda_graph_state(4, 4 * DRAFT_TOKENS)
    tokens = [tb.alloc_tokens(alloc, REQUEST_TOKENS) for _ in range(3)]
    rows, _ = tb.fill_requests(rtt, tokens)
    return SimpleNamespace(tb=tb, pool=pool, runner=runner, backend=be, rows=rows, tokens=tokens,
                           swa_layer=tb.swa_layer(pool, runner), torch=torch)


def layer_call(env, backend, fb, calls: list, mode: str = "decode"):
    """The sliding layer's ``forward_decode`` (``mode`` "extend": ``forward_extend``) on ``backend``
    over ``fb``: the arguments its kernel got, as ``cpu_triton`` records them into ``calls``
    (``{"error": ...}`` where the call raised or reached no kernel)."""
    torch, layer = env.torch, env.swa_layer
    rows = fb.out_cache_loc.shape[0] if mode == "extend" else fb.batch_size
    q = torch.zeros(rows, layer.tp_q_head_num * layer.qk_head_dim)
    k = torch.zeros(rows, layer.tp_k_head_num, layer.qk_head_dim)
    v = torch.zeros(rows, layer.tp_v_head_num, layer.v_head_dim)
    calls.clear()
    try:
        getattr(backend, f"forward_{mode}")(q, k, v, layer, fb, save_kv_cache=False)
    except Exception as e:  # noqa: BLE001 - e.g. 0.5.23's assert on a missing window rail
        return {"error": f"{type(e).__name__}: {e}"[:200]}
    return calls[-1] if calls else {"error": f"no {mode} kernel call"}
