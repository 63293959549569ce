"""CPU scenario of ``triton_swa_draft``: a real TritonAttnBackend (EAGLE, window 7) over a real
SWAKVPool whose full and SWA index spaces differ, real draft-extend ForwardBatches for requests
whose prefixes are longer and shorter than the window, and the Triton extend kernel recorded:
which window KV indices a sliding-window layer's ``extend_attention_fwd`` call receives, eager
(DRAFT_EXTEND, where the release runs it through its own branch), at CUDA-graph capture and
at replay (DRAFT_EXTEND_V2, a second batch after the capture). Right: for each request, the
last ``min(L, window)`` keys of the rail the full layers get (``L`` keys), in SWA space
(``SWAKVPool.translate_loc_from_full_to_swa``), and the window offset ``L - min(L, window)``.
sglang's Triton gather runs as its torch twin (``flashinfer_swa_verify.KvIndicesTwin``).
``python -m sglang_swa_plugin.check.triton_swa_draft`` prints one JSON line."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import json
import sys
from types import SimpleNamespace

from . import Outcome

WINDOW = 7
PREFIXES = (20, 5, 13)  # longer than, shorter than, longer than the window
REPLAY_PREFIXES = (9, 16, 3)
NUM_STEPS, DRAFT_TOKENS = 3, 4
MODULE = "sglang.srt.layers.attention.triton_backend"


@contextlib.contextmanager
def cpu_triton(backend, calls: list):
    """The backend's extend kernel recorded (its arguments, cloned), sglang's Triton gather as
    its torch twin in the modules that launch it."""
    import torch

    from sglang_swa_plugin.probe import optional_module, swapped

    from .flashinfer_swa_verify import KvIndicesTwin, kernel_twins

    signature = inspect.signature(backend.extend_attention_fwd)  # sglang's kernel, wherever it lives

    def record(*args, **kwargs):
        a = signature.bind(*args, **kwargs).arguments
        clone = lambda t: t.clone() if isinstance(t, torch.Tensor) else t
        calls.append({k: clone(a.get(k)) for k in ("kv_indptr", "kv_indices", "window_kv_offsets",
                                                    "sliding_window_size")})

    with contextlib.ExitStack() as stack:
        stack.enter_context(swapped(backend, "extend_attention_fwd", record))
        stack.enter_context(kernel_twins())
        mod = optional_module(MODULE)
        if not torch.cuda.is_available() and hasattr(mod, "create_flashinfer_kv_indices_triton"):
            stack.enter_context(swapped(mod, "create_flashinfer_kv_indices_triton", KvIndicesTwin()))
        yield


def _no_decode_context_parallel():
    """0.5.15+ reads the decode context-parallel rank from the runtime context: one rank."""
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        return contextlib.nullcontext()
    try:
        get_parallel().attn_dcp_rank
        return contextlib.nullcontext()
    except Exception:  # noqa: BLE001 - "has not been written in this process"
        return get_parallel().override(attn_dcp_size=1, attn_dcp_rank=0)


def build():
    """Pool, runner, TritonAttnBackend (CUDA-graph state for 4 requests) and the requests'
    tokens: room for the prefixes plus two draft rounds each."""
    import torch

    from sglang_swa_plugin.probe import swapped

    from . import testbed as tb

    tri = importlib.import_module(MODULE)
    pool = tb.make_swa_pool(size=256, size_swa=128)
    alloc = tb.make_swa_allocator(pool)
    tb.diverge(alloc, 11)
    rtt = tb.make_req_to_token_pool(size=8, max_context_len=64)
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtt, spec_algorithm="EAGLE",
                                  topk=1, num_steps=NUM_STEPS, num_draft_tokens=DRAFT_TOKENS,
                                  sliding_window_size=WINDOW, attention_backend="triton")
    # What TritonAttnBackend reads off a ModelRunner beyond the testbed's fields: no hybrid
    # linear-attention config, and (0.5.23) the verify rows per request.
    for name in ("hybrid_gdn_config", "kimi_linear_config", "linear_attn_model_spec"):
        setattr(runner, name, getattr(runner, name, None))
    runner.decode_num_tokens_per_req = lambda **_: DRAFT_TOKENS
    with contextlib.ExitStack() as stack:
        stack.enter_context(tb._single_rank_parallel())
        stack.enter_context(_no_decode_context_parallel())
        if hasattr(tri, "get_attention_tp_size"):
            stack.enter_context(swapped(tri, "get_attention_tp_size", lambda: 1))
        backend = tri.TritonAttnBackend(runner)
    backend.init_cuda_graph_state(4, 4 * DRAFT_TOKENS)
    n = max(PREFIXES + REPLAY_PREFIXES) + 2 * DRAFT_TOKENS
    tokens = [tb.alloc_tokens(alloc, n) for _ in range(3)]
    rows, _ = tb.fill_requests(rtt, tokens)
    return SimpleNamespace(tb=tb, pool=pool, runner=runner, backend=backend, rows=rows, tokens=tokens,
                           swa_layer=tb.swa_layer(pool, runner), torch=torch)


def _batch(env, mode, prefixes, extend):
    """A real ForwardBatch of ``mode`` for requests holding ``prefixes`` tokens extended by
    ``extend`` each (seq_lens: prefix + extend, as sglang passes them for draft extend)."""
    torch = env.torch
    seq = [p + extend for p in prefixes]
    loc = torch.cat([t[p:p + extend] for t, p in zip(env.tokens, prefixes)])
    spec = None
    if mode == "draft_extend":
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        acc = torch.full((len(prefixes),), extend, dtype=torch.int32)
        names = {f.name for f in dataclasses.fields(EagleDraftInput)}
        if "num_accepted_tokens" in names:
            spec = EagleDraftInput(num_accepted_drafts=acc - 1, num_accepted_tokens=acc,
                                   num_accepted_drafts_cpu=(acc - 1).tolist(), num_accepted_tokens_cpu=acc.tolist())
        else:  # 0.5.10: accept_length, tokens per request
            spec = EagleDraftInput(accept_length=acc, accept_length_cpu=acc.tolist())
    return env.tb.make_forward_batch(env.runner, mode, req_pool_indices=env.rows[: len(prefixes)], seq_lens=seq,
                                     out_cache_loc=loc, extend_seq_lens=[extend] * len(prefixes), spec_info=spec,
                                     num_tokens_per_req=extend, attn_backend=env.backend)


def _run_layer(env, fb, calls: list):
    """The sliding layer's forward_extend on ``fb``: the window arguments its kernel got."""
    torch, layer = env.torch, env.swa_layer
    rows = fb.out_cache_loc.shape[0]
    q = torch.zeros(rows, layer.tp_q_head_num * layer.qk_head_dim)
    k = torch.zeros(rows, layer.tp_k_head_num, layer.qk_head_dim)
    v = torch.zeros(rows, layer.tp_v_head_num, layer.v_head_dim)
    calls.clear()
    try:
        env.backend.forward_extend(q, k, v, layer, fb, save_kv_cache=False)
    except Exception as e:  # noqa: BLE001 - e.g. 0.5.23's assert on a missing window rail
        return {"error": f"{type(e).__name__}: {e}"[:200]}
    return calls[-1] if calls else {"error": "no extend kernel call"}


