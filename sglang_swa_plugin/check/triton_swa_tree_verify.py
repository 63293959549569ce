"""CPU scenario of ``triton_swa_tree_verify``: a real TritonAttnBackend (window 7) over a real
SWAKVPool whose full and SWA index spaces differ, the target verify of an EAGLE tree (topk 2,
four drafts: the third sits at depth 1, the fourth at depth 2) after requests longer and shorter
than the window, and the Triton extend kernel recorded; where the fix's deterministic preview is
on, also deterministic inference (``--enable-deterministic-inference``: sglang's unified kernel,
recorded, its index copy as a torch twin) for the same tree and a chain (topk 1). Which keys
each draft attends is read off the call as the kernel reads it (its window by row, its custom
mask where it reads it). Right: a draft at position ``p`` attends the cached keys ``t`` with
``p - t <= window`` and its tree ancestors.
``python -m sglang_swa_plugin.check.triton_swa_tree_verify`` prints one JSON line."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect

from . import Outcome, print_outcome
from .testbed import ancestors, tree_inputs
from .triton_bench import DRAFT_TOKENS, MODULE, WINDOW, build, cpu_triton, triton_backend

LENS = (21, 6, 14)  # longer than, shorter than, longer than the window
PARENT = (-1, 0, 0, 1)
CHAIN = (-1, 0, 1, 2)
UNIFIED = "extend_attention_fwd_unified"


@contextlib.contextmanager
def deterministic_args(runner):
    """``runner``'s server args with ``--enable-deterministic-inference``, where sglang reads them
    (the runner's ServerArgs, or the runtime context of releases that have one); put back after."""
    from sglang_swa_plugin.probe import swapped

    args = runner.server_args
    if dataclasses.is_dataclass(args):
        with swapped(args, "enable_deterministic_inference", True):
            yield
        return
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args(enable_deterministic_inference=True):
        yield


def build_deterministic(n: int):
    """``triton_bench.build()``'s pool, runner and requests with a TritonAttnBackend built under
    deterministic inference (its extends run sglang's unified kernel), for ``n`` drafts per request."""
    env = build()
    with deterministic_args(env.runner):
        env.backend = triton_backend(env.runner, DRAFT_TOKENS)
    env.backend.init_cuda_graph_state(4, 4 * DRAFT_TOKENS)
    env.backend.num_draft_tokens = n  # as sglang builds the backend for n draft tokens
    return env


def _unified_indices(prefix_kv_indptr, prefix_kv_indices, extend_start_loc, extend_seq_lens, extend_kv_indices, bs):
    """sglang's ``build_unified_kv_indices`` in torch (CPU): per request its prefix's ids, then its
    new tokens'; ``(kv_indptr, kv_indices, prefix_lens)``."""
    import torch

    from sglang_swa_plugin.triton_rail import offsets

    prefix_lens = prefix_kv_indptr[1:bs + 1] - prefix_kv_indptr[:bs]
    parts = []
    for b in range(bs):
        start = int(extend_start_loc[b])
        parts += [prefix_kv_indices[int(prefix_kv_indptr[b]):int(prefix_kv_indptr[b + 1])],
                  extend_kv_indices[start:start + int(extend_seq_lens[b])].to(torch.int64)]
    return offsets(prefix_lens + extend_seq_lens[:bs]), torch.cat(parts), prefix_lens


@contextlib.contextmanager
def cpu_unified(backend, calls: list):
    """``cpu_triton`` (sglang's gathers as torch twins) with the unified kernel recorded and its
    index copy as its torch twin."""
    import torch

    from sglang_swa_plugin.probe import swapped

    signature = inspect.signature(getattr(backend, UNIFIED))

    def record(*args, **kwargs):
        a = signature.bind(*args, **kwargs).arguments
        calls.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.items()
                      if k in ("kv_indptr", "kv_indices", "prefix_lens", "custom_mask", "mask_indptr",
                               "sliding_window_size")})

    with cpu_triton(backend, []), swapped(backend, UNIFIED, record), \
            swapped(backend, "build_unified_kv_indices", _unified_indices):
        yield


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


