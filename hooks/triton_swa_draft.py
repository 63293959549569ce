"""triton_swa_draft: Triton speculative drafts with sliding-window layers get window KV indices.

Bug
    MiMo-V2.x and Step3.5 MTP drafts run their sliding layer on ``TritonAttnBackend``, whose
    draft-extend CUDA graphs, eager DRAFT_EXTEND and multi-step draft decode build no
    ``window_kv_indices``: a Triton compile error at capture, or foreign slots read. Fix, as
    0.5.23: the last window keys of the full rail in SWA space, by sglang's window helper (draft
    extend) or gathered per step (draft decode: as many as the target's decode, one more with
    triton_swa_window); preview triton_swa_draft_kernels: one Triton kernel a rail (not served).
Upstream PRs
    #29858, #24481, the Triton half of #22679.
Affected versions
    0.5.10-0.5.13: all three halves; 0.5.14-0.5.22: graphs and multi-step decode.
    Status by release: applied 0.5.10-0.5.22; not needed 0.5.23+.
Detection
    Syntax tree, per half: the draft-extend branches or ``_update_draft_extend_buffers``
    call no window helper; ``common_template`` names no ``window_kv_indices``. The plan
    holds the wrong halves' hooks in the release's graph API.
Delete when
    The oldest supported sglang is 0.5.23 or later.
"""

from __future__ import annotations

import functools
import inspect
from types import SimpleNamespace

from sglang_swa_plugin import graphed, state
from sglang_swa_plugin.fix import Detection, Fix, argument, around
from sglang_swa_plugin.probe import (calls, function_text, function_tree, if_branches, optional_module, own_function,
                                     target_class)
from sglang_swa_plugin.triton_rail import kernel_lays_out

MODULE = "sglang.srt.layers.attention.triton_backend"
NAME = "triton_swa_draft"
KERNELS = "triton_swa_draft_kernels"  # the preview: one Triton kernel per rail (equal on a GPU; no server row yet)
CLASS = MODULE + ".TritonAttnBackend"
EAGER = CLASS + ".init_forward_metadata"
CAPTURE = CLASS + ".init_forward_metadata_capture_cuda_graph"  # 0.5.10-0.5.12
REPLAY = CLASS + ".init_forward_metadata_replay_cuda_graph"  # 0.5.10-0.5.12
FILL = CLASS + "._update_draft_extend_buffers"  # 0.5.13+
BUILD = CLASS + "._build_cuda_graph_forward_metadata"  # 0.5.13+
OUT_GRAPH = CLASS + ".init_forward_metadata_out_graph"  # 0.5.13+: a draft step's capture
MULTI = MODULE + ".TritonMultiStepDraftBackend"
MULTI_REPLAY = MULTI + ".init_forward_metadata_replay_cuda_graph"  # 0.5.10-0.5.12
MULTI_OUT_GRAPH = MULTI + ".init_forward_metadata_out_graph"  # 0.5.13+
HELPERS = frozenset({"update_sliding_window_buffer", "update_sliding_window_buffer_cuda_graph"})
RAIL_BUILDER = MODULE + ".update_sliding_window_buffer"  # sglang's window rail builder
WIDENED_BY = "triton_swa_window"  # the fix whose hook on RAIL_BUILDER makes triton's decode rails one key longer


# ---------------------------------------------------------------------------- the fix


def _draft_extend(mode, v2: bool = True) -> bool:
    """DRAFT_EXTEND (or, with ``v2``, DRAFT_EXTEND_V2), by name: the mode predicates moved."""
    return mode.name == "DRAFT_EXTEND" or (v2 and mode.name == "DRAFT_EXTEND_V2")


def _has_window(self) -> bool:
    return self.sliding_window_size is not None and self.sliding_window_size > 0


@functools.lru_cache(maxsize=None)
def _helper(in_graph: bool):
    """sglang's own window builder: the CUDA-graph variant where the release has one (it
    writes into a given buffer), else ``update_sliding_window_buffer``; and its parameters."""
    mod = optional_module(MODULE)
    fn = getattr(mod, "update_sliding_window_buffer_cuda_graph", None) if in_graph else None
    fn = fn or getattr(mod, "update_sliding_window_buffer")
    return fn, tuple(inspect.signature(fn).parameters.values())


