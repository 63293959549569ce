"""CPU scenario of ``trtllm_local_attn``: a real trtllm_mha backend for Llama 4 (chunk 8, the
runner's window set to it as ModelRunner does), built as on XQA hardware (Hopper) and as on
Blackwell, over a real SWAKVPool whose full and SWA index spaces differ, a chunked layer
(``use_irope``, no window) in the SWA part, and the flashinfer kernels recorded: which keys each
query of a decode batch, of a chain's target verify (topk 1) and of an extend (requests crossing
a chunk boundary) attends, as the kernels read their arguments (page-table rows, ``seq_lens``,
``q_len_per_req``, ``window_left``, the context kernel's query offsets). Right: a query at
position ``p`` attends its own request's keys ``p // 8 * 8 .. p`` (its chunk), in SWA space.
``python -m sglang_swa_plugin.check.trtllm_local_attn`` prints one JSON line."""

from __future__ import annotations

from types import SimpleNamespace

from ..probe import optional_module, swapped
from ..trtllm_mha import MODULE
from . import Outcome, print_outcome
from .kernels import cpu_kernels, kernel_recorders
from .trtllm_xqa_spec_decode import as_xqa_hardware

CHUNK = 8
DECODE_LENS = (21, 6, 16, 17)  # keys after this step: from 16, 0, 8, 16
VERIFY_LENS, DRAFTS = (14, 6, 3), 4  # drafts at 14..17 and 6..9 cross a boundary, 3..6 does not
PREFIXES, EXTENDS = (13, 0, 5), (10, 7, 3)  # 13..22 crosses 16; 0..6 and 5..7 stay in one chunk


def build(xqa: bool = True) -> SimpleNamespace:
    """Pool, Llama 4 runner (EAGLE3, topk 1, ``DRAFTS`` draft tokens), backend, four requests of
    24 tokens, and the chunked layer."""
    from . import testbed as tb

    pool = tb.make_swa_pool(size=512, size_swa=256)
    alloc = tb.make_swa_allocator(pool)
    tb.diverge(alloc, 11)
    rtt = tb.make_req_to_token_pool(size=8, max_context_len=64)
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtt, model="llama4",
                                  spec_algorithm="EAGLE3", topk=1, num_steps=DRAFTS - 1, num_draft_tokens=DRAFTS)
    runner.attention_chunk_size = runner.sliding_window_size = CHUNK  # as ModelRunner sets them for Llama 4
    with as_xqa_hardware(xqa):
        backend = tb.build_trtllm_backend(runner)
    tokens = [tb.alloc_tokens(alloc, 24) for _ in range(4)]
    rows, _ = tb.fill_requests(rtt, tokens)
    layer = tb.swa_layer(pool, runner)
    layer.sliding_window_size, layer.use_irope = -1, True  # as Llama 4 builds its chunked layers
    slot = {}  # SWA slot -> (request, position)
    for b, t in enumerate(tokens):
        slot.update({int(s): (b, p) for p, s in enumerate(tb.translate(pool, t).tolist())})
    return SimpleNamespace(tb=tb, pool=pool, runner=runner, backend=backend, rows=rows, tokens=tokens,
                           layer=layer, slot=slot)