def judge(env, call: dict, rail_lens: list) -> dict:
    """Per request: the window keys the kernel got against the last ``min(L, window)`` keys of
    the full rail (``rail_lens``), translated to SWA space, and the window offset."""
    if "error" in call:
        return {"right": False, "why": call["error"]}
    indptr, indices, offsets = call["kv_indptr"], call["kv_indices"], call["window_kv_offsets"]
    if indices is None or indptr is None:
        return {"right": False, "why": "window_kv_indices=None"}
    per_req = []
    for b, (row, n) in enumerate(zip(env.rows, rail_lens)):
        w = min(n, WINDOW)
        want = env.tb.translate(env.pool, env.runner.req_to_token_pool.req_to_token[row, n - w:n].long()).tolist()
        got = indices[int(indptr[b]):int(indptr[b + 1])].tolist()
        off = int(offsets[b]) if offsets is not None else None
        per_req.append(got == want and off == n - w)
    return {"right": all(per_req), "per_request": per_req}


def _full_rail_lens(md, bs) -> list:
    return (md.kv_indptr[1:bs + 1] - md.kv_indptr[:bs]).tolist()


def eager(env) -> "dict | None":
    """DRAFT_EXTEND through ``init_forward_metadata`` where the release has its own branch
    for it (None elsewhere: it runs as EXTEND, which builds its window)."""
    from sglang_swa_plugin.hooks.triton_swa_draft import _draft_extend_branches
    from sglang_swa_plugin.probe import own_function

    fn = own_function(type(env.backend), "init_forward_metadata")
    if not any("include_v2" not in ast_dump(b.test) for b in _draft_extend_branches(fn)):
        return None
    calls: list = []
    with cpu_triton(env.backend, calls):
        fb = _batch(env, "draft_extend", PREFIXES, NUM_STEPS + 1)
        env.backend.init_forward_metadata(fb)
        call = _run_layer(env, fb, calls)
        return judge(env, call, _full_rail_lens(env.backend.forward_metadata, len(PREFIXES)))