def _values(self, lens, req_pool_indices, bs, out, plan, index_table) -> dict:
    return {"window_kv_indptr": self.window_kv_indptr, "req_to_token": self.req_to_token,
            "sliding_window_size": self.sliding_window_size, "seq_lens": lens, "index_table": index_table,
            "req_pool_indices": req_pool_indices[:bs] if req_pool_indices is not None else None, "bs": bs,
            "device": self.device,
            "token_to_kv_pool_allocator": getattr(self, "token_to_kv_pool_allocator", None),
            "token_to_kv_pool": getattr(self, "token_to_kv_pool", None), "window_kv_indices": out,
            "translator": getattr(self, "kv_index_translator", None), "plan": plan}


def prefix_lens(kv_indptr, bs: int, qo_indptr=None):
    """Per request, the keys before the extend tokens: the full layers' rail (``kv_indptr``),
    less the extend tokens (``qo_indptr``) where that rail holds them too (before 0.5.13)."""
    import torch

    lens = kv_indptr[1 : bs + 1] - kv_indptr[:bs]
    if qo_indptr is not None:
        lens = torch.clamp(lens - (qo_indptr[1 : bs + 1] - qo_indptr[:bs]).to(lens.dtype), min=0)
    return lens


def fill_window(self, lens, req_pool_indices, bs: int, out=None, plan=None, index_table=None):
    """The window rail over each request's first ``lens`` keys (its last
    ``sliding_window_size``), built by sglang's own helper into ``out`` (a CUDA-graph buffer) or
    a fresh tensor: ``(window_kv_indptr, window_kv_indices, lens, start)``. Device ops only
    (the helper's own, as sglang's verify graphs run it)."""
    fn, params = _helper(out is not None)
    values = _values(self, lens, req_pool_indices, bs, out, plan, index_table)
    if out is None or any(p.name == "translator" for p in params):
        return fn(**{p.name: values[p.name] for p in params if p.name in values})
    # CUDA graph, a helper that translates through the pool itself (0.5.10-0.5.22): its slices
    # ``out[:window_kv_indptr[-1]]`` read the total on the host (two syncs per step); the
    # gather is its, the translation is done here over fixed shapes instead.
    values["token_to_kv_pool_allocator"] = values["token_to_kv_pool"] = None
    got = fn(**{p.name: values[p.name] for p in params if p.name in values})
    translate_window(self, got[0], bs, out)
    return got


def translate_window(self, indptr, bs: int, out) -> None:
    """``out[:indptr[bs]]`` (full-pool ids) into SWA space through the pool's own
    translation, over a fixed ``bs * (window + 1)`` slots: no host-device sync; the slots
    past the window rail are kept as they were. On a GPU (or under Triton's interpreter) one
    kernel (``rail_kernel.translate_head``) where the pool's translation is its mapping."""
    import torch

    state = _rail_state(self)
    if state["translate"] is None:
        return
    n = min(bs * (self.sliding_window_size + 1), out.shape[0])  # a rail keeps window + 1 keys with triton_swa_window
    if state["kernel"] and kernel_lays_out(out):  # one launch on a GPU
        from sglang_swa_plugin.rail_kernel import translate_head

        translate_head(out, indptr, bs, n, state["mapping"])
        return
    ids = out[:n]
    keep = _slots(state, n, indptr) < indptr[bs]
    out[:n] = torch.where(keep, state["translate"](torch.where(keep, ids, 0)), ids)


def _eager(original, self, forward_batch, *args, **kwargs):
    result = original(self, forward_batch, *args, **kwargs)
    md = self.forward_metadata
    if not _has_window(self) or md.window_kv_indices is not None:
        return result
    bs = md.kv_indptr.shape[0] - 1
    if _draft_extend(forward_batch.forward_mode, v2=False):
        # eager DRAFT_EXTEND: the rail holds the accepted tokens too (generate_attn_arg_prefill)
        md.window_kv_indptr, md.window_kv_indices, _, md.window_kv_offsets = fill_window(
            self, prefix_lens(md.kv_indptr, bs, md.qo_indptr), forward_batch.req_pool_indices, bs)
    elif _draft_step(forward_batch.forward_mode, forward_batch.spec_info):
        import torch
        md.window_kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=md.kv_indptr.device)
        md.window_kv_indices = torch.empty(bs * _rail_state(self)["keys"], dtype=torch.int64,
                                           device=md.kv_indptr.device)
        window_of_rail(self, md.kv_indptr, md.kv_indices, bs, md.window_kv_indptr, md.window_kv_indices)
    return result


