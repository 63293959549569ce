"""triton: an EAGLE tree's verify applies a sliding window at each draft's position, not its row.
Bug
    Triton's extend kernel masks a sliding window by the query's row in the batch
    (``prefix + row``); a tree's drafts sit at ``L + depth``, and a draft whose row is past its
    depth loses the oldest keys of its window. Through sglang's kernel (CPU): those drafts' rows
    differ from the model by 0.2-1.0. On an H200, MiMo-V2 NEXTN topk 2 on triton, 0.5.11 and
    0.5.17: 1-12/32 requests equal to the float32 model (topk 1: 32/32). Fix: on a sliding
    layer, a tree's verify reads the last ``min(L, window)`` keys (SWA ids) under sglang's tree
    mask re-laid with each draft's window, the kernel's row window off; fixed-size device ops.
Upstream PRs
    None: no release passes query positions to the Triton extend kernel.
Affected versions
    0.5.10-0.5.23 (EAGLE/NEXTN topk > 1 on triton with sliding-window layers).
    Status by release: applied 0.5.10+.
Detection
    Syntax tree: the extend kernel ``_fwd_kernel`` takes ``SLIDING_WINDOW_SIZE`` and no query
    position (no parameter named ``pos``/``positions``): needed. A position parameter: not needed.
Delete when
    sglang's Triton extend kernel windows by position in every supported release.
"""

from __future__ import annotations

import ast

from sglang_swa_plugin import triton_rail
from sglang_swa_plugin.fix import Detection, Fix, around, hookimpl
from sglang_swa_plugin.log import warn_once
from sglang_swa_plugin.probe import module_tree

NAME = "triton_swa_tree_verify"
MODULE = "sglang.srt.layers.attention.triton_backend"
EXTEND = MODULE + ".TritonAttnBackend.forward_extend"
KERNEL_MODULES = ("sglang.kernels.ops.attention.extend_attention",  # 0.5.13+
                  "sglang.srt.layers.attention.triton_ops.extend_attention")
RAIL = "_sglang_swa_plugin_tree_window_rail"  # on the backend, per window: see triton_rail.call_with_rail
# the kernel's own window (by row) off; the rail's mask windows each draft, over the kept keys too
KERNEL_ARGS = {"skip_prefix_custom_mask": False, "sliding_window_size": -1, "window_kv_offsets": None}


def _window_fields(self, forward_batch, window: int, swa: bool) -> dict:
    """Per request the last ``min(L, window)`` keys (those the shallowest draft sees); draft row
    ``r`` at position ``p`` sees a kept key at ``t`` iff ``p - t <= window``, an ancestor at
    ``p'`` iff ``p - p' <= window`` (sglang's extend kernel's rule, the model's)."""
    fields = triton_rail.tree_rail(self, forward_batch, "window", window, swa)
    return {"window_kv_indptr": fields.pop("kv_indptr"), "window_kv_indices": fields.pop("kv_indices"), **fields}


def _tree_window(original, self, q, k, v, layer, forward_batch, *args, **kwargs):
    """Around ``forward_extend``: a tree's verify on a sliding-window layer reads the rail."""
    window = getattr(layer, "sliding_window_size", None)
    if window is None or window < 0 or not triton_rail.tree_verify(forward_batch):
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    path = triton_rail.unsupported(self)
    if path is not None:
        warn_once(NAME, path, "an EAGLE tree's drafts past their depth lose the oldest keys of their "
                                          "window (tokens can differ from the model)")
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    swa = triton_rail.in_swa_part(triton_rail.pool(self, forward_batch), layer)
    return triton_rail.call_with_rail(original, self, f"{RAIL}_{window}", swa,
                                      lambda be, fb, sw: _window_fields(be, fb, window, sw), KERNEL_ARGS,
                                      q, k, v, layer, forward_batch, *args, **kwargs)


def kernel_parameters() -> "list | None":
    """The parameters of the installed Triton extend kernel (``_fwd_kernel``), None if not found."""
    for name in KERNEL_MODULES:
        tree = module_tree(name)
        for node in (tree.body if tree is not None else ()):
            if isinstance(node, ast.FunctionDef) and node.name == "_fwd_kernel":
                return [a.arg for a in node.args.args]
    return None


def classify() -> Detection:
    if module_tree(MODULE) is None:
        return Detection.not_applicable("this sglang has no triton attention backend")
    params = kernel_parameters()
    plan = (around(EXTEND, _tree_window),)
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
    summary = "triton: an EAGLE tree's verify windows each draft at its position (sliding-window layers)"
    upstream_prs = ()
    targets = (EXTEND,)
    target_params = {EXTEND: ("self", "q", "k", "v", "layer", "forward_batch")}
    check_module = "sglang_swa_plugin.check.triton_swa_tree_verify"

    def detect(self) -> Detection:
        return classify()


FIX = TritonSwaTreeVerifyFix()


@hookimpl
def sglang_swa_plugin_fixes():
    return [FIX]
