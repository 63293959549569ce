"""trtllm_xqa_spec_decode under CUDA graphs (sglang's default), on the CPU.

sglang captures TARGET_VERIFY once per batch size: it builds the batch's metadata on static
buffers, runs the forward pass eagerly (warm-up), captures it, and at every later step only
refreshes the static buffers (seq_lens, page tables) and replays; no Python runs at replay.
Whatever the hook derives (the sliding-window layers' single-token rows, the masks) must
therefore be derived inside the captured region from the static buffers, or it is stale at
every replay. This test runs that exact sequence on a real trtllm_mha backend over diverged
full/SWA pools, with sglang's own capture and replay metadata code, the flashinfer kernels
recorded and the capture emulated on the CPU (``cpu_graph.CpuGraph``): at each of several
replays with other seq_lens and page tables (a padded batch too), the kernel must receive
what windowed causal attention over the current requests needs. The GPU version, with real
XQA kernels and a real CUDA graph, is tests/gpu/test_xqa_graph_replay_gpu.py."""

from __future__ import annotations

import contextlib

import pytest
import torch

import sglang.srt.model_executor.model_runner  # noqa: F401  (0.5.10: the start-up hook runs here)

from sglang_swa_plugin.check import testbed
from sglang_swa_plugin.check import kernels
from sglang_swa_plugin.core import temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import trtllm_extend_routing as routing
from sglang_swa_plugin.hooks import trtllm_xqa_spec_decode as xqa
from sglang_swa_plugin.probe import target_class

from cpu_graph import CpuGraph
from graph_steps import cpu_trtllm_kernels, in_graph, prepare_capture, prepare_replay
from helpers import without_fix

Q = 3  # draft tokens per request
PREFIX = (4, 6)  # tokens per request before the drafts, at capture


def _stock():
    return without_fix(target_class(xqa.CLASS), "forward_extend", xqa.FIX.name)


def _forward(backend, batch, layers, q):
    in_graph(backend, batch)
    for layer in layers:
        backend.forward_extend(q, None, None, layer, batch, save_kv_cache=False)


def _expected(bench, rows, prefix_lens, sliding):
    """Per kernel row: (seq_len, the page-table entries it reads), for windowed causal
    attention (sliding: one single-token row per draft row, SWA-pool pages) or the full layer
    (one row per request with the mask, full-pool pages). Page size 1."""
    out = []
    for row, p in zip(rows, prefix_lens):
        total = p + Q
        slots = bench.req_to_token.req_to_token[row, :total].long()
        pages = testbed.translate(bench.pool, slots) if sliding else slots
        if sliding:
            out += [(p + 1 + r, pages[: p + 1 + r].tolist()) for r in range(Q)]
        else:
            out.append((total, pages.tolist()))
    return out


def _received(call, n_real):
    per_row = Q if call.q_len_per_req == 1 else 1
    return [(n, call.page_table[i, :n].tolist()) for i, n in enumerate(call.seq_lens[: n_real * per_row])]


# Replays after the capture (rows of req_to_token, prefix lengths): other lengths, other
# page tables, swapped requests, and a padded batch (one real request in a graph of two).
REPLAYS = [((0, 1), (4, 6)), ((1, 0), (6, 4)), ((2, 3), (7, 5)), ((3,), (6,))]


def _v2_spec_info():
    """The synthetic draft-extend input sglang's capture uses (uniform Q tokens per request)."""
    from sglang.srt.speculative import eagle_info

    cls = getattr(eagle_info, "EagleDraftExtendInput", None)
    if cls is None:
        pytest.skip("this sglang has no EagleDraftExtendInput (DRAFT_EXTEND_V2 graph input)")
    n = len(PREFIX)
    return cls(num_accept_tokens=torch.full((n,), Q, dtype=torch.int32), num_accept_tokens_cpu=[Q] * n,
               num_tokens_per_req=Q)


def _v2_on_decode() -> bool:
    return bool(routing.routes_v2_to_decode(target_class(xqa.CLASS).forward_extend))


# TARGET_VERIFY everywhere; DRAFT_EXTEND_V2 where the release routes it to the decode kernel
# (0.5.14+; the hook shows it as TARGET_VERIFY there).
MODES = ["TARGET_VERIFY", "DRAFT_EXTEND_V2"]