# ---------------------------------------------------------------- multi-step draft decode


def _draft_step(mode, spec_info) -> bool:
    """A step of the multi-step draft backend: DECODE whose rail the spec_info carries."""
    return mode.name == "DECODE" and spec_info is not None and getattr(spec_info, "kv_indptr", None) is not None


RAIL = "window_rail"  # in a backend's state: the pool's translation, its size, slot ranges


def _owners(self) -> tuple:
    """Who translates the backend's window ids: its own pool where it has one (0.5.13+; an EAGLE
    draft's full-only pool translates nothing, whatever the target allocator it shares), else
    the allocator (0.5.10-0.5.12, as sglang's own window helper there)."""
    pool = getattr(self, "token_to_kv_pool", None)
    return (pool,) if pool is not None else (getattr(self, "token_to_kv_pool_allocator", None),)


def _translator(self):
    for obj in _owners(self):
        if hasattr(obj, "translate_loc_from_full_to_swa"):
            return obj.translate_loc_from_full_to_swa
    return None


def _mapping(self):
    """The pool's full->SWA mapping (None: no mapping found)."""
    for obj in _owners(self):
        for o in (obj, getattr(obj, "_kvcache", None)):
            mapping = getattr(o, "full_to_swa_index_mapping", None)
            if mapping is not None:
                return mapping
    return None


def decode_keys(window: int) -> int:
    """The keys a draft step's window rail keeps for a layer of ``window``: as many as triton's
    decode rail of the target keeps, ``window + 1`` where ``triton_swa_window`` widens sglang's
    rail builder (its hook is on it; the model and triton's extend attend that many, and the
    draft's extend gave the first draft token from them), else ``window``."""
    from sglang_swa_plugin.patching import target_marks

    return window + 1 if WIDENED_BY in target_marks(RAIL_BUILDER) else window


def _rail_state(self) -> dict:
    """What does not change on a backend between draft steps, looked up once: the pool's
    full->SWA translation, its mapping and how many full-pool slots that covers; the keys a
    window rail keeps (``decode_keys``)."""
    rail = state.get(self, RAIL)
    if rail is None:
        mapping, translate = _mapping(self), _translator(self)
        rail = state.of(self)[RAIL] = {"translate": translate, "mapping": mapping, "slots": {},
                                       "keys": decode_keys(self.sliding_window_size),
                                       "limit": mapping.shape[0] if mapping is not None else None,
                                       # the kernel translates through the mapping: where the pool does
                                       "kernel": KERNELS in FIX.previews_on and (translate is None) == (mapping is None)}
    return rail


def _slots(state: dict, n: int, like, rows: "int | None" = None):
    """``arange(n)`` on ``like``'s device and dtype (``rows``: that many rows of it), made once
    per size."""
    import torch

    key = (n, rows, like.device, like.dtype)
    slot = state["slots"].get(key)
    if slot is None:
        slot = torch.arange(n, device=like.device, dtype=like.dtype)
        slot = state["slots"][key] = slot if rows is None else slot.repeat(rows, 1)
    return slot


def window_of_rail(self, kv_indptr, kv_indices, bs: int, out_indptr, out_indices) -> None:
    """A draft step's window rail from its full rail (``kv_indptr``/``kv_indices``: the
    committed prefix and the step's draft tokens, per branch): the last ``min(L, keys)`` keys
    of each (``keys``: ``decode_keys``, as the target's decode rail), in SWA space, packed at ``out_indptr``
    (``window_rails`` of one step). On a GPU (or under Triton's interpreter) one kernel
    (``rail_kernel.window_of_rail_layout``) where the pool's translation is its mapping."""
    state = _rail_state(self)
    if state["kernel"] and kernel_lays_out(kv_indptr):
        from sglang_swa_plugin.rail_kernel import window_of_rail_layout

        window_of_rail_layout(kv_indptr, kv_indices, state["mapping"], bs, state["keys"], out_indptr, out_indices)
        return
    cum, ids = window_rails(self, kv_indptr[None], kv_indices[None], bs)
    out_indptr[1 : bs + 1] = cum[0]
    out_indices[: ids.shape[1]] = ids[0]


