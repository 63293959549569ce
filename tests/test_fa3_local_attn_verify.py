"""fa3_local_attn_verify: what Llama 4's chunked layers are handed by FA3 in TARGET_VERIFY
(EAGLE topk 1, 4 draft tokens, chunk 32), on a real ``FlashAttentionBackend`` (Llama 4 model
config) over a real ``SWAKVPool`` (layers 0-2 chunked in the SWA pool, layer 3 global) whose
full and SWA ids diverge, at page size 1 and 16. Each check reads, per query token, the K the
kernel would see through the block table, cu_seqlens_q and seqused_k it is handed (causal
varlen semantics) from the SWA pool's real buffer, where every token was written through
``SWAKVPool.set_kv_buffer`` with its own marker, and compares it with the token's own chunk
up to itself. CUDA graphs: sglang's own state / capture / replay methods of both APIs
(capture at lengths 1, as the runner captures), judged through the tensors bound at capture.
Eager: ``init_forward_metadata``. Without the fix the graph rows fail on every release
(no local-attention metadata: whole context through the full-pool page table)."""

from __future__ import annotations

import contextlib
import importlib

import pytest
import torch

import sglang.srt.model_executor.model_runner  # noqa: F401  (0.5.10: the start-up hook)

from sglang_swa_plugin import state
from sglang_swa_plugin.check import fa3_local_attn_verify as sc
from sglang_swa_plugin.core import temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import fa3_local_attn_pages as lap
from sglang_swa_plugin.hooks import fa3_local_attn_verify as lav

from helpers import without_fix

FIX = lav.FIX
MOD = importlib.import_module(lav.MODULE)
BACKEND = MOD.FlashAttentionBackend
OURS = ("init_cuda_graph_state", "init_forward_metadata_capture_cuda_graph",
        "init_forward_metadata_replay_cuda_graph", "init_forward_metadata_out_graph")
PAGES = [t.rsplit(".", 1)[1] for t in lap.FIX.targets]


@contextlib.contextmanager
def sglang_alone(keep_pages_fix: bool = False):
    """sglang's own methods (whatever the start-up hook installed); with ``keep_pages_fix``
    fa3_local_attn_pages stays where it is needed (item 1, the other half of page size > 1)."""
    with contextlib.ExitStack() as stack:
        for name in OURS:
            if name in BACKEND.__dict__:
                stack.enter_context(without_fix(BACKEND, name, FIX.name))
        for name in PAGES:
            if name in BACKEND.__dict__:
                stack.enter_context(without_fix(BACKEND, name, lap.FIX.name))
        if keep_pages_fix and lap.FIX.detect().verdict is Verdict.NEEDED:
            stack.enter_context(temporarily_installed(lap.FIX))
        yield


@contextlib.contextmanager
def fixed():
    with sglang_alone(keep_pages_fix=True):
        assert FIX.detect().verdict is Verdict.NEEDED
        with temporarily_installed(FIX):
            yield


def graph_rows(ps):
    try:
        bench = sc.make_bench(ps)
        view, _ = sc.graph_verify(bench)
    except sc.CUDA_ONLY as e:
        pytest.skip(f"the verify graph metadata runs a CUDA/Triton kernel on this release: {e}")
    return sc.reads(bench, view)


def show(pairs):
    return [(None if g is None else g.tolist(), w.tolist()) for g, w in pairs if g is None or not torch.equal(g, w)][:3]


# ------------------------------------------------------------------ detection


def test_detection_says_needed():
    """No release builds local-attention metadata in CUDA-graph target verify."""
    with sglang_alone():
        det = FIX.detect()
        assert not lav.verify_builds_local(BACKEND)
    assert det.verdict is Verdict.NEEDED, det


def test_check_scenario_reproduces_and_the_fix_corrects_it():
    from sglang_swa_plugin.fix import ScenarioUnavailable

    with sglang_alone():
        try:
            FIX.reproduce()
        except ScenarioUnavailable as e:
            pytest.skip(str(e))
        assert FIX.reproduce()
        with temporarily_installed(FIX):
            assert not FIX.reproduce()


# ------------------------------------------------------------------ CUDA-graph target verify


@pytest.mark.parametrize("ps", [1, 16])
def test_graph_verify_chunked_layers_read_their_own_chunk_from_the_swa_pool(ps):
    with fixed():
        pairs = graph_rows(ps)
    assert sc.wrong(pairs) == 0, show(pairs)


@pytest.mark.parametrize("ps", [1, 16])
def test_without_the_fix_graph_verify_reads_other_kv(ps):
    """What the fix is for: sglang alone (fa3_local_attn_pages in where it is needed)."""
    with sglang_alone(keep_pages_fix=True):
        pairs = graph_rows(ps)
    assert sc.wrong(pairs) == len(pairs), show(pairs)  # every query: whole context, full-pool ids


