"""flashinfer_swa_prefill on a real FlashInferAttnBackend over a real SWAKVPool (CPU; flashinfer's
prefill wrappers recorded): a prefill without a cached prefix must plan and run the sliding
layers' ragged attention with the window, and the full layers' without one; a paged-only
prefill must plan the sliding wrapper with the window."""

from __future__ import annotations

import pytest

from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import flashinfer_swa_prefill as fp

from helpers import fixed_alone, methods_alone, scenario_or_skip, skip_unless_needed

FIX = fp.FIX


def _methods():
    import importlib

    from sglang_swa_plugin.probe import optional_module

    # sglang's model runner first: on 0.5.10 importing it runs the plugin's start-up hook, which
    # installs the fix for good; what is peeled below must be peeled after that
    importlib.import_module("sglang.srt.model_executor.model_runner")
    mod = optional_module(fp.MODULE)
    if mod is None:
        return {}
    return {mod.FlashInferAttnBackend: ("__init__", "forward_extend"),
            mod.FlashInferIndicesUpdaterPrefill: ("update_sliding_window",)}


def _scenario(fixed: bool):
    """The scenario with sglang's methods as sglang defines them (the 0.5.10 start-up hook may
    have installed the fix already), then the fix installed where ``fixed``: before the backend
    is built, as at server start (the fix pairs the wrapper sglang builds in ``__init__``)."""
    if fixed:
        skip_unless_needed(FIX)
    with (fixed_alone if fixed else methods_alone)(FIX, _methods()):
        return scenario_or_skip("flashinfer_swa_prefill")


def test_detection_is_decided():
    assert FIX.detect().verdict is not Verdict.UNKNOWN, FIX.detect().reason


def test_stock_sliding_layers_prefill_over_the_whole_prompt():
    skip_unless_needed(FIX)
    out = _scenario(fixed=False)
    assert out.bug, out.seen
    assert out.seen["sliding"] == {"window_left": -1, "planned": -1}, out.seen
    # the paged-only plan of the sliding wrapper: windowed where sglang has #31501 (0.5.16+)
    paged_fixed = fp.PAGED_PLAN not in FIX.detect().targets
    assert out.seen["paged_plan"]["sliding"] == ([7] if paged_fixed else [-1]), out.seen


def test_sliding_layers_prefill_in_their_window_with_the_fix():
    out = _scenario(fixed=True)
    assert not out.bug, out.seen
    assert out.seen["sliding"] == {"window_left": 7, "planned": 7}, out.seen
    assert out.seen["full"] == {"window_left": -1, "planned": -1}, out.seen
    assert out.seen["paged_plan"] == {"sliding": [7], "full": [-1], "use_ragged": False}, out.seen


def _prefix_part_needed() -> bool:
    """The window plan has no ``if use_ragged:`` branch of its own (#26513 is not in this sglang)."""
    import inspect

    from sglang_swa_plugin.probe import optional_module

    mod = optional_module(fp.MODULE)
    return "if use_ragged" not in inspect.getsource(mod.FlashInferIndicesUpdaterPrefill.update_sliding_window)


def test_stock_cached_prefix_reads_unwritten_keys_where_sglang_lacks_26513():
    """A ragged prefill with cached prefixes: stock 0.5.10-0.5.12 plan the sliding paged part
    over keys up to each sequence's end (the extend's own keys, not written yet) with no mask;
    0.5.13+ (#26513) the prefix's last window keys with a mask."""
    skip_unless_needed(FIX)
    prefix = _scenario(fixed=False).seen["prefix"]
    if _prefix_part_needed():
        assert not any(r["right"] for r in prefix.values()), prefix
        assert all(r["unwritten_keys_read"] and not r["masked"] for r in prefix.values()), prefix
    else:
        assert all(r["right"] for r in prefix.values()), prefix


def test_the_fix_plans_the_cached_prefix_part_in_the_window():
    prefix = _scenario(fixed=True).seen["prefix"]
    assert all(r["right"] and not r["unwritten_keys_read"] for r in prefix.values()), prefix
    assert prefix["r0"]["masked"], prefix  # 4 queries over 7 prefix keys: not every key in every window