def window_rails(self, kv_indptr, kv_indices, bs: int):
    """The window rails of ``S`` draft steps at once from their full rails (rows of
    ``kv_indptr``, ``S x (bs + 1)`` or wider, and ``kv_indices``, ``S x N``): per step the end
    offsets of its window rail (``S x bs``) and its ids in SWA space (``S x bs * keys``, the keys a
    rail keeps: ``decode_keys``). Fixed
    shapes, device ops only, as many whatever ``S``: capturable, no host-device sync.

    Every gather is kept in range: sglang's rail kernel derives ``kv_indptr`` from the batch's
    positions and fills ``kv_indices`` from ``seq_lens``; at CUDA-graph capture the two disagree
    (the position buffer, shared by all batch sizes, was advanced by the warm-up runs of the
    larger ones), so the rail may claim keys past the ``kv_indices`` slice, and a padded
    row's slots need not be in the pool. Such slots read SWA slot 0 (the pool's padding slot),
    where sglang's own kernels, reading through pointers, read whatever lies past the slice.

    Slot ``s`` of request ``r`` (its window packed from ``cum[r] - wl[r]``) reads full-rail
    entry ``kv_indptr[r + 1] - wl[r] + (s - (cum[r] - wl[r])) = (kv_indptr[r + 1] - cum[r]) + s``."""
    import torch

    state = _rail_state(self)
    w = state["keys"]
    ends = kv_indptr[:, 1 : bs + 1]
    cum = torch.cumsum(torch.clamp(ends - kv_indptr[:, :bs], min=0, max=w), 1)
    slot = _slots(state, bs * w, cum, cum.shape[0])
    req = torch.searchsorted(cum, slot, right=True).clamp_(max=bs - 1)
    src = (ends - cum).gather(1, req) + slot
    valid = (slot < cum[:, -1:]) & (src.clamp(0, kv_indices.shape[1] - 1) == src)
    ids = kv_indices.gather(1, torch.where(valid, src, 0))
    limit = state["limit"]
    if limit is not None:
        ids_in = ids.clamp(0, limit - 1)
        valid &= ids_in == ids
        ids = ids_in
    else:
        ids = torch.where(valid, ids, 0)
    if state["translate"] is not None:
        ids = state["translate"](ids)
    return cum, torch.where(valid, ids, 0)


def _step_capture(self, spec_info, bs: int) -> None:
    """A draft step's captured metadata reads its window from the backend's graph buffers."""
    md = self.forward_metadata
    window_of_rail(self, spec_info.kv_indptr, spec_info.kv_indices, bs, self.window_kv_indptr,
                   self.cuda_graph_window_kv_indices)
    md.window_kv_indptr = self.window_kv_indptr[: bs + 1]
    md.window_kv_indices = self.cuda_graph_window_kv_indices


def _out_graph(original, self, forward_batch, *args, **kwargs):  # 0.5.13+: a draft step's capture
    result = original(self, forward_batch, *args, **kwargs)
    in_capture = argument(original, "in_capture", (forward_batch, *args), kwargs)
    md = self.forward_metadata
    if (in_capture and _has_window(self) and _draft_step(forward_batch.forward_mode, forward_batch.spec_info)
            and md.window_kv_indices is None):
        _step_capture(self, forward_batch.spec_info, forward_batch.spec_info.kv_indptr.shape[0] - 1)
    return result


def _refill_steps(self, forward_batch) -> None:
    """Replay: each step's window rail from the step's row of the multi-step rail buffers
    (which sglang's own replay has just refilled), into that step backend's graph buffers: all
    steps' rails computed at once (``window_rails``), then copied to each step's buffers; the
    whole replayed as one CUDA graph (``graphed``). What does not change between replays of a
    batch size (the steps, their buffers' views, the graph's inputs) is kept per multi-step
    backend and batch size."""
    bs = self.topk * forward_batch.batch_size
    steps = state.of(self).setdefault(STEPS, {})
    plan = steps.get(bs)
    if plan is None or not all(getattr(o, name) is t for o, name, t in plan["buffers"]):
        plan = steps[bs] = _steps_plan(self, bs)
    if plan["first"] is None:
        return
    graphed.run(self, (NAME, bs, plan["rows"]), plan["refill"], plan["inputs"])


