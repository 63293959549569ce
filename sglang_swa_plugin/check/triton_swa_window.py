"""CPU scenario of ``triton_swa_window``: a real TritonAttnBackend (window 7) over a real
SWAKVPool whose full and SWA index spaces differ, plain DECODE batches of requests longer and
shorter than the window, and the Triton decode kernel recorded: which keys a sliding-window
layer's ``decode_attention_fwd`` call receives, eager, at CUDA-graph capture and at replay of
a second batch. Right: for each request of ``L`` keys (the new token's included), the last
``min(L, window + 1)`` in SWA space: query ``q`` attends keys ``k`` with ``q - k <= window``,
as the model, fa3, flashinfer and triton's own extend kernel do.
``python -m sglang_swa_plugin.check.triton_swa_window`` prints one JSON line."""

from __future__ import annotations


from . import Outcome, print_outcome
from .triton_bench import MODULE, WINDOW, build, cpu_triton, decode_graph_metadata, layer_call

SEQ_LENS = (21, 6, 14)  # longer than, shorter than, longer than the window
REPLAY_SEQ_LENS = (10, 17, 3)


def _judge(env, call: dict, seq_lens) -> dict:
    if "error" in call:
        return {"right": False, "why": call["error"]}
    indptr, indices = call["kv_indptr"], call["kv_indices"]
    if indices is None:
        return {"right": False, "why": "window_kv_indices=None"}
    got_lens, per_req = [], []
    for b, (row, n) in enumerate(zip(env.rows, seq_lens)):
        w = min(n, WINDOW + 1)
        want = env.tb.translate(env.pool, env.runner.req_to_token_pool.req_to_token[row, n - w:n].long()).tolist()
        got = indices[int(indptr[b]):int(indptr[b + 1])].tolist()
        got_lens.append(len(got))
        per_req.append(got == want)
    return {"right": all(per_req), "keys": got_lens, "want": [min(n, WINDOW + 1) for n in seq_lens]}


def _decode_batch(env, seq_lens):
    return env.tb.make_forward_batch(env.runner, "decode", req_pool_indices=env.rows[: len(seq_lens)],
                                     seq_lens=list(seq_lens), attn_backend=env.backend)


def scenario() -> Outcome:
    """The keys a sliding-window layer's Triton decode kernel attends, eager and in CUDA-graph
    capture and replay, against the last ``window + 1`` keys of each request in SWA space, on a
    real TritonAttnBackend over a real SWAKVPool whose index spaces differ. ``seen``: per path,
    right or not, and the key counts."""
    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.probe import optional_module

    if optional_module(MODULE) is None:
        raise ScenarioUnavailable(f"no Triton attention backend: {MODULE}")
    env = build()
    be, calls, seen = env.backend, [], {}
    be.init_cuda_graph_state(4, 4)  # a decode-only graph state: one token per request
    with cpu_triton(be, calls):
        fb = _decode_batch(env, SEQ_LENS)
        be.init_forward_metadata(fb)
        seen["eager"] = _judge(env, layer_call(env, be, fb, calls), SEQ_LENS)
        captured = None
        for phase, lens in (("capture", SEQ_LENS), ("replay", REPLAY_SEQ_LENS)):
            fb = _decode_batch(env, lens)
            decode_graph_metadata(be, fb, phase)
            captured = be.forward_metadata if phase == "capture" else captured
            be.forward_metadata = captured
            seen[phase] = _judge(env, layer_call(env, be, fb, calls), lens)
    seen["graph_window_buffer"] = {"slots": be.cuda_graph_window_kv_indices.numel(), "needed": 4 * (WINDOW + 1)}
    return Outcome(any(not v["right"] for k, v in seen.items() if k != "graph_window_buffer"), seen)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
