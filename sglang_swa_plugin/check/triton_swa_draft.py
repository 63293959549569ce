"""CPU scenario of ``triton_swa_draft``: a real TritonAttnBackend (EAGLE, window 7) over a real
SWAKVPool whose full and SWA index spaces differ, real draft-extend ForwardBatches for requests
whose prefixes are longer and shorter than the window, and the Triton extend kernel recorded:
which window KV indices a sliding-window layer's ``extend_attention_fwd`` call receives, eager
(DRAFT_EXTEND, where the release runs it through its own branch), at CUDA-graph capture and
at replay (DRAFT_EXTEND_V2, a second batch after the capture), and the multi-step draft decode
(eager, capture, replay). Right: for each request, the last ``min(P, window)`` of its ``P``
keys before the tokens being extended (decode step ``s``: the prefix and ``s + 1`` draft
tokens), in SWA space (``SWAKVPool.translate_loc_from_full_to_swa``), and (extend) the window
offset ``P - min(P, window)``.
sglang's Triton gather runs as its torch twin (``flashinfer_swa_verify.KvIndicesTwin``).
``python -m sglang_swa_plugin.check.triton_swa_draft`` prints one JSON line."""

from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace

from . import Outcome, print_outcome
from .triton_bench import (DRAFT_TOKENS, MODULE, NUM_STEPS, REQUEST_TOKENS, WINDOW, build, cpu_triton, layer_call,
                           make_backend)

PREFIXES = (20, 5, 13)  # longer than, shorter than, longer than the window
REPLAY_PREFIXES = (9, 16, 3)
assert max(PREFIXES + REPLAY_PREFIXES) + 2 * DRAFT_TOKENS <= REQUEST_TOKENS  # two draft rounds fit


def _batch(env, mode, prefixes, extend):
    """A real ForwardBatch of ``mode`` for requests holding ``prefixes`` tokens extended by
    ``extend`` each (seq_lens: prefix + extend, as sglang passes them for draft extend)."""
    torch = env.torch
    seq = [p + extend for p in prefixes]
    loc = torch.cat([t[p:p + extend] for t, p in zip(env.tokens, prefixes)])
    spec = None
    if mode == "draft_extend":
        import sglang.srt.speculative.eagle_info as eagle_info

        # The draft-extend input (its own class from 0.5.12, EagleDraftInput before).
        draft_input = next(c for c in (getattr(eagle_info, "EagleDraftExtendInput", None), eagle_info.EagleDraftInput)
                               if c is not None and hasattr(c, "generate_attn_arg_prefill"))
        acc = torch.full((len(prefixes),), extend, dtype=torch.int32)
        # The accepted-token fields as each release names them (tokens per request incl. the
        # bonus token; drafts: one less).
        names = {f.name for f in dataclasses.fields(draft_input)}
        values = {"num_accepted_tokens": acc, "num_accept_tokens": acc, "accept_length": acc,
                  "num_accepted_drafts": acc - 1, "num_correct_drafts": acc - 1}
        fields = {k: v for k, v in values.items() if k in names}
        fields.update({k + "_cpu": v.tolist() for k, v in list(fields.items()) if k + "_cpu" in names})
        spec = draft_input(**fields)
    return env.tb.make_forward_batch(env.runner, mode, req_pool_indices=env.rows[: len(prefixes)], seq_lens=seq,
                                     out_cache_loc=loc, extend_seq_lens=[extend] * len(prefixes), spec_info=spec,
                                     num_tokens_per_req=extend, attn_backend=env.backend)


def judge(env, call: dict, rail_lens: list, offsets: bool = True, window: int = WINDOW) -> dict:
    """Per request: the window keys the kernel got against the last ``min(L, window)`` keys of
    the full rail (``rail_lens``), translated to SWA space, and (extend) the window offset."""
    if "error" in call:
        return {"right": False, "why": call["error"]}
    indptr, indices, offsets = call["kv_indptr"], call["kv_indices"], call["window_kv_offsets"]
    if indices is None or indptr is None:
        return {"right": False, "why": "window_kv_indices=None"}
    per_req = []
    for b, (row, n) in enumerate(zip(env.rows, rail_lens)):
        w = min(n, window)
        want = env.tb.translate(env.pool, env.runner.req_to_token_pool.req_to_token[row, n - w:n].long()).tolist()
        got = indices[int(indptr[b]):int(indptr[b + 1])].tolist()
        off = int(offsets[b]) if offsets is not None else None
        per_req.append(got == want and (off == n - w or not offsets))
    return {"right": all(per_req), "per_request": per_req}


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
        call = layer_call(env, env.backend, fb, calls, "extend")
        return judge(env, call, list(PREFIXES))


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
            call = layer_call(env, env.backend, fb, calls, "extend")
            out[phase] = judge(env, call, list(prefixes))
    return out


