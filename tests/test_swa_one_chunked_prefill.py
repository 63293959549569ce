"""swa_one_chunked_prefill on sglang's real PrefillAdder (CPU): one prefill pass over a real hybrid
SWA pool (SWAKVPool, allocator, the release's SWA radix tree) smaller than two waiting prompts.
Stock (0.5.17+): the SWA chunk cap cuts both requests and ``new_chunked_req`` keeps only the
second, so the first is never prefilled to its end; with the fix the second waits for the next
pass. A pass that cuts nothing, and an adder over one pool, are left as sglang runs them."""

from __future__ import annotations

import importlib
import inspect

import pytest

from sglang_swa_plugin.check import swa_one_chunked_prefill as scen
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import swa_one_chunked_prefill as oc
from sglang_swa_plugin.probe import function_text, optional_module, own_function

from helpers import fixed_alone, methods_alone, scenario_or_skip, skip_unless_needed

FIX = oc.FIX
# On 0.5.10 importing the model runner runs the start-up hook, which installs the needed fixes:
# imported first, so that the tests below peel the fix off what sglang really holds.
importlib.import_module("sglang.srt.model_executor.model_runner")


def _adder():
    return importlib.import_module(oc.MODULE).PrefillAdder


def _methods():
    return {_adder(): ("add_one_req",)}


def _cap_depends_on_new_tokens() -> bool:
    """The SWA chunk cap keeps decode headroom by the request's remaining new tokens (0.5.17+),
    which lets a second request be cut after a first; 0.5.16's headroom varies only with a
    host-loaded prefix, which a CPU pass does not build."""
    cap = own_function(_adder(), "_swa_chunk_cap")
    if cap is None:
        budget = getattr(optional_module(oc.BUDGET_MODULE), "SWAPrefillBudget", None)
        cap = own_function(budget, "_chunk_cap") if budget is not None else None
    return cap is not None and "max_new_tokens" in inspect.signature(cap).parameters


def test_detection_is_decided():
    assert FIX.detect().verdict is not Verdict.UNKNOWN, FIX.detect().reason


def test_detection_reads_the_installed_code():
    """Needed exactly where the adder can cut a prefill to an SWA chunk cap (read here as text of
    PrefillAdder and the SWA prefill budget) and nothing in it reads new_chunked_req back."""
    adder = _adder()
    text = "".join(function_text(fn) for name in vars(adder)
                   if inspect.isfunction(fn := own_function(adder, name)))
    budget = getattr(optional_module(oc.BUDGET_MODULE), "SWAPrefillBudget", None)
    capped = "_swa_chunk_cap(" in text or (
        "_check_prefill_budget(" in text and budget is not None and "_chunk_cap(" in function_text(budget.check_prefill))
    read_back = "self.new_chunked_req is" in text or "if self.new_chunked_req" in text
    assert (FIX.detect().verdict is Verdict.NEEDED) == (capped and not read_back), FIX.detect()


def test_stock_cuts_two_requests_in_one_pass_and_tracks_only_the_last():
    skip_unless_needed(FIX)
    if not _cap_depends_on_new_tokens():
        pytest.skip("this SWA chunk cap's headroom varies only with host-loaded prefixes")
    with methods_alone(FIX, _methods()):
        out = scenario_or_skip("swa_one_chunked_prefill")
    assert out.bug, out.seen
    seen = out.seen
    assert seen["answers"] == ["CONTINUE", "CONTINUE"] and seen["cut"] == ["r0", "r1"], seen
    assert seen["new_chunked_req"] == "r1", seen  # r0's rest is tracked by nobody


def test_the_fix_leaves_one_cut_request_and_it_is_tracked():
    skip_unless_needed(FIX)
    with fixed_alone(FIX, _methods()):
        out = scenario_or_skip("swa_one_chunked_prefill")
    assert not out.bug, out.seen
    seen = out.seen
    assert seen["cut"] == ["r0"] and seen["new_chunked_req"] == "r0", seen
    assert seen["answers"][0] == "CONTINUE" and seen["answers"][-1] in ("OTHER", "NO_TOKEN"), seen
    if _cap_depends_on_new_tokens():
        assert seen["answers"] == ["CONTINUE", "OTHER"], seen  # the fix, not the budget, stopped r1


def test_the_waiting_request_keeps_its_state():
    """The refused request is not touched: not admitted, no prefill range set this pass, no
    lock taken; the scheduler offers it again next pass."""
    skip_unless_needed(FIX)
    with fixed_alone(FIX, _methods()):
        adder, reqs, _ = scen.one_pass()
    second = reqs[1]
    assert second not in adder.can_run_list and adder.new_chunked_req is reqs[0]
    assert getattr(second, "extend_range", None) is None and getattr(second, "extend_end", 0) in (0, None)


def test_a_pass_without_a_cut_is_sglangs():
    """An SWA pool large enough for both prompts: nothing is cut, both requests are admitted
    whole, with and without the fix."""
    for ctx in (methods_alone, fixed_alone):
        with ctx(FIX, _methods()):
            adder, reqs, answers = scen.one_pass(swa=1024)
        assert answers == ["CONTINUE", "CONTINUE"], answers
        assert [scen.extend_end(r) for r in reqs] == [scen.PROMPT, scen.PROMPT]
        assert adder.new_chunked_req is None


def test_one_pool_adders_pass_through():
    """The hook answers only for a hybrid SWA adder: on another adder it calls sglang's method."""
    calls = []

    def original(self, req, *a, **k):
        calls.append(req)
        return "sglang's answer"

    class OnePool:
        is_hybrid_swa, new_chunked_req = False, object()

    class Hybrid:
        is_hybrid_swa, new_chunked_req = True, None

    assert oc._one_chunked_prefill(original, OnePool(), "a") == "sglang's answer"
    assert oc._one_chunked_prefill(original, Hybrid(), "b") == "sglang's answer"
    assert calls == ["a", "b"]
    cut = Hybrid()
    cut.new_chunked_req = object()
    assert oc._one_chunked_prefill(original, cut, "c") is importlib.import_module(oc.MODULE).AddReqResult.OTHER
    assert calls == ["a", "b"]

