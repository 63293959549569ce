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


def test_forms_the_fix_leaves_to_sglang_are_named_once(caplog):
    """A chunked layer on a form the fix does not correct (here decode context parallelism) runs
    as sglang runs it, with one warning per process naming the form; other layers: none."""
    import logging
    from types import SimpleNamespace

    be = SimpleNamespace(forward_metadata=object(), dcp_size=2)
    vars(be)[tla.CHUNK] = 8
    tla._warned.discard("decode context parallelism")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert tla._chunk_of(be, SimpleNamespace(use_irope=True, sliding_window_size=-1)) is None
        assert tla._chunk_of(be, SimpleNamespace(use_irope=True, sliding_window_size=7)) is None
    named = [r.getMessage() for r in caplog.records if "decode context parallelism" in r.getMessage()]
    assert len(named) == 1 and "triton_local_attn" in named[0], named


def test_a_tree_verify_runs_as_sglang_runs_it_and_is_named_once(caplog):
    """EAGLE topk 2 on a real TritonAttnBackend with the fix: sglang's own verify call (the whole
    context), and one warning that names the tree verify, however many layers and steps."""
    import logging

    import torch

    from sglang_swa_plugin.check import triton_local_attn as sc
    from sglang_swa_plugin.check.fa3_spec_translate import verify_input
    from sglang_swa_plugin.check.triton_swa_draft import cpu_triton

    skip_unless_needed(FIX)
    lens, n = sc.VERIFY_LENS, sc.DRAFTS
    mask = torch.cat([torch.ones(n, m + n, dtype=torch.bool).tril(m).flatten() for m in lens])
    positions = torch.cat([torch.arange(m, m + n) for m in lens])
    tla._warned.clear()
    calls = []
    with fixed_alone(FIX, _methods()), caplog.at_level(logging.WARNING):
        env = sc.build()
        fb = env.tb.make_forward_batch(env.runner, "target_verify", req_pool_indices=env.rows[:3], seq_lens=list(lens),
                                       spec_info=verify_input(mask, list(lens), 2, n, positions), attn_backend=env.backend)
        with cpu_triton(env.backend, calls):
            env.backend.init_forward_metadata(fb)
            for _ in range(2):
                call = sc._run(env, fb, "extend", calls)
    assert call is not None and call["custom_mask"] is not None, call  # sglang's own tree call
    assert int(call["kv_indptr"][-1]) == sum(lens), call  # the whole context, as stock
    named = [r.getMessage() for r in caplog.records if "topk > 1" in r.getMessage()]
    assert len(named) == 1 and "not corrected" in named[0], named