def _judge_steps(env, steps: list, prefixes) -> dict:
    """Per draft step ``s``: the window the kernel got against the last ``min(L, keys)`` keys of
    ``L = prefix + s + 1`` (the committed prefix and the step's draft tokens), SWA space; ``keys``:
    as many as the target's decode keeps in this process (``decode_keys``: one more where
    ``triton_swa_window`` is installed)."""
    from sglang_swa_plugin.hooks.triton_swa_draft import decode_keys

    keys = decode_keys(WINDOW)
    per_step = [judge(env, call, [p + s + 1 for p in prefixes], offsets=False, window=keys)
                for s, call in enumerate(steps)]
    return {"right": all(x["right"] for x in per_step), "steps": per_step}


def _decode_batch(env, multi, prefixes, advance: int = 0):
    """A multi-step draft-decode batch; positions are the draft tokens' (``seq_lens``), as
    sglang's draft decode has them, or ``advance`` past them."""
    fb = env.tb.make_forward_batch(env.runner, "draft_decode", req_pool_indices=env.rows[: len(prefixes)],
                                   seq_lens=list(prefixes), attn_backend=multi)
    fb.positions = fb.seq_lens.clone() + advance
    return fb


def _multi(env):
    return make_backend(env.runner, "TritonMultiStepDraftBackend", 1, NUM_STEPS)


def draft_metadata(multi, fb, phase: str) -> None:
    """Every draft step's metadata on the multi-step backend ``multi``, as sglang builds it in
    ``phase``: "eager", "capture" (CUDA-graph capture) or "replay" (of batch ``fb``)."""
    if phase == "eager":
        multi.init_forward_metadata(fb)
    elif hasattr(multi, "init_forward_metadata_out_graph"):  # 0.5.13+
        multi.init_forward_metadata_out_graph(fb, **({"in_capture": True} if phase == "capture" else {}))
    elif phase == "capture":
        multi.init_forward_metadata_capture_cuda_graph(fb)
    else:
        multi.init_forward_metadata_replay_cuda_graph(fb, fb.batch_size)


def stale_capture(env, advance: int = 4) -> dict:
    """Multi-step draft-decode CUDA-graph capture of a smaller batch after a larger one: the
    warm-up runs of the larger capture advanced the shared position buffer (each draft step
    adds one), so sglang's rail kernel writes a ``kv_indptr`` longer than the ``kv_indices``
    slice it hands each step. ``error``: what the window build raised (an index out of range:
    a device-side assert on a GPU); else the window indices the steps got."""
    multi = _multi(env)
    multi.init_cuda_graph_state(4, 4)
    calls = []
    with contextlib.ExitStack() as stack:
        for be in multi.attn_backends:
            stack.enter_context(cpu_triton(be, calls))
        fb = _decode_batch(env, multi, PREFIXES[:2], advance)
        try:
            draft_metadata(multi, fb, "capture")
        except (IndexError, RuntimeError) as e:
            return {"error": f"{type(e).__name__}: {e}"[:200]}
    return {"windows": [be.forward_metadata.window_kv_indices for be in multi.attn_backends]}


def multi_step(env) -> dict:
    """Multi-step draft decode (TritonMultiStepDraftBackend, topk 1, 3 steps): eager, at
    CUDA-graph capture and at replay of a second batch on the captured metadata."""
    from sglang_swa_plugin.probe import optional_module

    from sglang_swa_plugin.hooks.triton_swa_draft import probe

    multi_cls = getattr(optional_module(MODULE), "TritonMultiStepDraftBackend", None)
    if multi_cls is None or probe(env.backend.__class__).get("decode"):
        return {}  # no multi-step backend, or it builds its window rail itself (0.5.23+: no CPU twin here)
    multi = _multi(env)
    out, calls = {}, []
    with contextlib.ExitStack() as stack:
        for be in multi.attn_backends:
            stack.enter_context(cpu_triton(be, calls))
        fb = _decode_batch(env, multi, PREFIXES)
        draft_metadata(multi, fb, "eager")
        out["decode_eager"] = _judge_steps(env, [layer_call(env, be, fb, calls) for be in multi.attn_backends],
                                           PREFIXES)
        multi.init_cuda_graph_state(4, 4)
        captured = []
        for phase, prefixes in (("decode_capture", PREFIXES), ("decode_replay", REPLAY_PREFIXES)):
            fb = _decode_batch(env, multi, prefixes)
            draft_metadata(multi, fb, phase.removeprefix("decode_"))
            if phase == "decode_capture":
                captured = [be.forward_metadata for be in multi.attn_backends]
            steps = []
            for be, md in zip(multi.attn_backends, captured):
                be.forward_metadata = md
                steps.append(layer_call(env, be, fb, calls))
            out[phase] = _judge_steps(env, steps, prefixes)
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
    seen = {"eager": eager(env), **graph(env), **multi_step(env)}
    return Outcome(any(v is not None and not v["right"] for v in seen.values()), seen)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
