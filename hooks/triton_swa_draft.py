"""triton_swa_draft: Triton draft extend gives sliding-window draft layers their window KV indices.

Bug
    MiMo-V2.x and Step3.5 MTP drafts (multi-layer EAGLE; sglang's ``MiMoV2MTP`` and
    ``Step3p5MTP``, whose one attention layer is a sliding-window layer of a hybrid SWA pool)
    run their draft extend on the draft runner's ``TritonAttnBackend``. Its sliding layers read
    ``forward_metadata.window_kv_indices``, which these paths never build:
    - CUDA graphs (DRAFT_EXTEND / DRAFT_EXTEND_V2 capture and replay): 0.5.10-0.5.12's
      ``init_forward_metadata_capture_cuda_graph`` / ``..._replay_cuda_graph`` draft-extend
      branch fills only the full-pool rail; from 0.5.13 ``_update_draft_extend_buffers`` fills
      only the full-pool rail and ``_build_cuda_graph_forward_metadata`` hard-codes
      ``window_kv_indices=None``;
    - eager DRAFT_EXTEND (the non-overlap worker, 0.5.10-0.5.13): ``init_forward_metadata``'s
      draft-extend branch builds none either.
    The extend kernel then gets ``kv_indices=None``: a Triton compile error at CUDA-graph
    capture (server start) or on the first draft extend; a stale window buffer from another
    mode reads foreign slots, past the SWA pool where it is smaller than the full pool
    (intermittent illegal memory access). This module backports 0.5.23's form: the window
    rail covers the last ``sliding_window_size`` keys of the rail the full layers get, built
    by the installed release's own ``update_sliding_window_buffer`` (its CUDA-graph variant
    where the release has one) into the backend's CUDA-graph window buffers, translated
    full->SWA as sglang translates its other window rails, and the captured metadata points
    at those buffers. Multi-step draft decode (``TritonMultiStepDraftBackend``, 0.5.23's
    ``window_rail``) is not covered: no model of these releases reaches it with a
    sliding-window draft (MiMo-V2 and Step3.5 MTP run draft extend only).

Upstream PRs
    #29858, #24481, the Triton half of #22679 (0.5.23: ``_update_draft_extend_buffers``
    calls ``update_sliding_window_buffer``; the graph metadata uses the window buffers).

Affected versions
    0.5.10-0.5.12: graph capture/replay and eager DRAFT_EXTEND. 0.5.13: the same, in the
    ``_update_draft_extend_buffers`` form. 0.5.14-0.5.22: graph capture/replay (eager draft
    extend runs as EXTEND, which builds its window). 0.5.23 and later: neither.
    Status by release: applied 0.5.10-0.5.22; not needed 0.5.23+.

Detection
    Structural, on the installed ``TritonAttnBackend``: the draft-extend graph half is needed
    where ``_update_draft_extend_buffers`` (0.5.13+) or, before it, the draft-extend branch of
    ``init_forward_metadata_capture_cuda_graph`` calls no ``update_sliding_window_buffer``;
    the eager half where ``init_forward_metadata`` has a ``is_draft_extend()`` branch that
    calls none. A release whose window helper takes parameters this module cannot supply is
    unknown (skipped with a warning).

Delete when
    The oldest supported sglang is 0.5.23 or later.
"""

from __future__ import annotations

import ast
import functools
import inspect

from sglang_swa_plugin.fix import Detection, Fix, hookimpl
from sglang_swa_plugin.probe import calls, callee, function_tree, optional_module, own_function, target_class

MODULE = "sglang.srt.layers.attention.triton_backend"
NAME = "triton_swa_draft"
CLASS = MODULE + ".TritonAttnBackend"
EAGER = CLASS + ".init_forward_metadata"
CAPTURE = CLASS + ".init_forward_metadata_capture_cuda_graph"  # 0.5.10-0.5.12
REPLAY = CLASS + ".init_forward_metadata_replay_cuda_graph"  # 0.5.10-0.5.12
FILL = CLASS + "._update_draft_extend_buffers"  # 0.5.13+
BUILD = CLASS + "._build_cuda_graph_forward_metadata"  # 0.5.13+
HELPERS = frozenset({"update_sliding_window_buffer", "update_sliding_window_buffer_cuda_graph"})


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


