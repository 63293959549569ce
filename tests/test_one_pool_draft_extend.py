"""one_pool_draft_extend: the multi-layer EAGLE draft-extend capture calls the pool's SWA
translation whatever the pool. Detection on the installed runner's code; the hook on sglang's
real pools (an ``MHATokenToKVPool`` translates as the identity for the capture and only then; an
``SWAKVPool`` keeps its own translation). The capture itself needs CUDA graphs (GPU rows)."""

from __future__ import annotations

import torch

from sglang_swa_plugin.check import testbed as tb
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import one_pool_draft_extend as op
from sglang_swa_plugin.probe import optional_module, own_function

FIX = op.FIX


class _Runner:
    """The two attributes the hook reads (the runner itself needs a draft worker and CUDA)."""

    def __init__(self, pool):
        self.model_runner = type("ModelRunner", (), {"token_to_kv_pool": pool})()


def test_detection_is_decided():
    assert FIX.detect().verdict is not Verdict.UNKNOWN, FIX.detect().reason


def test_detection_reads_the_capture():
    mod = optional_module(op.MODULE)
    cls = getattr(mod, "MultiLayerEagleDraftExtendCudaGraphRunner", None) if mod is not None else None
    if cls is None:
        assert FIX.detect().verdict is Verdict.NOT_APPLICABLE
        return
    capture = own_function(cls, "capture_one_batch_size")
    if capture is None:  # 0.5.14+: the runner has no capture of its own, nor any translation
        assert FIX.detect().verdict is Verdict.NOT_NEEDED, FIX.detect().reason
        return
    calls = op._pool_translations(capture)
    assert (FIX.detect().verdict is Verdict.NEEDED) == bool(calls), FIX.detect().reason


def test_a_one_pool_capture_translates_as_the_identity_only_while_capturing():
    pool = tb.make_full_pool()
    loc = torch.tensor([5, 9, 2])
    assert not hasattr(pool, op.METHOD)

    def capture(self, bs, forward):
        return self.model_runner.token_to_kv_pool.translate_loc_from_full_to_swa(loc)

    assert torch.equal(op._one_pool_capture(capture, _Runner(pool), 4, None), loc)
    assert not hasattr(pool, op.METHOD)  # gone after the capture


def test_an_swa_pool_keeps_its_own_translation():
    pool = tb.make_swa_pool()
    alloc = tb.make_swa_allocator(pool)
    tb.diverge(alloc, 11)
    loc = tb.alloc_tokens(alloc, 3)
    want = pool.translate_loc_from_full_to_swa(loc)

    def capture(self, bs, forward):
        return self.model_runner.token_to_kv_pool.translate_loc_from_full_to_swa(loc)

    got = op._one_pool_capture(capture, _Runner(pool), 4, None)
    assert torch.equal(got, want) and not torch.equal(got, loc), (got, loc)


def test_the_scenario_shows_the_crash_on_stock_and_the_answer_with_the_fix():
    from sglang_swa_plugin.core import temporarily_installed

    import importlib

    from helpers import methods_alone, scenario_or_skip, skip_unless_needed

    skip_unless_needed(FIX)
    # the model runner first: on 0.5.10 importing it runs the start-up hook, which installs the fix
    importlib.import_module("sglang.srt.model_executor.model_runner")
    runner_cls = optional_module(op.MODULE).MultiLayerEagleDraftExtendCudaGraphRunner
    with methods_alone(FIX, {runner_cls: ("capture_one_batch_size",)}):
        out = scenario_or_skip("one_pool_draft_extend")
    assert out.bug and "translate_loc_from_full_to_swa" in out.seen["error"], out.seen
    with temporarily_installed(FIX):
        out = scenario_or_skip("one_pool_draft_extend")
    assert not out.bug and out.seen["answered"] == [3, 7, 11], out.seen