def _seen_by_unified(call: dict, b: int, i: int, n: int, slot_pos: dict) -> set:
    """What row ``i`` of request ``b`` attends in a unified kernel's ``call``, as that kernel masks:
    column ``c`` of the request's keys (its prefix's, then its drafts') is read at cell
    ``mask_indptr[b] + i * keys + c`` and windowed by row (``prefix + i <= c + window``)."""
    indptr, indices, prefix = call["kv_indptr"], call["kv_indices"], int(call["prefix_lens"][b])
    start, keys, w = int(indptr[b]), int(indptr[b + 1]) - int(indptr[b]), call["sliding_window_size"] or -1
    mask, row = call["custom_mask"], int(call["mask_indptr"][b]) + i * keys
    seen = set()
    for c in range(keys):
        if (w <= 0 or prefix + i <= c + w) and (mask is None or bool(mask[min(row + c, mask.numel() - 1)])):
            seen.add(("key", slot_pos.get(int(indices[start + c]), -1)) if c < prefix else ("draft", c - prefix))
    return seen


def _wrong_drafts(env, parent, unified: bool) -> "list | None":
    """The drafts (``request:draftI``) of a verify of the tree ``parent`` on ``env`` that attend other
    keys or drafts than the model's window at their position (None: no kernel call)."""
    import torch

    from .fa3_spec_translate import verify_input

    n, topk = len(parent), 1 if parent == CHAIN else 2
    mask, positions = tree_inputs(parent)(LENS)
    rtt = env.runner.req_to_token_pool.req_to_token
    loc = torch.cat([rtt[int(r), m:m + n] for r, m in zip(env.rows, LENS)]).long()
    fb = env.tb.make_forward_batch(env.runner, "target_verify", req_pool_indices=env.rows[: len(LENS)],
                                   seq_lens=list(LENS), num_tokens_per_req=n, attn_backend=env.backend,
                                   spec_info=verify_input(mask, list(LENS), topk, n, positions), out_cache_loc=loc)
    fb.positions = positions
    layer, calls = env.swa_layer, []
    q = torch.zeros(len(LENS) * n, layer.tp_q_head_num * layer.qk_head_dim)
    k = torch.zeros(len(LENS) * n, layer.tp_k_head_num, layer.qk_head_dim)
    with (cpu_unified if unified else cpu_triton)(env.backend, calls):
        env.backend.init_forward_metadata(fb)
        env.backend.forward_extend(q, k, torch.zeros(len(LENS) * n, layer.tp_v_head_num, layer.v_head_dim), layer, fb,
                                   save_kv_cache=False)
    if not calls:
        return None
    wrong = []
    for b, m in enumerate(LENS):
        row_slots = env.tb.translate(env.pool, rtt[int(env.rows[b]), :m].long()).tolist()
        slot_pos = {s: p for p, s in enumerate(row_slots)}
        for i in range(n):
            p = int(positions[b * n + i])
            want = {("key", t) for t in range(m) if p - t <= WINDOW} | {("draft", a) for a in ancestors(parent, i)}
            seen = (_seen_by_unified if unified else _seen_by_kernel)(calls[-1], b, i, n, slot_pos)
            if seen != want:
                wrong.append(f"{b}:draft{i}")
    return wrong


def scenario() -> Outcome:
    """The keys and drafts each draft attends in a sliding-window layer's Triton verify call,
    against the model's window at the draft's position, on a real TritonAttnBackend over a real
    SWAKVPool whose index spaces differ. Checked: an EAGLE tree's verify (``wrong_drafts``: the
    drafts that attend otherwise) and, with the fix's deterministic preview on, a tree's and a
    chain's verify under deterministic inference (``deterministic``: their wrong drafts)."""
    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.probe import optional_module

    if optional_module(MODULE) is None:
        raise ScenarioUnavailable(f"no Triton attention backend: {MODULE}")
    env = build()
    env.backend.num_draft_tokens = len(PARENT)  # as sglang builds the backend for n draft tokens
    wrong = _wrong_drafts(env, PARENT, unified=False)
    if wrong is None:
        return Outcome(True, {"right": False, "why": "no kernel call"})
    seen = {"wrong_drafts": wrong, "drafts": len(LENS) * len(PARENT)}
    from sglang_swa_plugin.hooks.triton_swa_tree_verify import DETERMINISTIC, FIX, unified_reads_swa_ids

    # deterministic inference, where the fix's preview covers it (SGLANG_SWA_PLUGIN_PREVIEW names
    # it; the unified kernel reads new keys at their SWA ids: 0.5.12+)
    det = build_deterministic(len(PARENT)) if DETERMINISTIC in FIX.previews_on else None  # a chain has as many drafts
    if det is not None and hasattr(det.backend, UNIFIED) and unified_reads_swa_ids():
        seen["deterministic"] = {name: _wrong_drafts(det, parent, unified=True)
                                 for name, parent in (("tree", PARENT), ("chain", CHAIN))}
    bug = bool(wrong) or any(w is None or w for w in seen.get("deterministic", {}).values())
    return Outcome(bug, {"right": not bug, **seen})


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
