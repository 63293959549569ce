"""CPU scenario of ``triton_local_attn``: a real TritonAttnBackend for Llama 4 (chunk 8, the
runner's window set to it as ModelRunner does) over a real SWAKVPool whose full and SWA index
spaces differ, a chunked layer (``use_irope``, no window) in the SWA part, and the Triton
kernels recorded: which keys each query of an extend (requests crossing a chunk boundary), of a
chain's target verify (topk 1) and of a decode batch (eager, at CUDA-graph capture and at replay of a second batch) attends.
Right: a query at position ``p`` attends its own request's keys ``p // 8 * 8 .. p`` (its
chunk), read from the cache in SWA space. sglang's Triton gather runs as its torch twin.
``python -m sglang_swa_plugin.check.triton_local_attn`` prints one JSON line."""

from __future__ import annotations

from types import SimpleNamespace

from . import Outcome, print_outcome
from .triton_bench import MODULE, cpu_triton, decode_graph_metadata, triton_backend

CHUNK = 8
PREFIXES, EXTENDS = (13, 0, 5), (10, 7, 3)  # 13..22 crosses 16; 0..6 and 5..7 stay in one chunk
DECODE_LENS = (21, 6, 16, 17)  # keys from 16, 0, 8, 16
VERIFY_LENS, DRAFTS = (14, 6, 3), 4  # a chain's drafts at 14..17 and 6..9 cross a boundary, 3..6 does not
REPLAY_LENS = (9, 24, 3)


def build(drafts: int = DRAFTS) -> SimpleNamespace:
    """Pool, Llama 4 runner (EAGLE3, ``drafts`` draft tokens), backend (CUDA-graph state for 4
    requests), requests of 24 tokens, and the chunked layer."""
    from . import testbed as tb

    pool = tb.make_swa_pool(size=512, size_swa=256)
    alloc = tb.make_swa_allocator(pool)
    tb.diverge(alloc, 11)
    rtt = tb.make_req_to_token_pool(size=8, max_context_len=64)
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtt, model="llama4",
                                  attention_backend="triton", spec_algorithm="EAGLE3", topk=1,
                                  num_steps=drafts - 1, num_draft_tokens=drafts)
    runner.attention_chunk_size = runner.sliding_window_size = CHUNK  # as ModelRunner sets them for Llama 4
    backend = triton_backend(runner, drafts)
    backend.init_cuda_graph_state(4, 4 * drafts)
    tokens = [tb.alloc_tokens(alloc, 24) for _ in range(4)]
    rows, _ = tb.fill_requests(rtt, tokens)
    layer = tb.swa_layer(pool, runner)
    layer.sliding_window_size, layer.use_irope = -1, True  # as Llama 4 builds its chunked layers
    return SimpleNamespace(tb=tb, pool=pool, runner=runner, backend=backend, rows=rows, layer=layer)


def _slot_of(env, b: int) -> dict:
    """Request ``b``'s SWA slot -> position."""
    row = env.runner.req_to_token_pool.req_to_token[int(env.rows[b])].long()
    return {int(s): p for p, s in enumerate(env.tb.translate(env.pool, row).tolist())}


