"""triton: an EAGLE verify applies a sliding window at each draft's position, not its row.
Bug
    Triton's extend kernel masks a sliding window by the query's row (``prefix + row``); a tree's
    drafts sit at ``L + depth``: a draft whose row is past its depth loses its window's oldest
    keys. Deterministic inference's unified kernel does so too, and reads sglang's mask (rows of
    ``L + n``) as rows of the window's keys: past the window, a chain's drafts (topk 1) attend
    later drafts. Either gives wrong tokens (trees: GPT-OSS EAGLE3, MiMo-V2 NEXTN).
    Fix: a tree's verify (and, a preview on 0.5.12+, any deterministic one) reads the last
    ``min(L, window)`` keys (SWA ids) under sglang's mask re-laid with each draft's window, the
    kernel's row window off.
Upstream PRs
    #39287 (open): window bounds from each draft's position; the deterministic path's mask re-laid.
Affected versions
    0.5.10-0.5.23 (EAGLE/NEXTN topk > 1 on triton, or any topk deterministic; sliding windows).
    Status by release: applied 0.5.10+.
Detection
    Syntax tree: the extend kernel ``_fwd_kernel`` takes ``SLIDING_WINDOW_SIZE`` and no query
    position (no parameter named ``pos``/``positions``): needed. A position parameter: not needed.
Delete when
    sglang's Triton extend kernels window by position in every supported release.
"""

from __future__ import annotations

import ast

from sglang_swa_plugin import triton_rail
from sglang_swa_plugin.config import PREVIEW
from sglang_swa_plugin.fix import Detection, Fix, around
from sglang_swa_plugin.log import warn_once
from sglang_swa_plugin.probe import module_tree

NAME = "triton_swa_tree_verify"
MODULE = "sglang.srt.layers.attention.triton_backend"
EXTEND = MODULE + ".TritonAttnBackend.forward_extend"
KERNEL_MODULES = ("sglang.kernels.ops.attention.extend_attention",  # 0.5.13+
                  "sglang.srt.layers.attention.triton_ops.extend_attention")
RAIL = "tree_window_rail"  # in the backend's state, per window (RAIL_window): see triton_rail.call_with_rail
# the kernel's own window (by row) off; the rail's mask windows each draft, over the kept keys too
KERNEL_ARGS = {"skip_prefix_custom_mask": False, "sliding_window_size": -1, "window_kv_offsets": None}
UNIFIED_ARGS = {"sliding_window_size": -1}  # deterministic inference's kernel: its window (by row) off likewise
DETERMINISTIC = "triton_swa_tree_verify_deterministic"  # the preview: the unified kernel's verify (no GPU run yet)


def _window_fields(self, forward_batch, window: int, swa: bool) -> dict:
    """Per request the last ``min(L, window)`` keys (those the shallowest draft sees); draft row
    ``r`` at position ``p`` sees a kept key at ``t`` iff ``p - t <= window``, an ancestor at
    ``p'`` iff ``p - p' <= window`` (sglang's extend kernel's rule, the model's)."""
    fields = triton_rail.tree_rail(self, forward_batch, "window", window, swa)
    aligned = {f: None for f in ("aligned_window_kv_indptr", "aligned_window_kv_indices")
               if hasattr(self.forward_metadata, f)}  # the unified kernel's tile-aligned window: not this rail's
    return {"window_kv_indptr": fields.pop("kv_indptr"), "window_kv_indices": fields.pop("kv_indices"), **fields,
            **aligned}


def _tree_window(original, self, q, k, v, layer, forward_batch, *args, **kwargs):
    """Around ``forward_extend``: a tree's verify on a sliding-window layer reads the rail; so
    does any verify (a chain too) that deterministic inference's unified kernel runs."""
    return _windowed(True, original, self, q, k, v, layer, forward_batch, *args, **kwargs)


def _tree_window_not_unified(original, self, q, k, v, layer, forward_batch, *args, **kwargs):
    """:func:`_tree_window` where sglang's unified kernel reads a sliding-window layer's new keys at
    full-pool ids (0.5.10-0.5.11): a deterministic verify runs as sglang runs it, named once."""
    return _windowed(False, original, self, q, k, v, layer, forward_batch, *args, **kwargs)


