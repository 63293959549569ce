"""swa_write_loc on sglang's real multi-step draft decode of a sliding-window draft (CPU), over a real
hybrid SWA pool and allocator whose full and SWA ids differ.
0.5.10-0.5.12: ``EagleDraftWorker.draft_forward`` eagerly, its batch from the real
``ForwardBatch.init_new``, each step through the real ``ModelRunner._forward_raw``. Stock: every step
installs the batch's SWA locations of all steps (6) for its 2 keys and the write fails; with the
fix each step's keys land at its own SWA slots. A batch that keeps the out_cache_loc it was
translated from is left to sglang's translation.
0.5.13+: fa3's multi-step metadata (eager, CUDA-graph capture, padded replay) and triton's step
``forward_decode`` writes (eager, capture). Stock: the steps hold the whole batch's locations (a
capture of more rows than the step's buffer fails; triton's writes land at other slots or have no
locations); with the fix each step holds and writes its own."""

from __future__ import annotations

import importlib
import inspect

import pytest

from sglang_swa_plugin.check import swa_write_loc as scen
from sglang_swa_plugin.check import testbed as tb
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import swa_write_loc as wl
from sglang_swa_plugin.probe import function_text, own_function

from helpers import fixed_alone, methods_alone, scenario_or_skip, skip_unless_needed

FIX = wl.FIX
RUNNER = importlib.import_module(wl.RUNNER_MODULE).ModelRunner
FA3 = importlib.import_module(wl.ATTN + "flashattention_backend").FlashAttentionBackend
TRITON = importlib.import_module(wl.ATTN + "triton_backend").TritonAttnBackend
METHODS = {RUNNER: ("_forward_raw",), FA3: ("init_forward_metadata", "init_forward_metadata_out_graph"),
           TRITON: ("forward_decode",)}
BATCH_FORM = "out_cache_loc_swa" in importlib.import_module(wl.BATCH_MODULE).ForwardBatch.__dataclass_fields__


def test_detection_is_decided():
    assert FIX.detect().verdict is not Verdict.UNKNOWN, FIX.detect().reason


def _whole_batch_metadata(cls) -> bool:
    """(read as text) ``cls.forward_decode`` writes through its metadata's SWA locations and its
    module never slices a draft's out_cache_loc per step."""
    module = importlib.import_module(cls.__module__)
    return ("forward_metadata.swa_out_cache_loc" in function_text(own_function(cls, "forward_decode"))
            and "per_step_draft_out_cache_loc" not in inspect.getsource(module))


def test_detection_reads_the_installed_code():
    """Needed exactly where the batch keeps one SWA translation (a ``ForwardBatch`` field that
    ``init_new`` fills) and ``_forward_raw`` installs it in the pool, or (without that field) where
    fa3's or triton's draft steps write through metadata locations of the whole batch (read here
    as text); the plan hooks exactly those."""
    batch = importlib.import_module(wl.BATCH_MODULE).ForwardBatch
    kept = BATCH_FORM and "ret.out_cache_loc_swa =" in function_text(own_function(batch, "init_new"))
    installed = "set_swa_loc(forward_batch.out_cache_loc_swa)" in function_text(own_function(RUNNER, "_forward_raw"))
    whole = {FA3: _whole_batch_metadata(FA3), TRITON: _whole_batch_metadata(TRITON)}
    det = FIX.detect()
    assert (det.verdict is Verdict.NEEDED) == ((kept and installed) or (not BATCH_FORM and any(whole.values()))), det
    if det.verdict is Verdict.NEEDED:
        hooked = {t.rsplit(".", 2)[-2] for t in det.targets}
        want = {"ModelRunner"} if BATCH_FORM else {cls.__name__ for cls, w in whole.items() if w}
        assert hooked == want, (hooked, want)


def test_stock_draft_steps_write_through_all_steps_locations():
    skip_unless_needed(FIX)
    if not BATCH_FORM:
        pytest.skip("the batch keeps no SWA locations here (the metadata form's tests below)")
    with methods_alone(FIX, METHODS):
        out = scenario_or_skip("swa_write_loc")
    assert out.bug and "shape mismatch" in out.seen["error"], out.seen
    assert f"[{scen.BATCH * scen.TOPK * scen.STEPS}," in out.seen["error"], out.seen  # all 3 steps' slots