def run_replays(install: bool, mode: str = "TARGET_VERIFY"):
    bench = kernels.extend_bench(num_draft_tokens=Q, prefix_lens=PREFIX)
    backend, layers = bench.backend, bench.layers
    backend.is_xqa_impl = True
    # Rows 2 and 3: the requests' tokens in another order (other page tables, same pools).
    testbed.fill_requests(bench.req_to_token, [bench.tokens[1].flip(0), bench.tokens[0].flip(0)], first_row=2)
    batch = bench.batch(mode, [Q] * len(PREFIX))
    # seq_lens: before the drafts for TARGET_VERIFY, after the extension for DRAFT_EXTEND_V2.
    extra = 0 if mode == "TARGET_VERIFY" else Q
    if mode != "TARGET_VERIFY":
        batch.spec_info = _v2_spec_info()
    heads = layers[0].tp_q_head_num * layers[0].head_dim
    # As a model hands it over: a view of its fused qkv projection, rows strided by q+k+v.
    q = torch.randn(batch.input_ids.shape[0], 2 * heads, dtype=torch.bfloat16)[:, :heads]
    graph, calls = CpuGraph(), []
    results = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(_stock())
        if install:
            stack.enter_context(temporarily_installed(xqa.FIX))
        stack.enter_context(cpu_trtllm_kernels(graph, calls))
        prepare_capture(backend, batch, Q)
        _forward(backend, batch, layers, q)  # sglang's warm-up runs
        _forward(backend, batch, layers, q)
        with graph.capture():
            _forward(backend, batch, layers, q)
        for rows, prefix_lens in REPLAYS:
            prepare_replay(backend, batch, Q, rows, [p + extra for p in prefix_lens])
            calls.clear()
            graph.replay()
            decode = [c for c in calls if c.kernel == "decode"]
            results.append((rows, prefix_lens, decode))
    return bench, graph, results


@pytest.mark.skipif(xqa.FIX.detect().verdict is not Verdict.NEEDED, reason="this sglang passes the mask itself")
@pytest.mark.parametrize("mode", MODES)
def test_every_replay_gets_the_current_requests_windowed_rows(mode):
    if mode != "TARGET_VERIFY" and not _v2_on_decode():
        pytest.skip("this sglang sends DRAFT_EXTEND_V2 to the context kernel")
    bench, graph, results = run_replays(install=True, mode=mode)
    assert graph.syncs == [], f"host-device sync inside the captured pass: {graph.syncs}"
    for rows, prefix_lens, decode in results:
        sliding = [c for c in decode if c.window_left >= 0]
        full = [c for c in decode if c.window_left < 0]
        assert len(sliding) == 1 and len(full) == 1, decode
        s, f = sliding[0], full[0]
        assert s.q_len_per_req == 1 and s.mask is None and s.q_rows == 2 * Q
        assert s.q_dense and f.q_dense  # XQA reads query rows as dense
        assert _received(s, len(rows)) == _expected(bench, rows, prefix_lens, sliding=True), (rows, prefix_lens)
        assert min(s.seq_lens) >= 1  # padded rows too
        assert f.q_len_per_req == Q and f.mask is not None and f.mask[:, :, 0].tolist() == [[1, 3, 7]] * 2
        assert _received(f, len(rows)) == _expected(bench, rows, prefix_lens, sliding=False), (rows, prefix_lens)


@pytest.mark.skipif(xqa.FIX.detect().verdict is not Verdict.NEEDED, reason="this sglang passes the mask itself")
def test_the_emulated_graph_replays_sglangs_own_buffers():
    """The emulation is what makes the test above mean anything: without the fix, the full
    layer's calls at replay carry the CURRENT static buffers (sglang's own code is graph-safe),
    so a stale value can only come from what a hook derived outside the captured region."""
    bench, graph, results = run_replays(install=False)
    for rows, prefix_lens, decode in results:
        full = [c for c in decode if c.window_left < 0]
        assert _received(full[0], len(rows)) == _expected(bench, rows, prefix_lens, sliding=False)
        assert full[0].mask is None  # the release's own call: XQA refuses it (the bug the fix exists for)


def test_masks_made_during_a_capture_are_never_handed_out_again():
    """A mask made while a graph is captured holds its values only inside that graph."""
    state, graph = xqa._XqaState(), CpuGraph()
    with graph.capture():
        inside = state.mask(3, 2, torch.device("cpu"))
    outside = state.mask(3, 2, torch.device("cpu"))
    assert outside.data_ptr() != inside.data_ptr() and outside[:, :, 0].tolist() == [[1, 3, 7]] * 2
    assert any(m.data_ptr() == inside.data_ptr() for m in state.kept)  # the graph still reads it
    with CpuGraph().capture():
        again = state.mask(3, 2, torch.device("cpu"))
    assert again.data_ptr() == outside.data_ptr()  # an eagerly made mask serves any graph
