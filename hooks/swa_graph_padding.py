"""CUDA-graph replay of a padded batch: the padded rows' SWA write locations are cleared.

Bug
    ``DecodeInputBuffers.populate_from_forward_batch`` zeroes ``out_cache_loc`` but copies
    ``out_cache_loc_swa`` for the real rows only: padded rows write K/V through an earlier
    replay's SWA slots, into live requests (wrong tokens, CUDA graphs on, every backend).
    Fix: after sglang filled the buffers, ``out_cache_loc_swa[raw_num_token:]`` is zeroed.
Upstream PRs
    #24743 (the buffer came with #23552).
Affected versions
    sglang 0.5.11 (0.5.10 has no separate SWA locations; 0.5.12 clears them).
    Status by release: not applicable 0.5.10; applied 0.5.11; not needed 0.5.12; not applicable 0.5.13+.
Detection
    Text of ``populate_from_forward_batch``: copies into ``out_cache_loc_swa`` and never
    clears it: needed; clears it: not needed. No ``out_cache_loc_swa`` in the forward batch or
    the buffers: not applicable (0.5.10, 0.5.13+); the buffers' method gone: target moved.
Delete when
    The oldest supported sglang is 0.5.12 or later.
"""

from __future__ import annotations

import re

from sglang_swa_plugin import state
from sglang_swa_plugin.fix import Detection, Fix, TargetMissing, around
from sglang_swa_plugin.probe import function_text, own_function, target_class

NAME = "swa_graph_padding"
MODULE = "sglang.srt.model_executor.cuda_graph_runner"
TARGET = f"{MODULE}.DecodeInputBuffers.populate_from_forward_batch"
_CLEARS = re.compile(r"out_cache_loc_swa(\[[^\]]*\])?\s*\.\s*(zero_|fill_)\s*\(")


TAILS = "padded_tails"  # in a buffers object's state: {raw_num_token: (out_cache_loc_swa, its tail)}


def _tail(self, swa, start: int):
    """``swa[start:]``, the view made once per start (slicing costs as much as the zero_)."""
    tails = state.of(self).setdefault(TAILS, {})
    got = tails.get(start)
    if got is None or got[0] is not swa:  # first time, or the buffer was replaced
        got = tails[start] = (swa, swa[start:])
    return got[1]


def _clear_padded_swa_locs(original, self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    swa = getattr(self, "out_cache_loc_swa", None)
    if swa is not None and kwargs.get("bs") != kwargs.get("raw_bs"):
        _tail(self, swa, kwargs["raw_num_token"]).zero_()
    return result


def _carries_swa_locs(cls: type) -> bool:
    return "out_cache_loc_swa" in {**getattr(cls, "__annotations__", {}), **getattr(cls, "__dataclass_fields__", {})}


def classify() -> Detection:
    # The feature: separate SWA write locations on the forward batch (gone in 0.5.13); where
    # the batch has them, the buffers this fix hooks must be there (a rename is "target moved").
    if not _carries_swa_locs(target_class("sglang.srt.model_executor.forward_batch_info.ForwardBatch")):
        return Detection.not_applicable("this sglang's forward batch carries no separate SWA write locations")
    buffers = target_class(f"{MODULE}.DecodeInputBuffers")
    fn = own_function(buffers, "populate_from_forward_batch")
    if fn is None:
        raise TargetMissing(TARGET)
    if not _carries_swa_locs(buffers):
        return Detection.not_applicable("the CUDA-graph input buffers carry no separate SWA write locations")
    text = function_text(fn)
    if "out_cache_loc_swa" not in text:
        return Detection.unknown("DecodeInputBuffers carries out_cache_loc_swa, but populate_from_forward_batch never "
                                 "writes it")
    if _CLEARS.search(text):
        return Detection.not_needed("padded replays clear the SWA write locations")
    return Detection.needed("padded CUDA-graph replays keep an earlier batch's SWA write locations in the padded rows")


class SwaGraphPaddingFix(Fix):
    name = NAME
    summary = "padded CUDA-graph replays write the padded rows' KV into no live request's SWA slots"
    upstream_prs = ("#24743",)
    targets = (TARGET,)
    target_params = {TARGET: ("self", "forward_batch", "raw_bs", "raw_num_token", "bs")}
    check_module = "sglang_swa_plugin.check.swa_graph_padding"

    def detect(self) -> Detection:
        return classify().with_plan(around(TARGET, _clear_padded_swa_locs))


FIX = SwaGraphPaddingFix()
