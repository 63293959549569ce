"""fa3_local_attn_tree_verify: what a Llama 4 chunked layer reads in FA3's topk > 1 TARGET_VERIFY
(EAGLE tree of 4 draft tokens at depths 0, 1, 1, 2; chunk 32; page size 1), through sglang's
own ``forward_extend`` on a real ``FlashAttentionBackend`` (Llama 4 model config) over a real
``SWAKVPool`` whose full and SWA ids diverge. FA3's kernel is recorded (its tensors kept by
reference, as a CUDA graph holds them); per draft token, the keys of both cascade kernels are
read from the SWA pool's real buffer, where every token was written through
``SWAKVPool.set_kv_buffer`` with its own marker, and compared with the token's chunk: the
prefix from the chunk's start and its ancestors from there, each once. The requests' draft
trees stay in one chunk, start a chunk, and cross into the next (the prefix part is then
empty). Eager: ``init_forward_metadata``; CUDA graphs: sglang's state / capture (lengths 1) /
replay methods of both APIs. Without the fix every draft token reads other KV on every release."""

from __future__ import annotations

import importlib
import logging

import pytest
import torch

import sglang.srt.model_executor.model_runner  # noqa: F401  (0.5.10: the start-up hook)

from sglang_swa_plugin.check import fa3_local_attn_tree_verify as sc
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import fa3_local_attn_tree_verify as tree

from helpers import fixed_alone, methods_alone

FIX = tree.FIX
MOD = importlib.import_module(tree.MODULE)
BACKEND = MOD.FlashAttentionBackend
METHODS = {BACKEND: [t.rsplit(".", 1)[1] for t in FIX.targets]}


def rows(mode: str):
    bench = sc.make_bench(1, topk=2)
    try:
        calls = (sc.graph_verify if mode == "graph" else sc.eager_verify)(bench)
    except sc.CUDA_ONLY as e:
        pytest.skip(f"the topk > 1 verify metadata runs a CUDA/Triton kernel on this release: {e}")
    assert len(calls) == 2, "a chunked layer runs the two cascade kernels"
    return sc.reads(bench, calls)


def show(pairs):
    return [(g[:6], w[:6]) for g, w in pairs if g != w][:3]


def test_detection_says_needed():
    """No release keeps chunked layers out of the topk > 1 cascade."""
    with methods_alone(FIX, METHODS):
        det = FIX.detect()
    assert det.verdict is Verdict.NEEDED, det


def test_detection_reads_the_cascade_condition():
    assert tree._statement("a = 1\n    use_cascade_attn = (\n  x\n  and not y\n)\nz = 2\n",
                           "use_cascade_attn").split() == ["use_cascade_attn", "=", "(", "x", "and", "not", "y", ")"]
    assert tree._statement("b = 1\n", "use_cascade_attn") == ""


def test_check_scenario_reproduces_and_the_fix_corrects_it():
    from sglang_swa_plugin.core import temporarily_installed
    from sglang_swa_plugin.fix import ScenarioUnavailable

    with methods_alone(FIX, METHODS):
        try:
            assert FIX.reproduce()
        except ScenarioUnavailable as e:
            pytest.skip(str(e))
        with temporarily_installed(FIX):
            assert not FIX.reproduce()


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_chunked_layers_read_their_chunk_from_the_swa_pool(mode):
    with fixed_alone(FIX, METHODS):
        pairs = rows(mode)
    assert all(g == w for g, w in pairs), show(pairs)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_without_the_fix_every_draft_token_reads_other_kv(mode):
    with methods_alone(FIX, METHODS):
        pairs = rows(mode)
    assert all(g != w for g, w in pairs), show(pairs)  # whole context, full-pool slots


def test_graph_padded_replay_and_a_second_replay():
    """A step smaller than the captured batch (padding rows as the runner pads them: row 0,
    length 1, no positions), then the full batch again: the captured tensors are refilled."""
    with fixed_alone(FIX, METHODS):
        bench = sc.make_bench(1, topk=2)
        try:
            calls = sc.graph_verify(bench)
        except sc.CUDA_ONLY as e:
            pytest.skip(f"the topk > 1 verify metadata runs a CUDA/Triton kernel on this release: {e}")
        be, lens = bench.backend, [sc.LENS[2], sc.LENS[1]]
        step = sc.tree_batch(bench, lens, which=[2, 1])
        n = len(sc.TREE)
        for name, pad in (("seq_lens", 1), ("req_pool_indices", 0)):
            setattr(step, name, torch.cat([getattr(step, name), torch.full((2,), pad, dtype=torch.int64)]))
        step.batch_size = 4
        with sc.recorded_kernels([], be):
            sc.replay(be, 4, step)
        markers, bench.markers = bench.markers, [bench.markers[2], bench.markers[1]]
        pairs = sc.reads(bench, calls, lens=lens)
        assert all(g == w for g, w in pairs), show(pairs)
        assert [int(x) for x in calls[0].seqused_k[2 * n:]] == [1] * (2 * n)  # padding: its row's one token
        bench.markers = markers
        with sc.recorded_kernels([], be):
            sc.replay(be, 4, sc.tree_batch(bench))
        pairs = sc.reads(bench, calls)
        assert all(g == w for g, w in pairs), show(pairs)


def test_other_layers_keep_sglangs_tables():
    """A global layer (layer 3) reads what it reads without the fix: the swap is the chunked
    layers' only."""
    def global_calls():
        bench = sc.make_bench(1, topk=2)
        calls = []
        batch = sc.tree_batch(bench)
        with sc.recorded_kernels(calls, bench.backend):
            bench.backend.init_forward_metadata(batch)
            layer = sc.tb.attention_layer(bench.pool, 3, bench.runner)
            q = torch.zeros(batch.positions.numel(), layer.tp_q_head_num, layer.head_dim)
            bench.backend.forward_extend(q, None, None, layer, batch, save_kv_cache=False)
        return [(c.table.clone(), c.seqused_k.clone()) for c in calls]

    with methods_alone(FIX, METHODS):
        alone = global_calls()
    with fixed_alone(FIX, METHODS):
        fixed = global_calls()
    assert len(alone) == len(fixed) == 2
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(alone, fixed))


def test_page_size_above_one_is_named_once(caplog):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    be = sc.make_bench(1, topk=2).backend
    be.page_size = 16
    from sglang_swa_plugin import log

    log.WARNED.discard((tree.NAME, "page size 16"))
    with caplog.at_level(logging.WARNING):
        assert not tree._tree_verify(be, ForwardMode.TARGET_VERIFY)
        assert not tree._tree_verify(be, ForwardMode.TARGET_VERIFY)
    assert sum("page size 16" in r.getMessage() for r in caplog.records) == 1
