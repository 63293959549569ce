"""triton_local_attn on a real TritonAttnBackend for Llama 4 over a real SWAKVPool (CPU; the Triton
kernels recorded): a chunked layer's queries must attend their own chunk, in SWA space, on
extend, on a chain's target verify and on decode (eager, and CUDA-graph capture and replay)."""

from __future__ import annotations

import importlib
import os

import pytest

from sglang_swa_plugin import log, state
from sglang_swa_plugin.chunked import reads_use_irope
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
    assert (FIX.detect().verdict is Verdict.NEEDED) is not reads_use_irope(tree)


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
    state.of(be)[tla.CHUNK] = 8
    assert tla._chunk_of(be, SimpleNamespace(use_irope=True, sliding_window_size=-1)) == 8
    assert tla._chunk_of(be, SimpleNamespace(use_irope=True, sliding_window_size=7)) is None
    assert tla._chunk_of(be, SimpleNamespace(use_irope=False, sliding_window_size=-1)) is None
    state.of(be)[tla.CHUNK] = None
    assert tla._chunk_of(be, SimpleNamespace(use_irope=True, sliding_window_size=-1)) is None


def test_forms_the_fix_leaves_to_sglang_are_named_once(caplog):
    """A chunked layer on a form the fix does not correct (here decode context parallelism) runs
    as sglang runs it, with one warning per process naming the form; other layers: none."""
    import logging
    from types import SimpleNamespace

    be = SimpleNamespace(forward_metadata=object(), dcp_size=2)
    state.of(be)[tla.CHUNK] = 8
    log.WARNED.discard((tla.NAME, "decode context parallelism"))
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert tla._chunk_of(be, SimpleNamespace(use_irope=True, sliding_window_size=-1)) is None
        assert tla._chunk_of(be, SimpleNamespace(use_irope=True, sliding_window_size=7)) is None
    named = [r.getMessage() for r in caplog.records if "decode context parallelism" in r.getMessage()]
    assert len(named) == 1 and "triton_local_attn" in named[0], named


def test_a_tree_verify_reads_its_chunk_and_a_chain_past_the_chunk_is_named_once(caplog):
    """On a real TritonAttnBackend with the fix, by default: EAGLE topk 2's verify reads each
    request's ``L % C`` keys of its chunk under a re-laid tree mask (no warning); a chain of more
    draft tokens than the chunk runs as sglang runs it (the whole context) and is named once."""
    import logging

    import torch

    from sglang_swa_plugin.check import triton_local_attn as sc
    from sglang_swa_plugin.check.fa3_spec_translate import verify_input
    from sglang_swa_plugin.check.triton_bench import cpu_triton

    skip_unless_needed(FIX)
    lens = sc.VERIFY_LENS
    log.WARNED.clear()
    seen = {}
    for topk, n in ((2, sc.DRAFTS), (1, sc.CHUNK + 1)):
        mask = torch.cat([torch.ones(n, m + n, dtype=torch.bool).tril(m).flatten() for m in lens])
        positions = torch.cat([torch.arange(m, m + n) for m in lens])
        calls = []
        with fixed_alone(FIX, _methods()), caplog.at_level(logging.WARNING):
            env = sc.build(drafts=n)
            fb = env.tb.make_forward_batch(env.runner, "target_verify", req_pool_indices=env.rows[:3],
                                           seq_lens=list(lens), spec_info=verify_input(mask, list(lens), topk, n, positions),
                                           attn_backend=env.backend)
            fb.positions = positions
            with cpu_triton(env.backend, calls):
                env.backend.init_forward_metadata(fb)
                for _ in range(2):
                    call = sc._run(env, fb, "extend", calls)
        seen[topk] = call
    tree, chain = seen[2], seen[1]
    assert tree is not None and tree["custom_mask"] is not None, tree
    assert int(tree["kv_indptr"][-1]) == sum(m % sc.CHUNK for m in lens), tree  # the chunk's keys only
    assert int(chain["kv_indptr"][-1]) == sum(lens), chain  # the whole context, as stock
    named = [r.getMessage() for r in caplog.records if "triton_local_attn" in r.getMessage()]
    assert len(named) == 1 and "more draft tokens than the chunk" in named[0], named


def test_each_query_attends_its_chunk_through_sglangs_kernels():
    """Through sglang's own Triton kernels (Triton's interpreter, CPU; float32): a plain extend
    crossing a chunk boundary, a decode batch, a chain's verify and two EAGLE
    trees' (drafts crossing a boundary, starting a chunk): every output row is the model's
    attention with the fix; stock's are not. Seeds: ``TREE_SEEDS`` (default 0,1)."""
    from interpreted import run_script

    skip_unless_needed(FIX)
    seeds = os.environ.get("TREE_SEEDS", "0,1").split(",")
    rows = run_script("interpreted_local_attn.py", seeds)
    paths = {"extend", "decode", "verify-chain", "verify-tree-depth2", "verify-tree-depth3"}
    assert len(rows) == len(paths) * len(seeds) and {r["path"] for r in rows} == paths, rows
    for row in rows:
        assert row["fixed"] < 1e-5, row  # float32 rounding
        assert row["stock"] > 0.1, row  # stock attends other keys: the comparison can fail


def test_the_tree_rail_replays_from_the_batch_buffers_without_a_sync():
    """The tree rail built inside a (CPU stand-in of a) CUDA-graph capture: no host-device sync,
    and a replay after the batch's buffers (lengths, positions, sglang's tree mask and its offsets)
    took another batch gives what that batch builds eagerly."""
    import torch

    from cpu_graph import replayed_tree_rail
    from sglang_swa_plugin.check import triton_local_attn as sc
    from sglang_swa_plugin.check.fa3_spec_translate import verify_input
    from sglang_swa_plugin.check.triton_bench import cpu_triton

    from interpreted import tree_inputs

    skip_unless_needed(FIX)
    n, batch = 4, tree_inputs((-1, 0, 0, 1))

    with fixed_alone(FIX, _methods()):
        env = sc.build()
        lens, lens2 = [14, 6, 3], [16, 7, 21]
        mask, positions = batch(lens)
        fb = env.tb.make_forward_batch(env.runner, "target_verify", req_pool_indices=env.rows[:3], seq_lens=lens,
                                       spec_info=verify_input(mask, lens, 2, n, positions), attn_backend=env.backend)
        fb.positions = positions.clone()
        with cpu_triton(env.backend, []):
            env.backend.init_forward_metadata(fb)
        captured, eager, syncs = replayed_tree_rail(env.backend, fb, lambda: tla._tree_fields(env.backend, fb, sc.CHUNK, True),
                                                    lens2, batch, n)
    assert syncs == [], syncs
    for name in ("kv_indptr", "kv_indices", "mask_indptr", "custom_mask"):
        assert torch.equal(captured[name], eager[name]), name
    # and the replayed mask is the second batch's, not the first's: request 2 (21 keys, drafts 21..23)
    # sees its chunk's 5 cached keys, request 0 (16 keys) none
    width = [m % sc.CHUNK + n for m in lens2]
    assert captured["mask_indptr"].tolist() == [0, n * width[0], n * (width[0] + width[1]), n * sum(width)]