def call_reads(call, queries, page: int, slot: dict) -> dict:
    """Per query ((request, position), in the order of the query rows), the keys the recorded
    kernel call attends: a decode call's row ``r`` of ``q_len_per_req`` ``n`` reads the first
    ``seq_lens[r // n] - n + r % n + 1`` keys of its page-table row (causal), a context call's
    query ``i`` of virtual request ``j`` the first ``seq_lens[j] - q_j + i + 1``; both the last
    ``window_left + 1`` of those where ``window_left >= 0``."""
    if call.kernel == "decode":
        n = call.q_len_per_req or 1
        spans = [(r // n, call.seq_lens[r // n] - n + r % n + 1) for r in range(len(queries))]
    else:
        cu = call.cu_seqlens_q
        spans = [(j, call.seq_lens[j] - (cu[j + 1] - cu[j]) + (r - cu[j]) + 1)
                 for j in range(len(cu) - 1) for r in range(cu[j], cu[j + 1])]
    window = call.window_left if call.window_left is not None and call.window_left >= 0 else None
    reads = {}
    for (row, keys), query in zip(spans, queries):
        first = 0 if window is None else max(0, keys - 1 - window)
        reads[query] = {slot.get(int(call.page_table[row, k // page]) * page + k % page, ("?", k))
                        for k in range(first, keys)}
    return reads


def judge(reads: dict, queries) -> dict:
    wrong = [f"{b}@{p}" for b, p in queries
             if reads.get((b, p)) != {(b, k) for k in range(p // CHUNK * CHUNK, p + 1)}]
    return {"right": bool(reads) and not wrong, "wrong_queries": wrong[:6], "queries": len(queries)}


def _step(env, mode: str, lens, method: str, queries, **batch) -> dict:
    """One forward of the chunked layer (``method``), its kernel call judged."""
    import torch

    be, layer, calls = env.backend, env.layer, []
    fb = env.tb.make_forward_batch(env.runner, mode, req_pool_indices=env.rows[: len(lens)], seq_lens=list(lens),
                                   attn_backend=be, **batch)
    q = torch.zeros(len(queries), layer.tp_q_head_num * layer.head_dim, dtype=torch.bfloat16)
    with swapped(optional_module(MODULE), "flashinfer", kernel_recorders(calls, [layer.layer_id])), cpu_kernels():
        be.init_forward_metadata(fb)
        getattr(be, method)(q, None, None, layer, fb, save_kv_cache=False)
    if len(calls) != 1:
        return {"right": False, "why": f"{len(calls)} kernel calls"}
    return {**judge(call_reads(calls[0], queries, be.page_size, env.slot), queries), "kernel": calls[0].kernel}


def scenario() -> Outcome:
    """The keys a Llama 4 chunked layer's trtllm_mha kernels attend (decode, a chain's verify,
    an extend), against each query's own chunk, on a real TRTLLMHAAttnBackend (as on Hopper's XQA
    and as on Blackwell) over a real SWAKVPool whose index spaces differ. ``seen``: per hardware
    and path, right or not (the extend not judged where the fix is in and its prefill preview off)."""
    from sglang_swa_plugin.fix import ScenarioUnavailable

    from sglang_swa_plugin.hooks.trtllm_local_attn import FIX, PREFILL
    from sglang_swa_plugin.patching import target_marks

    if optional_module(MODULE) is None:
        raise ScenarioUnavailable(f"no trtllm_mha backend: {MODULE}")
    installed = any(FIX.name in target_marks(t) for t in FIX.targets)
    prefill = PREFILL in FIX.previews_on
    seen = {}
    for hw, xqa in (("xqa", True), ("blackwell", False)):
        env = build(xqa)
        seen[f"{hw}_decode"] = _step(env, "decode", DECODE_LENS, "forward_decode",
                                     [(b, n - 1) for b, n in enumerate(DECODE_LENS)])
        seen[f"{hw}_verify"] = _step(env, "target_verify", VERIFY_LENS, "forward_extend",
                                     [(b, n + i) for b, n in enumerate(VERIFY_LENS) for i in range(DRAFTS)])
        seen[f"{hw}_extend"] = _step(env, "extend", [p + e for p, e in zip(PREFIXES, EXTENDS)], "forward_extend",
                                     [(b, p + i) for b, (p, e) in enumerate(zip(PREFIXES, EXTENDS)) for i in range(e)],
                                     extend_seq_lens=list(EXTENDS))
        if installed and not prefill:  # the fix's prefill is a preview, off: not judged
            seen[f"{hw}_extend"] = {"right": None, "why": f"preview {PREFILL} off", "was": seen[f"{hw}_extend"]["right"]}
    return Outcome(not all(v["right"] for v in seen.values() if v["right"] is not None), seen)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
