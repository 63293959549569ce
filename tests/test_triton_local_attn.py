"""triton_local_attn on a real TritonAttnBackend for Llama 4 over a real SWAKVPool (CPU; the Triton
kernels recorded): a chunked layer's queries must attend their own chunk, in SWA space, on
extend, on a chain's target verify and on decode (eager, and CUDA-graph capture and replay)."""

from __future__ import annotations

import importlib

import pytest

from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import triton_local_attn as tla

from helpers import fixed_alone, methods_alone, scenario_or_skip, skip_unless_needed

FIX = tla.FIX
PATHS = ("extend", "verify", "decode", "capture", "replay")


def _methods():
    return {importlib.import_module(tla.MODULE).TritonAttnBackend: ("__init__", "forward_decode", "forward_extend")}


def test_detection_is_decided():
    assert FIX.detect().verdict is not Verdict.UNKNOWN, FIX.detect().reason


def test_detection_reads_the_installed_backend():
    """Needed exactly where triton's backend module never reads ``use_irope`` (no release does)."""
    from sglang_swa_plugin.probe import module_tree

    tree = module_tree(tla.MODULE)
    if tree is None:
        pytest.skip("no triton backend")
    assert (FIX.detect().verdict is Verdict.NEEDED) is not tla._reads_use_irope(tree)


def test_stock_chunked_layer_attends_past_its_chunk_through_full_pool_ids():
    skip_unless_needed(FIX)
    with methods_alone(FIX, _methods()):
        out = scenario_or_skip("triton_local_attn")
    assert out.bug, out.seen
    assert not any(out.seen[p]["right"] for p in PATHS), out.seen
    # request 0 extends 13..22 across the chunk boundary at 16: its first query already reads too much
    assert "0@13" in out.seen["extend"]["wrong_queries"], out.seen


def test_the_fix_gives_each_query_its_own_chunk():
    skip_unless_needed(FIX)
    with fixed_alone(FIX, _methods()):
        out = scenario_or_skip("triton_local_attn")
    assert not out.bug, out.seen
    assert all(out.seen[p]["right"] for p in PATHS), out.seen
    assert out.seen["extend"]["queries"] == 20 and out.seen["decode"]["queries"] == 4, out.seen
    assert out.seen["verify"]["queries"] == 12, out.seen


@pytest.mark.parametrize("prefix,extend,chunk,want", [
    ([13, 0, 5], [10, 7, 3], 8, [(0, 8, 5, 3), (0, 16, 0, 7), (1, 0, 0, 7), (2, 0, 5, 3)]),
    ([0], [17], 8, [(0, 0, 0, 8), (0, 8, 0, 8), (0, 16, 0, 1)]),
    ([8], [1], 8, [(0, 8, 0, 1)]),
])
def test_virtual_requests_cut_new_tokens_at_chunk_boundaries(prefix, extend, chunk, want):
    assert tla.virtual_requests(prefix, extend, chunk) == want


def test_layers_outside_the_fix_are_left_to_sglang():
    """A layer with a window, or without ``use_irope``, or a backend whose runner has no chunk."""
    from types import SimpleNamespace

    be = SimpleNamespace(forward_metadata=object())
    vars(be)[tla.CHUNK] = 8
    assert tla._chunk_of(be, SimpleNamespace(use_irope=True, sliding_window_size=-1)) == 8
    assert tla._chunk_of(be, SimpleNamespace(use_irope=True, sliding_window_size=7)) is None
    assert tla._chunk_of(be, SimpleNamespace(use_irope=False, sliding_window_size=-1)) is None
    vars(be)[tla.CHUNK] = None
    assert tla._chunk_of(be, SimpleNamespace(use_irope=True, sliding_window_size=-1)) is None