def test_graph_verify_padded_batch_and_a_second_replay():
    """A smaller step in the captured batch size (padding rows as the runner pads them), then
    the full batch again: the captured views are refilled each time, the padding virtual
    requests get no queries."""
    with fixed():
        bench = sc.make_bench(16)
        try:
            view, _ = sc.graph_verify(bench)
        except sc.CUDA_ONLY as e:
            pytest.skip(f"the verify graph metadata runs a CUDA/Triton kernel on this release: {e}")
        be, bs = bench.backend, len(sc.LENS)
        lens = [sc.LENS[2], sc.LENS[0], 1, 1]  # two requests, two padding rows (row 0, length 1)
        rows = [int(bench.rows[2]), int(bench.rows[0]), 0, 0]
        out_loc = torch.cat([bench.reqs[2][63:67], bench.reqs[0][70:74], torch.zeros(8, dtype=torch.int64)])
        step = sc.tb.make_forward_batch(bench.runner, "target_verify", seq_lens=lens, req_pool_indices=rows,
                                        out_cache_loc=out_loc)
        sc.replay(be, bs, step)
        cu = view.cu_q.tolist()
        assert cu == sorted(cu) and cu[-1] == bs * sc.DRAFT, cu
        bench.markers = [bench.markers[2], bench.markers[0]]
        pairs = sc.reads(bench, view, lens=lens[:2])
        assert sc.wrong(pairs) == 0, show(pairs)


# ------------------------------------------------------------------ eager target verify (topk 1)


@pytest.mark.parametrize("ps", [1, 16])
def test_eager_verify_topk1_reads_its_own_chunk(ps):
    """sglang builds the metadata itself here (page size > 1: with fa3_local_attn_pages)."""
    with fixed():
        bench = sc.make_bench(ps)
        pairs = sc.reads(bench, sc.eager_verify(bench))
    assert sc.wrong(pairs) == 0, show(pairs)


# ------------------------------------------------------------------ topk > 1: fa3_local_attn_tree_verify's


def test_topk_above_one_is_left_to_the_tree_fix():
    """No topk-1 buffers for a tree verify; the graph rows of topk > 1 are
    test_fa3_local_attn_tree_verify's."""
    bench = sc.make_bench(1, topk=2)
    with fixed():
        bench.backend.init_cuda_graph_state(4, 16)
    assert not state.has(bench.backend, lav.BUFFERS)


# ------------------------------------------------------------------ the device splitter


def host_splitter(chunk, ps, prefix, n, table, v):
    """The former host-side refill: sglang's splitter (``local_batches``) over numpy lengths,
    then the unused virtual requests emptied, as the buffers held them."""
    import numpy as np

    from sglang_swa_plugin.fa3_local import cdiv, local_batches

    bs = prefix.shape[0]
    lens = prefix.numpy().astype(np.int32) + n
    cu_q = np.arange(0, bs * n + 1, n, dtype=np.int32)
    _, cu_local, k_local, blocks = local_batches(chunk, cu_q, lens, table[:bs, : cdiv(int(lens.max()), ps)], ps)
    q = torch.full((v + 1,), bs * n, dtype=torch.int32)
    k = torch.zeros(v, dtype=torch.int32)
    b = torch.zeros(v, cdiv(chunk, ps), dtype=torch.int32)
    q[: len(cu_local)] = torch.from_numpy(cu_local)
    k[: len(k_local)] = torch.from_numpy(k_local)
    b[: blocks.shape[0], : blocks.shape[1]] = blocks
    return q, k, b


@pytest.mark.parametrize("ps", [1, 4, 16])
@pytest.mark.parametrize("n", [1, 4, 9])
def test_device_splitter_equals_sglangs_host_splitter(ps, n):
    """The replay refill's device computation (fixed shapes, no sync) gives the values of
    sglang's own host splitter, on batches of 1 and many requests, requests shorter than the
    chunk, ones whose draft tokens cross a chunk boundary (or several: 9 tokens, chunk 8 at
    page 1 and 4), CUDA-graph padded rows (length 1, the runner's fill value) and stale
    buffers; the buffer entries past the step's virtual requests stay as they were."""
    from sglang_swa_plugin.fa3_local import cdiv, verify_local_batches

    chunk = 8 if ps < 16 else 32
    per_request = 1 + cdiv(n - 1, chunk)
    gen = torch.Generator().manual_seed(ps * 100 + n)
    batches = [[0], [5], [chunk - 1], [chunk], [3 * chunk - n + 1], [1, 1, 1, 1],
               [0, max(chunk - n, 0), chunk + 2, 2 * chunk - 1, 7, 1, 1, 1]]  # the last three: padded rows
    batches += [torch.randint(0, 6 * chunk, (bs,), generator=gen).tolist() for bs in (2, 17, 32)]
    for prefix in batches:
        prefix = torch.tensor(prefix, dtype=torch.int32)
        bs, width = prefix.shape[0], cdiv(int(prefix.max()) + n, ps) + 3  # wider than the batch needs
        table = torch.randint(0, 1000, (bs + 2, width), generator=gen, dtype=torch.int32)
        v = bs * per_request
        want = host_splitter(chunk, ps, prefix, n, table, v)
        got = [torch.full((v + 3,), -7, dtype=torch.int32), torch.full((v + 2,), -7, dtype=torch.int32),
               torch.full((v + 2, cdiv(chunk, ps)), -7, dtype=torch.int32)]
        verify_local_batches(chunk, ps, prefix, n, table, bs, per_request, *got)
        for g, w, name in zip(got, want, ("cu_seqlens_q", "seqused_k", "block_table")):
            assert torch.equal(g[: w.shape[0]], w), (prefix.tolist(), name, g[: w.shape[0]].tolist(), w.tolist())
            assert bool((g[w.shape[0]:] == -7).all()), (prefix.tolist(), name)