STEPS = "triton_swa_draft.steps"  # in a multi-step backend's state: {bs: what its replays reuse}


def _steps_plan(self, bs: int) -> dict:
    """What ``_refill_steps`` reuses for ``bs``: the steps with a window, views of their
    buffers, the refill and its graph's inputs; ``buffers``: the tensors it was made for. The
    refill: on a GPU one kernel per step (``window_of_rail``), else all steps' rails in one
    set of torch ops (``window_rails``), copied to each step's buffers."""
    steps = [(i, b) for i, b in enumerate(self.attn_backends) if _has_window(b)]
    names = ("window_kv_indptr", "cuda_graph_window_kv_indices")
    buffers = [(self, n, getattr(self, n)) for n in ("kv_indptr", "cuda_graph_kv_indices")]
    buffers += [(b, n, getattr(b, n)) for _, b in steps for n in names]
    plan = {"buffers": buffers, "first": steps[0][1] if steps else None, "rows": tuple(i for i, _ in steps)}
    if not steps:
        return plan
    first, rows = plan["first"], list(plan["rows"])
    per_step = [(b, self.kv_indptr[i, : bs + 1], self.cuda_graph_kv_indices[i]) for i, b in steps]
    if (any(b.sliding_window_size != first.sliding_window_size for _, b in steps)
            or (_rail_state(first)["kernel"] and kernel_lays_out(self.kv_indptr))):
        def refill():
            for b, indptr, indices in per_step:
                window_of_rail(b, indptr, indices, bs, b.window_kv_indptr, b.cuda_graph_window_kv_indices)
    else:
        contiguous = rows == list(range(rows[0], rows[-1] + 1))
        indptr = self.kv_indptr[rows[0] : rows[-1] + 1] if contiguous else None
        indices = self.cuda_graph_kv_indices[rows[0] : rows[-1] + 1] if contiguous else None
        width = bs * _rail_state(first)["keys"]
        outs = [(b.window_kv_indptr[1 : bs + 1], b.cuda_graph_window_kv_indices[:width]) for _, b in steps]

        def refill():
            cum, ids = window_rails(first, indptr if contiguous else self.kv_indptr[rows],
                                    indices if contiguous else self.cuda_graph_kv_indices[rows], bs)
            for (out_indptr, out_ids), c, i in zip(outs, cum.unbind(0), ids.unbind(0)):
                out_indptr.copy_(c)
                out_ids.copy_(i)

    inputs = [t for _, _, t in buffers]
    mappings = {id(m): m for m in (_rail_state(b)["mapping"] for _, b in steps) if m is not None}
    plan.update(refill=refill, inputs=inputs + list(mappings.values()))
    return plan


def _multi_replay(original, self, forward_batch, *args, **kwargs):  # 0.5.10-0.5.12
    result = original(self, forward_batch, *args, **kwargs)
    _refill_steps(self, forward_batch)
    return result


def _multi_out_graph(original, self, forward_batch, *args, **kwargs):  # 0.5.13+
    result = original(self, forward_batch, *args, **kwargs)
    if not argument(original, "in_capture", (forward_batch, *args), kwargs):
        _refill_steps(self, forward_batch)
    return result


def _point_at_buffers(self, md, bs: int) -> None:
    md.window_kv_indptr = self.window_kv_indptr[: bs + 1]
    md.window_kv_indices = self.cuda_graph_window_kv_indices
    md.window_kv_offsets = self.cuda_graph_window_kv_offsets


def _graph_fill(self, lens, req_pool_indices, bs: int, plan=None, index_table=None) -> None:
    _, _, _, start = fill_window(self, lens, req_pool_indices, bs, out=self.cuda_graph_window_kv_indices,
                                 plan=plan, index_table=index_table)
    self.cuda_graph_window_kv_offsets[:bs] = start


