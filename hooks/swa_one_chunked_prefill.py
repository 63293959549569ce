"""One chunked prefill per pass on the hybrid SWA pool: no request is left half-prefilled.
Bug
    ``PrefillAdder.add_one_req`` may cut a request's prefill to the room of the SWA pool (the SWA
    chunk cap) while chunk budget is left, so the pass goes on and can cut a second request. Only
    the last cut request becomes ``new_chunked_req``; the first one's rest is never prefilled: its
    next token is sampled mid-prompt and it decodes over KV slots nobody wrote: a wrong request,
    on any backend, when the SWA pool is small or busy (retractions).
    Fix: in a hybrid SWA pass that has cut a request, the next request waits for the next pass
    (``AddReqResult.OTHER``), as a pass already ends when the chunk budget is what cut.
Upstream PRs
    #31681 (added the SWA chunk cap), #32700 (narrowed it; the same overwrite); none fixes it.
Affected versions
    0.5.16-0.5.23: the SWA chunk cap. Status by release: not needed 0.5.10-0.5.15; applied 0.5.16+.
Detection
    Structural: the adder cuts to an SWA chunk cap (``_swa_chunk_cap``; 0.5.21+: the SWA prefill
    budget's ``_chunk_cap`` through ``_check_prefill_budget``) and no method of it reads
    ``self.new_chunked_req`` (a refusal of a second cut): needed; no SWA cap: not needed.
Delete when
    sglang refuses a second chunked request in one prefill pass.
"""

from __future__ import annotations

import importlib
import inspect

from sglang_swa_plugin.fix import Detection, Fix, around
from sglang_swa_plugin.probe import function_text, is_attribute, nodes, function_tree, optional_module, own_function

NAME = "swa_one_chunked_prefill"
MODULE = "sglang.srt.managers.schedule_policy"
BUDGET_MODULE = "sglang.srt.mem_cache.prefill_budget"  # 0.5.21+
TARGET = MODULE + ".PrefillAdder.add_one_req"


def _one_chunked_prefill(original, self, *args, **kwargs):
    """Around ``PrefillAdder.add_one_req``: once this hybrid SWA pass has cut a request, the
    next one is not added (it stays in the waiting queue); else sglang's own admission."""
    if getattr(self, "new_chunked_req", None) is not None and getattr(self, "is_hybrid_swa", False):
        return importlib.import_module(MODULE).AddReqResult.OTHER
    return original(self, *args, **kwargs)


def _methods(cls) -> list:
    """The functions the class itself defines (staticmethods and classmethods unwrapped)."""
    return [fn for name in vars(cls) if inspect.isfunction(fn := own_function(cls, name))]


def swa_chunk_cap(adder) -> "str | None":
    """How the adder cuts a prefill to the SWA pool's room, or None where it cannot."""
    text = "".join(function_text(fn) for fn in _methods(adder))
    if "_swa_chunk_cap" in text:
        return "PrefillAdder._swa_chunk_cap"
    budget = getattr(optional_module(BUDGET_MODULE), "SWAPrefillBudget", None)
    check = own_function(budget, "check_prefill") if budget is not None else None
    if "_check_prefill_budget" in text and check is not None and "_chunk_cap" in function_text(check):
        return "SWAPrefillBudget._chunk_cap"
    return None


def refuses_second_cut(adder) -> bool:
    """A method of the adder other than ``__init__`` reads ``self.new_chunked_req``."""
    import ast

    return any(fn.__name__ != "__init__" and any(
        is_attribute(n, "new_chunked_req", "self") and isinstance(n.ctx, ast.Load) for n in nodes(function_tree(fn)[0]))
        for fn in _methods(adder))


def classify() -> Detection:
    adder = getattr(optional_module(MODULE), "PrefillAdder", None)
    if adder is None or own_function(adder, "add_one_req") is None:
        return Detection.unknown("no PrefillAdder.add_one_req in sglang.srt.managers.schedule_policy")
    if "new_chunked_req" not in function_text(own_function(adder, "__init__")):
        return Detection.unknown("PrefillAdder keeps no new_chunked_req")
    cap = swa_chunk_cap(adder)
    if cap is None:
        return Detection.not_needed("no SWA chunk cap: only the chunk budget cuts, and a cut ends the pass")
    if refuses_second_cut(adder):
        return Detection.not_needed("PrefillAdder reads new_chunked_req before another cut")
    return Detection.needed(f"the SWA chunk cap ({cap}) can cut a second request in one pass; "
                            "new_chunked_req keeps only the last")


class SwaOneChunkedPrefillFix(Fix):
    name = NAME
    summary = "hybrid SWA pool: one cut prefill per pass, no request left half-prefilled"
    upstream_prs = ("#31681", "#32700")
    targets = (TARGET,)
    target_params = {TARGET: ("self", "req")}
    check_module = "sglang_swa_plugin.check.swa_one_chunked_prefill"

    def detect(self) -> Detection:
        return classify().with_plan(around(TARGET, _one_chunked_prefill))


FIX = SwaOneChunkedPrefillFix()
