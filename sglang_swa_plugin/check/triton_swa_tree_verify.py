"""CPU scenario of ``triton_swa_tree_verify``: a real TritonAttnBackend (window 7) over a real
SWAKVPool whose full and SWA index spaces differ, the target verify of an EAGLE tree (topk 2,
four drafts: the third sits at depth 1, the fourth at depth 2) after requests longer and shorter
than the window, and the Triton extend kernel recorded. Which keys each draft attends is read
off the call as the kernel reads it (its window by row, its custom mask where it reads it).
Right: a draft at position ``p`` attends the cached keys ``t`` with ``p - t <= window`` and its
tree ancestors. ``python -m sglang_swa_plugin.check.triton_swa_tree_verify`` prints one JSON line."""

from __future__ import annotations

from . import Outcome, print_outcome
from .testbed import ancestors, tree_inputs
from .triton_swa_draft import MODULE, WINDOW, build, cpu_triton

LENS = (21, 6, 14)  # longer than, shorter than, longer than the window
PARENT = (-1, 0, 0, 1)


def _seen_by_kernel(call: dict, b: int, i: int, n: int, slot_pos: dict) -> "set | None":
    """The cached positions and drafts that row ``i`` of request ``b`` attends in ``call``, as
    sglang's extend kernel masks them (None: the call cannot be read)."""
    indptr, indices = call["kv_indptr"], call["kv_indices"]
    if indices is None:
        return None
    start, end = int(indptr[b]), int(indptr[b + 1])
    kept, w = end - start, call["sliding_window_size"] or -1
    mask, offsets = call["custom_mask"], call["window_kv_offsets"]
    offset = int(offsets[b]) if (offsets is not None and w > 0) else 0
    row = int(call["mask_indptr"][b]) + i * (kept + offset + n) + offset if mask is not None else None
    read_prefix = call["skip_prefix_custom_mask"] is False
    seen = set()
    for j in range(kept):
        if (w <= 0 or kept + i <= j + w) and (not read_prefix or bool(mask[row + j])):
            seen.add(("key", slot_pos.get(int(indices[start + j]), -1)))
    for k in range(n):
        if (w <= 0 or i <= k + w) and (mask is None or bool(mask[row + kept + k])):
            seen.add(("draft", k))
    return seen


def scenario() -> Outcome:
    """The keys and drafts each draft of an EAGLE tree attends in a sliding-window layer's Triton
    verify call, against the model's window at the draft's position, on a real TritonAttnBackend
    over a real SWAKVPool whose index spaces differ. ``seen``: the drafts that attend otherwise."""
    import torch

    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.probe import optional_module

    from .fa3_spec_translate import verify_input

    if optional_module(MODULE) is None:
        raise ScenarioUnavailable(f"no Triton attention backend: {MODULE}")
    n = len(PARENT)
    env = build()
    env.backend.num_draft_tokens = n  # as sglang builds the backend for n draft tokens
    mask, positions = tree_inputs(PARENT)(LENS)
    rtt = env.runner.req_to_token_pool.req_to_token
    fb = env.tb.make_forward_batch(env.runner, "target_verify", req_pool_indices=env.rows[: len(LENS)],
                                   seq_lens=list(LENS), num_tokens_per_req=n, attn_backend=env.backend,
                                   spec_info=verify_input(mask, list(LENS), 2, n, positions))
    fb.positions = positions
    layer, calls = env.swa_layer, []
    q = torch.zeros(len(LENS) * n, layer.tp_q_head_num * layer.qk_head_dim)
    k = torch.zeros(len(LENS) * n, layer.tp_k_head_num, layer.qk_head_dim)
    with cpu_triton(env.backend, calls):
        env.backend.init_forward_metadata(fb)
        env.backend.forward_extend(q, k, torch.zeros(len(LENS) * n, layer.tp_v_head_num, layer.v_head_dim), layer, fb,
                                   save_kv_cache=False)
    if not calls:
        return Outcome(True, {"right": False, "why": "no kernel call"})
    wrong = []
    for b, m in enumerate(LENS):
        row_slots = env.tb.translate(env.pool, rtt[int(env.rows[b]), :m].long()).tolist()
        slot_pos = {s: p for p, s in enumerate(row_slots)}
        for i in range(n):
            p = int(positions[b * n + i])
            want = {("key", t) for t in range(m) if p - t <= WINDOW} | {("draft", a) for a in ancestors(PARENT, i)}
            if _seen_by_kernel(calls[-1], b, i, n, slot_pos) != want:
                wrong.append(f"{b}:draft{i}")
    return Outcome(bool(wrong), {"right": not wrong, "wrong_drafts": wrong, "drafts": len(LENS) * n})


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