def _judge(reads: dict) -> dict:
    """``reads``: (request, position) -> the (request, position) keys it attends."""
    wrong = [f"{b}@{p}" for (b, p), keys in reads.items()
             if keys != {(b, k) for k in range(p // CHUNK * CHUNK, p + 1)}]
    return {"right": bool(reads) and not wrong, "wrong_queries": wrong[:6], "queries": len(reads)}


def _run(env, fb, call_kind: str, calls: list) -> "dict | None":
    import torch

    layer, rows = env.layer, fb.out_cache_loc.shape[0]
    q = torch.zeros(rows, layer.tp_q_head_num * layer.qk_head_dim)
    k = torch.zeros(rows, layer.tp_k_head_num, layer.qk_head_dim)
    v = torch.zeros(rows, layer.tp_v_head_num, layer.v_head_dim)
    calls.clear()
    getattr(env.backend, f"forward_{call_kind}")(q, k, v, layer, fb, save_kv_cache=False)
    return calls[-1] if calls else None


def extend_reads(env, call: dict, prefixes=PREFIXES, extends=EXTENDS) -> dict:
    """Per query of the extend: its cache keys (the kernel's prefix of the query's row of
    ``qo_indptr``, SWA slots) and its causal keys among the new tokens of that row (a call
    with a custom mask or not causal is judged wrong: the fix's calls are causal)."""
    if call.get("custom_mask") is not None or call.get("is_causal") is False:
        return {}
    position = [(b, p + i) for b, (p, e) in enumerate(zip(prefixes, extends)) for i in range(e)]
    qo, indptr, indices = (call[n].tolist() for n in ("qo_indptr", "kv_indptr", "kv_indices"))
    reads = {}
    for j in range(len(qo) - 1):
        if qo[j] == qo[j + 1]:  # a virtual request without queries (a chain inside one chunk)
            continue
        b = position[qo[j]][0]
        slots = _slot_of(env, b)
        cached = {(b, slots.get(s, -1 - s)) for s in indices[indptr[j]:indptr[j + 1]]}
        for r in range(qo[j], qo[j + 1]):
            reads[position[r]] = cached | {position[i] for i in range(qo[j], r + 1)}
    return reads


def decode_reads(env, call: dict, lens) -> dict:
    indptr, indices = call["kv_indptr"].tolist(), call["kv_indices"].tolist()
    reads = {}
    for b, n in enumerate(lens):
        slots = _slot_of(env, b)
        reads[(b, n - 1)] = {(b, slots.get(s, -1 - s)) for s in indices[indptr[b]:indptr[b + 1]]}
    return reads


def _chain(seq_lens):
    """A real ``EagleVerifyInput`` of a chain (topk 1) of ``DRAFTS`` tokens per request."""
    import torch

    from .fa3_spec_translate import verify_input

    mask = torch.cat([torch.ones(DRAFTS, n + DRAFTS, dtype=torch.bool).tril(n).flatten() for n in seq_lens])
    positions = torch.cat([torch.arange(n, n + DRAFTS) for n in seq_lens])
    return verify_input(mask, list(seq_lens), 1, DRAFTS, positions)


def scenario() -> Outcome:
    """The keys a Llama 4 chunked layer's Triton kernels attend, extend and decode (eager, CUDA-graph
    capture and replay), against each query's own chunk, on a real TritonAttnBackend over a real
    SWAKVPool whose index spaces differ. ``seen``: per path, right or not."""
    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.probe import optional_module

    if optional_module(MODULE) is None:
        raise ScenarioUnavailable(f"no Triton attention backend: {MODULE}")
    env, calls, seen = build(), [], {}
    be, tb = env.backend, env.tb
    with cpu_triton(be, calls):
        fb = tb.make_forward_batch(env.runner, "extend", req_pool_indices=env.rows[:3],
                                   seq_lens=[p + e for p, e in zip(PREFIXES, EXTENDS)],
                                   extend_seq_lens=list(EXTENDS), attn_backend=be)
        be.init_forward_metadata(fb)
        call = _run(env, fb, "extend", calls)
        seen["extend"] = _judge(extend_reads(env, call)) if call else {"right": False, "why": "no kernel call"}
        fb = tb.make_forward_batch(env.runner, "target_verify", req_pool_indices=env.rows[:3], seq_lens=list(VERIFY_LENS),
                                   spec_info=_chain(VERIFY_LENS), attn_backend=be)
        be.init_forward_metadata(fb)
        call = _run(env, fb, "extend", calls)
        seen["verify"] = (_judge(extend_reads(env, call, VERIFY_LENS, [DRAFTS] * 3)) if call
                          else {"right": False, "why": "no kernel call"})
        fb = tb.make_forward_batch(env.runner, "decode", req_pool_indices=env.rows, seq_lens=list(DECODE_LENS),
                                   attn_backend=be)
        be.init_forward_metadata(fb)
        call = _run(env, fb, "decode", calls)
        seen["decode"] = _judge(decode_reads(env, call, DECODE_LENS)) if call else {"right": False}
        captured = None
        for phase, lens in (("capture", DECODE_LENS), ("replay", REPLAY_LENS)):
            fb = tb.make_forward_batch(env.runner, "decode", req_pool_indices=env.rows[: len(lens)],
                                       seq_lens=list(lens), attn_backend=be)
            decode_graph_metadata(be, fb, phase)
            captured = be.forward_metadata if phase == "capture" else captured
            be.forward_metadata = captured
            call = _run(env, fb, "decode", calls)
            seen[phase] = _judge(decode_reads(env, call, lens)) if call else {"right": False}
    return Outcome(not all(v["right"] for v in seen.values()), seen)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
