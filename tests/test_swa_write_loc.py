"""swa_write_loc on sglang's real eager multi-step draft decode (CPU): ``EagleDraftWorker.draft_forward``
of a sliding-window draft over a real hybrid SWA pool and allocator, its batch from the real
``ForwardBatch.init_new``, each step through the real ``ModelRunner._forward_raw``. Stock
(0.5.10-0.5.12): every step installs the batch's SWA locations of all steps (6) for its 2 keys and
the write fails; with the fix each step's keys land at its own SWA slots. A batch that keeps the
out_cache_loc it was translated from is left to sglang's translation."""

from __future__ import annotations

import importlib

from sglang_swa_plugin.check import swa_write_loc as scen
from sglang_swa_plugin.check import testbed as tb
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import swa_write_loc as wl
from sglang_swa_plugin.probe import function_text, own_function

from helpers import fixed_alone, methods_alone, scenario_or_skip, skip_unless_needed

FIX = wl.FIX
RUNNER = importlib.import_module(wl.RUNNER_MODULE).ModelRunner
METHODS = {RUNNER: ("_forward_raw",)}


def test_detection_is_decided():
    assert FIX.detect().verdict is not Verdict.UNKNOWN, FIX.detect().reason


def test_detection_reads_the_installed_code():
    """Needed exactly where the batch keeps one SWA translation (a ``ForwardBatch`` field that
    ``init_new`` fills) and ``_forward_raw`` installs it in the pool (read here as text)."""
    batch = importlib.import_module(wl.BATCH_MODULE).ForwardBatch
    kept = "out_cache_loc_swa" in batch.__dataclass_fields__ and (
        "ret.out_cache_loc_swa =" in function_text(own_function(batch, "init_new")))
    installed = "set_swa_loc(forward_batch.out_cache_loc_swa)" in function_text(own_function(RUNNER, "_forward_raw"))
    assert (FIX.detect().verdict is Verdict.NEEDED) == (kept and installed), FIX.detect()


def test_stock_draft_steps_write_through_all_steps_locations():
    skip_unless_needed(FIX)
    with methods_alone(FIX, METHODS):
        out = scenario_or_skip("swa_write_loc")
    assert out.bug and "shape mismatch" in out.seen["error"], out.seen
    assert f"[{scen.BATCH * scen.TOPK * scen.STEPS}," in out.seen["error"], out.seen  # all 3 steps' slots


def test_the_fix_writes_each_step_at_its_own_swa_slots():
    skip_unless_needed(FIX)
    with fixed_alone(FIX, METHODS):
        out = scenario_or_skip("swa_write_loc")
    assert not out.bug, out.seen
    steps = out.seen["steps"]
    assert [s["step"] for s in steps] == list(range(scen.STEPS - 1)) and all(s["ok"] for s in steps), steps
    assert steps[0]["want"] != steps[1]["want"], steps  # each step wrote its own keys
    assert steps[0]["full"] != steps[0]["swa_slots"], steps  # the ids differ: a translation was needed


def _batch():
    """A real draft batch from ``init_new`` with its SWA locations, and the runner whose allocator
    translated them (releases that keep such locations only)."""
    skip_unless_needed(FIX)
    runner, _pool, _layer, fb, _forwards = scen.build()
    return runner, fb


def _forward(runner, fb):
    """The hook around a stand-in for the rest of ``_forward_raw``: what it hands on."""
    seen = []
    wl._own_swa_loc(lambda self, batch, *a, **k: seen.append(batch.out_cache_loc_swa), runner, fb, False, None)
    return seen[0]


def test_a_batch_with_the_locations_it_was_translated_from_keeps_init_news_tensor():
    runner, fb = _batch()
    first = fb.out_cache_loc_swa
    assert first is not None and _forward(runner, fb) is first and _forward(runner, fb) is first and _forward(runner, fb) is first


def test_new_locations_of_the_same_length_are_translated_again():
    """A later forward of the batch with other locations (reordered, same count) gets theirs."""
    runner, fb = _batch()
    _forward(runner, fb)
    fb.out_cache_loc = fb.out_cache_loc.flip(0)
    handed = _forward(runner, fb)
    assert handed.tolist() == tb.translate(runner.token_to_kv_pool_allocator, fb.out_cache_loc).tolist()
    assert handed.tolist() != fb.out_cache_loc.tolist()  # SWA ids, not full ones