def test_the_fix_writes_each_step_at_its_own_swa_slots():
    skip_unless_needed(FIX)
    if not BATCH_FORM:
        pytest.skip("the batch keeps no SWA locations here (the metadata form's tests below)")
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
    if not BATCH_FORM:
        pytest.skip("the batch keeps no SWA locations here")
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


# ------------------------------------------------------------------------- 0.5.13+: the metadata form

def _metadata_form_or_skip():
    skip_unless_needed(FIX)
    if BATCH_FORM:
        pytest.skip("the batch keeps the SWA locations here (the batch form's tests above)")


def test_stock_draft_steps_hold_the_whole_batchs_locations():
    """fa3: eager, each step holds the translation of all 3 steps (9 ids for 3 requests); a capture or a
    padded replay copies them into a 4-token buffer and fails, as the H100 server's start did (32 vs
    96). triton: eager, a step's keys are not at its slots (or the write fails on the length, 0.5.13);
    at capture there are no locations (AssertionError, as the server's)."""
    _metadata_form_or_skip()
    with methods_alone(FIX, METHODS):
        out = scenario_or_skip("swa_write_loc")
    assert out.bug, out.seen
    if "flashattention" in out.seen:
        fa = out.seen["flashattention"]
        assert all(len(s["held"]) == scen.REQUESTS * scen.STEPS for s in fa["eager"]["steps"]), fa["eager"]
        assert all("must match the size" in fa[p]["error"] for p in ("capture", "replay")), fa
    if "triton" in out.seen:
        tri = out.seen["triton"]
        assert not tri["eager"]["right"] and all(not s["right"] for s in tri["eager"]["steps"]), tri["eager"]
        assert all(s.get("error", "").startswith("AssertionError") for s in tri["capture"]["steps"]), tri["capture"]


def test_the_fix_gives_each_draft_step_its_own_locations():
    _metadata_form_or_skip()
    with fixed_alone(FIX, METHODS):
        out = scenario_or_skip("swa_write_loc")
    assert not out.bug, out.seen
    for backend, phases in out.seen.items():
        for phase, got in phases.items():
            steps = got["steps"]
            assert len(steps) == scen.STEPS - 1 and all(s["right"] for s in steps), (backend, phase, steps)
    if "flashattention" in out.seen:  # the replay's padded row keeps sglang's zero
        assert all(s["held"][-1] == 0 for s in out.seen["flashattention"]["replay"]["steps"])


def test_fa3_steps_of_a_topk_above_one_or_outside_a_draft_are_left_to_sglang():
    """The fa3 hook hands sglang's own out_cache_loc on where it must not slice: a decode without a
    draft input (the target's), a draft of topk 2 (its metadata reads the whole batch's locations)."""
    _metadata_form_or_skip()
    if not _whole_batch_metadata(FA3):
        pytest.skip("fa3 slices per draft step here")
    fa, _pool, allocator, runner, rows, multi = scen.fa3_env()
    step = multi.attn_backends[1]
    seen = []
    original = lambda self, fb, *a, **k: seen.append(fb.out_cache_loc)
    whole = tb.alloc_tokens(allocator, 3 * scen.STEPS)
    target = tb.make_forward_batch(runner, "decode", req_pool_indices=rows, seq_lens=[10, 12, 14], out_cache_loc=whole)
    wl._fa3_step_locations(original, step, target)
    draft = tb.make_forward_batch(runner, "draft_decode", req_pool_indices=rows, seq_lens=[10, 12, 14], out_cache_loc=whole)
    step.topk = 2
    wl._fa3_step_locations(original, step, draft)
    step.topk = 1
    wl._fa3_step_locations(original, step, draft)
    assert seen[0] is whole and seen[1] is whole, seen
    from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc

    assert seen[2].tolist() == per_step_draft_out_cache_loc(whole, 3, 1, scen.STEPS)[1].tolist()  # sglang's step 1
    assert draft.out_cache_loc is whole  # put back