def _windowed(unified_covered: bool, original, self, q, k, v, layer, forward_batch, *args, **kwargs):
    window = getattr(layer, "sliding_window_size", None)
    unified = triton_rail.deterministic_kernel(self)
    verify = triton_rail.tree_verify(forward_batch) or unified and triton_rail.masked_verify(self, forward_batch)
    if window is None or window < 0 or not verify:
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    path = triton_rail.unsupported(self, unified=unified_covered and DETERMINISTIC in FIX.previews_on)
    if path == "deterministic inference" and unified_covered and hasattr(self, triton_rail.UNIFIED):
        path += f" (a preview: {PREVIEW}={DETERMINISTIC})"
    if path is not None:
        warn_once(NAME, path, "a verify's drafts lose keys of their window or attend others "
                              "(tokens can differ from the model)")
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    swa = triton_rail.in_swa_part(triton_rail.pool(self, forward_batch), layer)
    kernel = {"kernel_name": triton_rail.UNIFIED} if unified else {}
    return triton_rail.call_with_rail(original, self, f"{RAIL}_{window}", swa,
                                      lambda be, fb, sw: _window_fields(be, fb, window, sw),
                                      UNIFIED_ARGS if unified else KERNEL_ARGS,
                                      q, k, v, layer, forward_batch, *args, **kernel, **kwargs)


def kernel_parameters() -> "list | None":
    """The parameters of the installed Triton extend kernel (``_fwd_kernel``), None if not found."""
    for name in KERNEL_MODULES:
        tree = module_tree(name)
        for node in (tree.body if tree is not None else ()):
            if isinstance(node, ast.FunctionDef) and node.name == "_fwd_kernel":
                return [a.arg for a in node.args.args]
    return None


def unified_reads_swa_ids() -> "bool | None":
    """Whether the backend's unified extend path (deterministic inference) hands its kernel a
    sliding-window layer's new keys at SWA ids (it names them); None: no such path."""
    tree = module_tree(MODULE)
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_forward_extend_unified"),
              None) if tree is not None else None
    if fn is None:
        return None
    names = {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(fn)
             if isinstance(n, (ast.Attribute, ast.Name))}
    return bool(names & {"swa_out_cache_loc", "swa_loc", "translate_loc_from_full_to_swa"})


def classify() -> Detection:
    if module_tree(MODULE) is None:
        return Detection.not_applicable("this sglang has no triton attention backend")
    params = kernel_parameters()
    plan = (around(EXTEND, _tree_window if unified_reads_swa_ids() is not False else _tree_window_not_unified),)
    if params is None or "SLIDING_WINDOW_SIZE" not in params:
        return Detection.unknown("no Triton extend kernel _fwd_kernel with SLIDING_WINDOW_SIZE in "
                                 + ", ".join(KERNEL_MODULES))
    if any({"pos", "position", "positions"} & set(p.lower().split("_")) for p in params):
        return Detection.not_needed("the Triton extend kernel takes query positions", *plan)
    moved = triton_rail.missing_gather()
    if moved:
        return Detection.target_moved(moved)
    return Detection.needed("the Triton extend kernel windows a query by its row (prefix + row): a tree's drafts "
                            "past their depth lose keys of their window", *plan)


class TritonSwaTreeVerifyFix(Fix):
    name = NAME
    summary = ("triton: an EAGLE tree's verify (a preview: any deterministic verify) windows each draft at its "
               "position (sliding-window layers)")
    upstream_prs = ("#39287",)
    wraps = ("triton_local_attn",)
    targets = (EXTEND,)
    target_params = {EXTEND: ("self", "q", "k", "v", "layer", "forward_batch")}
    check_module = "sglang_swa_plugin.check.triton_swa_tree_verify"
    previews = {DETERMINISTIC: "--enable-deterministic-inference's verify (sglang's unified kernel, 0.5.12+), any "
                               "topk: the window's keys under the mask re-laid for them"}

    def detect(self) -> Detection:
        return classify()


FIX = TritonSwaTreeVerifyFix()