def _graph_prefix(self, mode, bs: int):
    """0.5.10-0.5.12: the graph rail is ``seq_lens`` long; for DRAFT_EXTEND_V2 those count the
    request's draft tokens (``qo_indptr``: one extend of num_tokens_per_bs each)."""
    qo = self.qo_indptr[: bs + 1] if mode.name == "DRAFT_EXTEND_V2" else None
    return prefix_lens(self.kv_indptr[: bs + 1], bs, qo)


def _graph_refill(self, key, lens_of, lens_inputs: list, req_pool_indices, bs: int, plan=None,
                  index_table=None) -> None:
    """``_graph_fill`` over ``lens_of()`` (device ops on ``lens_inputs``), replayed as one CUDA
    graph (``graphed``) where every input is a tensor (0.5.23's plan objects: eager)."""
    def fill():
        _graph_fill(self, lens_of(), req_pool_indices, bs, plan=plan, index_table=index_table)

    if plan is not None or index_table is not None or req_pool_indices is None:
        fill()
        return
    inputs = [*lens_inputs, req_pool_indices, self.req_to_token, self.window_kv_indptr,
              self.cuda_graph_window_kv_indices, self.cuda_graph_window_kv_offsets, _rail_state(self)["mapping"]]
    graphed.run(self, (NAME, key, bs), fill, [t for t in inputs if t is not None])


def _capture(original, self, *args, **kwargs):  # 0.5.10-0.5.12
    result = original(self, *args, **kwargs)
    a = lambda name: argument(original, name, args, kwargs)  # noqa: E731
    bs, md, spec_info, mode = a("bs"), self.forward_metadata, a("spec_info"), a("forward_mode")
    if not _has_window(self) or md.window_kv_indices is not None:
        return result
    if _draft_extend(mode):
        _graph_fill(self, _graph_prefix(self, mode, bs), a("req_pool_indices"), bs)
        _point_at_buffers(self, md, bs)
    elif _draft_step(mode, spec_info):
        _step_capture(self, spec_info, spec_info.kv_indptr.shape[0] - 1)
    return result


def _replay(original, self, *args, **kwargs):  # 0.5.10-0.5.12
    result = original(self, *args, **kwargs)
    a = lambda name: argument(original, name, args, kwargs)  # noqa: E731
    bs, mode = a("bs"), a("forward_mode")
    if _draft_extend(mode) and _has_window(self):
        _graph_refill(self, mode.name, lambda: _graph_prefix(self, mode, bs), [self.kv_indptr, self.qo_indptr],
                      a("req_pool_indices"), bs)
    return result


def _fill(original, self, *args, **kwargs):  # 0.5.13+: capture and replay
    result = original(self, *args, **kwargs)
    if _has_window(self):
        a = lambda name: argument(original, name, args, kwargs)  # noqa: E731
        bs, kv_indptr = a("bs"), result[1]
        _graph_refill(self, "extend", lambda: prefix_lens(kv_indptr, bs), [kv_indptr], a("req_pool_indices"), bs,
                      plan=a("plan"), index_table=a("index_table"))
    return result


def _build(original, self, *args, **kwargs):  # 0.5.13+: the captured metadata
    md = original(self, *args, **kwargs)
    if (_draft_extend(argument(original, "forward_mode", args, kwargs)) and _has_window(self)
            and md.window_kv_indices is None):
        _point_at_buffers(self, md, argument(original, "bs", args, kwargs))
    return md


# ---------------------------------------------------------------------------- detection


def _draft_extend_branches(fn) -> list:
    """The ``if``/``elif`` branches of ``fn`` whose test asks ``is_draft_extend*()``."""
    return if_branches(fn, "is_draft_extend")


def _branch_builds_window(fn) -> "bool | None":
    """None: ``fn`` has no draft-extend branch; else whether every one builds a window rail."""
    branches = _draft_extend_branches(fn)
    if not branches:
        return None
    return all(any(calls(stmt, HELPERS) for stmt in b.body) for b in branches)