def ast_dump(node) -> str:
    import ast

    return ast.dump(node)


def graph(env) -> dict:
    """DRAFT_EXTEND_V2 captured on one batch, replayed on another; the sliding layer runs on
    the captured metadata both times (as the graph does)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    be, mode, bs = env.backend, ForwardMode.DRAFT_EXTEND_V2, len(PREFIXES)
    calls: list = []
    out = {}
    with cpu_triton(be, calls):
        for phase, prefixes in (("capture", PREFIXES), ("replay", REPLAY_PREFIXES)):
            fb = _batch(env, "draft_extend_v2", prefixes, DRAFT_TOKENS)
            spec = SimpleNamespace(extend_seq_lens_tensor=fb.extend_seq_lens, custom_mask=None)
            fb.spec_info = spec
            if hasattr(be, "init_forward_metadata_out_graph"):  # 0.5.13+
                be.init_forward_metadata_out_graph(fb, **({"in_capture": True} if phase == "capture" else {}))
            elif phase == "capture":
                be.init_forward_metadata_capture_cuda_graph(bs, bs * DRAFT_TOKENS, fb.req_pool_indices, fb.seq_lens,
                                                             None, mode, spec)
            else:
                be.init_forward_metadata_replay_cuda_graph(bs, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_sum,
                                                            None, mode, spec, fb.seq_lens_cpu)
            if phase == "capture":
                captured = be.forward_metadata
            be.forward_metadata = captured
            call = _run_layer(env, fb, calls)
            out[phase] = judge(env, call, _full_rail_lens(captured, bs))
    return out


def scenario() -> Outcome:
    """The window KV indices a sliding-window layer's Triton extend kernel receives in draft
    extend, eager and in CUDA-graph capture and replay, against the last window keys of the
    full rail in SWA space, on a real TritonAttnBackend over a real SWAKVPool whose index
    spaces differ. ``seen``: per path, right or not (None: the release has no such path)."""
    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.probe import optional_module

    if optional_module(MODULE) is None:
        raise ScenarioUnavailable(f"no Triton attention backend: {MODULE}")
    env = build()
    seen = {"eager": eager(env), **graph(env)}
    return Outcome(any(v is not None and not v["right"] for v in seen.values()), seen)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    out = scenario()
    json.dump({"bug": out.bug, "seen": out.seen}, sys.stdout, default=str)
    print()