def test_the_prefix_mask_is_upstreams():
    """The mask the fix builds, on the cases of #26513's own form: None where every key is in
    every query's window; else per request, queries by rows."""
    import torch

    from sglang_swa_plugin.hooks.flashinfer_swa_prefill import prefix_window_mask

    assert prefix_window_mask([3], [4], 7) is None  # query 3 sees keys 0..2
    mask = prefix_window_mask([10, 0], [12, 5], 7, torch.device("cpu"))  # keys 3..9 for queries 10, 11
    assert mask.tolist() == [1] * 7 + [0] + [1] * 6  # query 11 does not see key 3


def test_the_pair_plans_both_and_runs_one():
    """Every plan reaches sglang's wrapper unchanged and the twin with the window; a run goes
    to the twin only while a layer of that window runs."""
    calls = []

    class W:
        def __init__(self, name):
            self.name = name

        def begin_forward(self, *a, **k):
            calls.append((self.name, "plan", k.get("window_left", -1)))

        def forward(self, *a, **k):
            calls.append((self.name, "run", k.get("window_left", -1)))

        forward_return_lse = forward
        other = "sglang's"

    pair = fp.WindowedRagged(W("full"), W("twin"), 7)
    pair.begin_forward(1, 2, q_data_type="bf16")
    pair.forward(1, 2, 3, causal=True)
    pair.layer_window = 7
    pair.forward_return_lse(1, 2, 3, causal=True, window_left=7)
    pair.layer_window = 3  # another window: sglang's wrapper, as sglang calls it
    pair.forward(1, 2, 3, causal=True)
    assert calls == [("full", "plan", -1), ("twin", "plan", 7), ("full", "run", -1), ("twin", "run", 7),
                     ("full", "run", -1)]
    assert pair.other == "sglang's"


def test_detection_reads_the_ragged_runs():
    """Needed exactly where a ragged run of ``forward_extend`` lacks ``window_left`` (read from
    the installed code's syntax tree, as the fix does)."""
    from sglang_swa_plugin.probe import optional_module, own_function

    mod = optional_module(fp.MODULE)
    if mod is None:
        assert FIX.detect().verdict is Verdict.NOT_APPLICABLE
        return
    runs = fp._ragged_calls(own_function(mod.FlashInferAttnBackend, "forward_extend"), {"forward", "forward_return_lse"})
    unwindowed = [c for c in runs if not any(k.arg == "window_left" for k in c.keywords)]
    assert (FIX.detect().verdict is Verdict.NEEDED) == bool(unwindowed), FIX.detect().reason


def test_detection_hooks_the_paged_plan_exactly_where_sglang_plans_it_without_the_window():
    import ast

    from sglang_swa_plugin.probe import function_tree, nodes, optional_module, own_function

    mod = optional_module(fp.MODULE)
    if mod is None or FIX.detect().verdict is not Verdict.NEEDED:
        pytest.skip(f"not needed here: {FIX.detect().reason}")
    fn = own_function(mod.FlashInferIndicesUpdaterPrefill, "update_sliding_window")
    planned = any(isinstance(n, ast.keyword) and n.arg == "window_left" for n in nodes(function_tree(fn)[0]))
    assert (fp.PAGED_PLAN in FIX.detect().targets) == (not planned)


def test_a_subclass_with_its_own_prefill_gets_no_twin():
    """trtllm_mha derives from FlashInferAttnBackend but prefills with its own kernels: nothing is
    paired (a twin would be planned at every prefill for nothing)."""
    from sglang_swa_plugin.check import testbed as tb

    skip_unless_needed(FIX)
    pool = tb.make_swa_pool()
    runner = tb.make_model_runner(kv_pool=pool, allocator=tb.make_swa_allocator(pool),
                                  req_to_token_pool=tb.make_req_to_token_pool(), attention_backend="trtllm_mha")
    with fixed_alone(FIX, _methods()):
        backend = tb.build_trtllm_backend(runner)
    assert not isinstance(getattr(backend, "prefill_wrapper_ragged", None), fp.WindowedRagged)