def probe(cls: type) -> dict:
    """Per half ("eager", "graph"): True where the installed code builds the window rail,
    None where the half does not exist."""
    eager = own_function(cls, "init_forward_metadata")
    got = {"eager": _branch_builds_window(eager) if eager is not None else None}
    fill = own_function(cls, FILL.rsplit(".", 1)[1])
    if fill is not None:
        got["graph"] = calls(function_tree(fill)[0], HELPERS)
    else:
        capture = own_function(cls, CAPTURE.rsplit(".", 1)[1])
        got["graph"] = _branch_builds_window(capture) if capture is not None else None
    multi = getattr(optional_module(MODULE), MULTI.rsplit(".", 1)[1], None)
    template = own_function(multi, "common_template") if multi is not None else None
    # The window rail sliding layers read (``window_kv_indices``, 0.5.23); not the draft
    # attention window of --speculative-draft-window-size (``draft_window_size``, 0.5.21+),
    # which is no such rail.
    got["decode"] = "window_kv_indices" in function_text(template) if template is not None else None
    return got


# A backend with the attributes ``_values`` reads: the names it can supply, listed there once.
_NO_BACKEND = SimpleNamespace(window_kv_indptr=None, req_to_token=None, sliding_window_size=None, device=None)


def _helper_gap() -> "str | None":
    """A required parameter of sglang's window helper(s) that ``fill_window`` cannot supply."""
    known = _values(_NO_BACKEND, None, None, 0, None, None, None).keys()
    for in_graph in (False, True):
        for p in _helper(in_graph)[1]:
            if p.default is inspect.Parameter.empty and p.name not in known:
                return f"{_helper(in_graph)[0].__name__} takes {p.name!r}"
    return None


def classify() -> Detection:
    if optional_module(MODULE) is None:
        return Detection.not_applicable("this sglang has no Triton attention backend")
    cls = target_class(CLASS)  # gone: target moved (TargetMissing), not an unknown shape
    try:
        got, gap = probe(cls), _helper_gap()
        new_form = own_function(cls, FILL.rsplit(".", 1)[1]) is not None
    except Exception as e:  # noqa: BLE001
        return Detection.unknown(f"Triton draft-extend metadata could not be read: {type(e).__name__}: {e}")
    wrong = [half for half, ok in got.items() if ok is False]
    if not wrong:
        return Detection.not_needed("Triton draft extend builds window KV indices, eager and in CUDA graphs")
    if gap:
        return Detection.unknown(f"the window helper moved: {gap}")
    what = {"eager": "eager DRAFT_EXTEND builds no window KV indices",
            "graph": "CUDA-graph draft extend builds no window KV indices (window_kv_indices=None)",
            "decode": "multi-step draft decode builds no window KV indices"}
    return Detection.needed("; ".join(what[h] for h in wrong), *plan(wrong, new_form))


def plan(wrong: "list[str]", new_form: bool) -> list:
    """The hooks of the halves in ``wrong``; ``new_form``: the CUDA-graph metadata of 0.5.13+
    (``_update_draft_extend_buffers``, ``init_forward_metadata_out_graph``)."""
    hooks = {}  # target -> hook; a target two halves share is hooked once
    if "eager" in wrong or "decode" in wrong:
        hooks[EAGER] = _eager
    if "graph" in wrong:
        hooks.update({FILL: _fill, BUILD: _build} if new_form else {CAPTURE: _capture, REPLAY: _replay})
    if "decode" in wrong:
        hooks.update({OUT_GRAPH: _out_graph, MULTI_OUT_GRAPH: _multi_out_graph} if new_form
                     else {CAPTURE: _capture, MULTI_REPLAY: _multi_replay})
    return [around(target, hook) for target, hook in hooks.items()]


class TritonSwaDraftFix(Fix):
    name = NAME
    summary = "Triton draft extend builds window KV indices (SWA space) for sliding-window draft layers"
    upstream_prs = ("#29858", "#24481", "#22679")
    targets = (EAGER, CAPTURE, REPLAY, FILL, BUILD, OUT_GRAPH, MULTI_REPLAY, MULTI_OUT_GRAPH)
    target_params = {EAGER: ("self", "forward_batch")}
    check_module = "sglang_swa_plugin.check.triton_swa_draft"
    previews = {KERNELS: "each draft step's window rail and the draft-extend translation as one Triton kernel "
                         "each (rail_kernel) instead of ~30 and ~7 device ops in the fix's graph"}

    def detect(self) -> Detection:
        return classify()


FIX = TritonSwaDraftFix()
