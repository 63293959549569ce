"""CPU scenario of ``one_pool_draft_extend``: what the multi-layer EAGLE draft-extend CUDA-graph
capture asks of a one-pool draft runner's KV pool (a real ``MHATokenToKVPool``). sglang's
``capture_one_batch_size`` translates the next step's write locations with
``token_to_kv_pool.translate_loc_from_full_to_swa`` (read from the installed source); the capture
itself needs CUDA graphs, so the scenario makes that call through what is installed on
``capture_one_batch_size`` (the fix's hook, where installed). Right: the call answers, with the
locations themselves (one pool: the sliding layers' ids are the full ids).
``python -m sglang_swa_plugin.check.one_pool_draft_extend`` prints one JSON line."""

from __future__ import annotations

from . import Outcome, print_outcome


def scenario() -> Outcome:
    """The translation sglang's draft-extend capture asks of a one-pool KV cache, through the
    installed capture hooks: ``seen`` has the answer or the error."""
    from types import SimpleNamespace

    import torch

    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.hooks import one_pool_draft_extend as op
    from sglang_swa_plugin.patching import target_marked_by
    from sglang_swa_plugin.probe import optional_module, own_function

    from . import testbed as tb

    mod = optional_module(op.MODULE)
    cls = getattr(mod, "MultiLayerEagleDraftExtendCudaGraphRunner", None) if mod is not None else None
    capture = own_function(cls, "capture_one_batch_size") if cls is not None else None
    if capture is None or not op._pool_translations(capture):
        raise ScenarioUnavailable(f"{op.MODULE}: the draft-extend capture does not translate through the pool")
    pool, loc = tb.make_full_pool(), torch.tensor([3, 7, 11])
    runner = SimpleNamespace(model_runner=SimpleNamespace(token_to_kv_pool=pool))

    def sglang_statement(self, bs, forward):  # the capture's call, as its source has it
        return self.model_runner.token_to_kv_pool.translate_loc_from_full_to_swa(loc)

    installed = target_marked_by(op.TARGET) == op.FIX.name
    try:
        got = op._one_pool_capture(sglang_statement, runner, 1, None) if installed else sglang_statement(runner, 1, None)
    except AttributeError as e:
        return Outcome(True, {"pool": type(pool).__name__, "error": f"AttributeError: {e}"})
    return Outcome(not torch.equal(got, loc), {"pool": type(pool).__name__, "answered": got.tolist()})


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
