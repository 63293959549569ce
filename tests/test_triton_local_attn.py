"""triton_local_attn on a real TritonAttnBackend for Llama 4 over a real SWAKVPool (CPU; the Triton
kernels recorded): a chunked layer's queries must attend their own chunk, in SWA space, on
extend, on a chain's target verify and on decode (eager, and CUDA-graph capture and replay)."""

from __future__ import annotations

import contextlib
import importlib
import os

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
    FIX.previews_on = frozenset()  # the preview off, as by default
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
    assert f"SGLANG_SWA_PLUGIN_PREVIEW={tla.TREE}" in named[0], named  # what turns the correction on


def test_each_query_attends_its_chunk_through_sglangs_kernels():
    """Through sglang's own Triton kernels (Triton's interpreter, CPU; float32): a plain extend
    crossing a chunk boundary, a decode batch, a chain's verify and, with the preview on, two EAGLE
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
    """The preview's rail built inside a (CPU stand-in of a) CUDA-graph capture: no host-device sync,
    and a replay after the batch's buffers (lengths, positions, sglang's tree mask and its offsets)
    took another batch gives what that batch builds eagerly."""
    import torch

    from cpu_graph import CpuGraph
    from sglang_swa_plugin.check import triton_local_attn as sc
    from sglang_swa_plugin.check.fa3_spec_translate import verify_input
    from sglang_swa_plugin.check.flashinfer_swa_verify import KvIndicesTwin
    from sglang_swa_plugin.check.triton_swa_draft import cpu_triton
    from sglang_swa_plugin.probe import optional_module, swapped

    from interpreted import ancestors

    skip_unless_needed(FIX)
    n, parent = 4, (-1, 0, 0, 1)
    tree = torch.tensor([[k in ancestors(parent, i) for k in range(n)] for i in range(n)])
    depth = [len(ancestors(parent, i)) - 1 for i in range(n)]

    def batch(lens):
        mask = torch.cat([torch.cat([torch.ones(n, m, dtype=torch.bool), tree], 1).flatten() for m in lens])
        positions = torch.tensor([m + d for m in lens for d in depth])
        return mask, positions

    graph = CpuGraph()

    class GraphedGather:  # sglang's gather as one recorded kernel (its torch twin)
        def __getitem__(self, grid):
            return graph.kernel(KvIndicesTwin()[grid])

    with fixed_alone(FIX, _methods()):
        env = sc.build()
        lens = [14, 6, 3]
        mask, positions = batch(lens)
        fb = env.tb.make_forward_batch(env.runner, "target_verify", req_pool_indices=env.rows[:3], seq_lens=lens,
                                       spec_info=verify_input(mask, lens, 2, n, positions), attn_backend=env.backend)
        fb.positions = positions.clone()
        with cpu_triton(env.backend, []):
            env.backend.init_forward_metadata(fb)
        md = env.backend.forward_metadata
        md.custom_mask = torch.cat([md.custom_mask, torch.zeros(4096, dtype=md.custom_mask.dtype)])  # static room
        with contextlib.ExitStack() as stack:
            for module in dict.fromkeys(optional_module(m) for m in tla.GATHER_MODULES):
                if hasattr(module, tla.GATHER):
                    stack.enter_context(swapped(module, tla.GATHER, GraphedGather()))
            with graph.capture():
                captured = tla._tree_fields(env.backend, fb, sc.CHUNK, True)
            assert graph.syncs == [], graph.syncs
            # the next batch in the same buffers, then the replay
            lens2 = [16, 7, 21]
            mask2, positions2 = batch(lens2)
            fb.seq_lens.copy_(torch.tensor(lens2, dtype=fb.seq_lens.dtype))
            fb.positions.copy_(positions2)
            md.custom_mask[: mask2.numel()] = mask2.to(md.custom_mask.dtype)
            md.mask_indptr[1:] = torch.cumsum(torch.tensor([n * (m + n) for m in lens2]), 0).to(md.mask_indptr.dtype)
            graph.replay()
            eager = tla._tree_fields(env.backend, fb, sc.CHUNK, True)
    for name in ("kv_indptr", "kv_indices", "mask_indptr", "custom_mask"):
        assert torch.equal(captured[name], eager[name]), name
    # and the replayed mask is the second batch's, not the first's: request 2 (21 keys, drafts 21..23)
    # sees its chunk's 5 cached keys, request 0 (16 keys) none
    width = [m % sc.CHUNK + n for m in lens2]
    assert captured["mask_indptr"].tolist() == [0, n * width[0], n * (width[0] + width[1]), n * sum(width)]