def _values(self, lens, req_pool_indices, bs, out, plan) -> dict:
    return {"window_kv_indptr": self.window_kv_indptr, "req_to_token": self.req_to_token,
            "sliding_window_size": self.sliding_window_size, "seq_lens": lens,
            "req_pool_indices": req_pool_indices[:bs], "bs": bs, "device": self.device,
            "token_to_kv_pool_allocator": getattr(self, "token_to_kv_pool_allocator", None),
            "token_to_kv_pool": getattr(self, "token_to_kv_pool", None), "window_kv_indices": out,
            "translator": getattr(self, "kv_index_translator", None), "plan": plan}


def fill_window(self, kv_indptr, req_pool_indices, bs: int, out=None, plan=None):
    """The window rail of the keys ``kv_indptr`` gives the full layers (the last
    ``sliding_window_size`` of each request's), built by sglang's own helper into ``out`` (a
    CUDA-graph buffer) or a fresh tensor: ``(window_kv_indptr, window_kv_indices, lens,
    start)``. Device ops only (the helper's own, as sglang's verify graphs run it)."""
    lens = kv_indptr[1 : bs + 1] - kv_indptr[:bs]
    fn, params = _helper(out is not None)
    values = _values(self, lens, req_pool_indices, bs, out, plan)
    return fn(**{p.name: values[p.name] for p in params if p.name in values})


def _bound(original, args, kwargs) -> dict:
    return inspect.signature(original).bind(*args, **kwargs).arguments


def _eager(original, self, forward_batch, *args, **kwargs):
    result = original(self, forward_batch, *args, **kwargs)
    md = self.forward_metadata
    if _draft_extend(forward_batch.forward_mode, v2=False) and _has_window(self) and md.window_kv_indices is None:
        bs = md.kv_indptr.shape[0] - 1
        md.window_kv_indptr, md.window_kv_indices, _, md.window_kv_offsets = fill_window(
            self, md.kv_indptr, forward_batch.req_pool_indices, bs)
    return result


def _point_at_buffers(self, md, bs: int) -> None:
    md.window_kv_indptr = self.window_kv_indptr[: bs + 1]
    md.window_kv_indices = self.cuda_graph_window_kv_indices
    md.window_kv_offsets = self.cuda_graph_window_kv_offsets


def _graph_fill(self, kv_indptr, req_pool_indices, bs: int, plan=None) -> None:
    _, _, _, start = fill_window(self, kv_indptr, req_pool_indices, bs, out=self.cuda_graph_window_kv_indices,
                                 plan=plan)
    self.cuda_graph_window_kv_offsets[:bs] = start


def _capture(original, self, *args, **kwargs):  # 0.5.10-0.5.12
    result = original(self, *args, **kwargs)
    a = _bound(original, (self, *args), kwargs)
    bs, md = a["bs"], self.forward_metadata
    if _draft_extend(a["forward_mode"]) and _has_window(self) and md.window_kv_indices is None:
        _graph_fill(self, md.kv_indptr, a["req_pool_indices"], bs)
        _point_at_buffers(self, md, bs)
    return result


def _replay(original, self, *args, **kwargs):  # 0.5.10-0.5.12
    result = original(self, *args, **kwargs)
    a = _bound(original, (self, *args), kwargs)
    bs = a["bs"]
    if _draft_extend(a["forward_mode"]) and _has_window(self):
        _graph_fill(self, self.kv_indptr[: bs + 1], a["req_pool_indices"], bs)
    return result


def _fill(original, self, *args, **kwargs):  # 0.5.13+: capture and replay
    result = original(self, *args, **kwargs)
    if _has_window(self):
        a = _bound(original, (self, *args), kwargs)
        _graph_fill(self, result[1], a["req_pool_indices"], a["bs"], plan=a.get("plan"))
    return result


def _build(original, self, *args, **kwargs):  # 0.5.13+: the captured metadata
    md = original(self, *args, **kwargs)
    a = _bound(original, (self, *args), kwargs)
    if _draft_extend(a["forward_mode"]) and _has_window(self) and md.window_kv_indices is None:
        _point_at_buffers(self, md, a["bs"])
    return md


# ---------------------------------------------------------------------------- detection


def _draft_extend_branches(fn) -> list:
    """The ``if``/``elif`` branches of ``fn`` whose test asks ``is_draft_extend*()``."""
    tree, _ = function_tree(fn)
    return [n for n in ast.walk(tree) if isinstance(n, ast.If) and any(
        isinstance(c, ast.Call) and (callee(c) or "").startswith("is_draft_extend") for c in ast.walk(n.test))]


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
    return got


def _helper_gap() -> "str | None":
    """A required parameter of sglang's window helper(s) that ``fill_window`` cannot supply."""
    known = {"window_kv_indptr", "req_to_token", "sliding_window_size", "seq_lens", "req_pool_indices", "bs",
             "device", "token_to_kv_pool_allocator", "token_to_kv_pool", "window_kv_indices", "translator", "plan"}
    for in_graph in (False, True):
        for p in _helper(in_graph)[1]:
            if p.default is inspect.Parameter.empty and p.name not in known:
                return f"{_helper(in_graph)[0].__name__} takes {p.name!r}"
    return None


_probed: dict = {}


def classify() -> Detection:
    if optional_module(MODULE) is None:
        return Detection.not_applicable("this sglang has no Triton attention backend")
    try:
        got = probe(target_class(CLASS))
        gap = _helper_gap()
    except Exception as e:  # noqa: BLE001
        return Detection.unknown(f"Triton draft-extend metadata could not be read: {type(e).__name__}: {e}")
    _probed.clear()
    _probed.update(got)
    wrong = [half for half, ok in got.items() if ok is False]
    if not wrong:
        return Detection.not_needed("Triton draft extend builds window KV indices, eager and in CUDA graphs")
    if gap:
        return Detection.unknown(f"the window helper moved: {gap}")
    what = {"eager": "eager DRAFT_EXTEND builds no window KV indices",
            "graph": "CUDA-graph draft extend builds no window KV indices (window_kv_indices=None)"}
    return Detection.needed("; ".join(what[h] for h in wrong))


class TritonSwaDraftFix(Fix):
    name = NAME
    summary = "Triton draft extend builds window KV indices (SWA space) for sliding-window draft layers"
    upstream_prs = ("#29858", "#24481", "#22679")
    targets = (EAGER,)
    target_params = {EAGER: ("self", "forward_batch")}
    check_module = "sglang_swa_plugin.check.triton_swa_draft"

    @property
    def _graph_targets(self) -> tuple:
        cls = target_class(CLASS)
        return (FILL, BUILD) if own_function(cls, FILL.rsplit(".", 1)[1]) is not None else (CAPTURE, REPLAY)

    def detect(self) -> Detection:
        det = classify()
        try:
            self.targets = (EAGER, *self._graph_targets)
        except Exception:  # noqa: BLE001 - no backend: the targets stay as declared
            pass
        return det

    def install(self, hooks) -> None:
        if not _probed:
            classify()
        if _probed.get("eager") is False:
            hooks.around(EAGER, _eager)
        if _probed.get("graph") is False:
            graph = self._graph_targets
            hooks.around(graph[0], _fill if graph[0] == FILL else _capture)
            hooks.around(graph[1], _build if graph[1] == BUILD else _replay)


FIX = TritonSwaDraftFix()


@hookimpl
def sglang_swa_plugin_fixes():
    return [FIX]
