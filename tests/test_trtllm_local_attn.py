"""trtllm_local_attn: Llama 4's chunked layers on trtllm_mha read their own chunk. A real
TRTLLMHAAttnBackend for Llama 4 (as on Hopper's XQA and as on Blackwell) over a real SWAKVPool
whose index spaces differ, its flashinfer kernels recorded; the keys a kernel call makes each
query attend are read from the call's arguments (``check.trtllm_local_attn.call_reads``) and
held to the query's chunk. Under CUDA graphs (emulated on the CPU, sglang's own capture and
replay metadata) the rows must be derived inside the captured pass."""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

import sglang.srt.model_executor.model_runner  # noqa: F401  (0.5.10: the start-up hook runs here)

from sglang_swa_plugin import log
from sglang_swa_plugin.check import kernels
from sglang_swa_plugin.check import trtllm_local_attn as sc
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import trtllm_local_attn as tla
from sglang_swa_plugin.probe import optional_module, swapped, target_class

from cpu_graph import CpuGraph
from graph_steps import cpu_trtllm_kernels, in_graph, prepare_capture, prepare_replay
from helpers import fix_in_effect, without_fix

FIX = tla.FIX


@contextlib.contextmanager
def stock():
    cls = target_class(tla.CLASS)
    with without_fix(cls, "__init__"), without_fix(cls, "forward_decode"), without_fix(cls, "forward_extend"):
        yield


def test_detection_is_needed_on_every_release():
    """No release's trtllm_mha reads ``use_irope`` (0.5.10-0.5.23 and the main-window builds)."""
    det = FIX.detect()
    print(f"\n{det.verdict.value}: {det.reason}")
    assert det.verdict is Verdict.NEEDED, det.reason
    assert {t.rpartition(".")[2] for t in det.targets} == {"__init__", "forward_decode", "forward_extend"}


@contextlib.contextmanager
def prefill_preview(on: bool):
    """The fix's prefill preview on or off for the block (as SGLANG_SWA_PLUGIN_PREVIEW decides it)."""
    with swapped(FIX, "previews_on", frozenset({tla.PREFILL}) if on else frozenset()):
        yield


def test_stock_attends_the_whole_context_and_the_fix_the_chunk():
    with stock():
        bad = sc.scenario()
        with fix_in_effect(FIX), prefill_preview(True):
            good = sc.scenario()
        with fix_in_effect(FIX), prefill_preview(False):
            default = sc.scenario()
    print("\nstock:", {k: (v["right"], v["wrong_queries"][:3]) for k, v in bad.seen.items()})
    print("fixed:", {k: v["right"] for k, v in good.seen.items()})
    print("fixed, prefill preview off:", {k: v["right"] for k, v in default.seen.items()})
    # stock: every path that reaches past a chunk start reads keys before it
    assert bad.bug and not any(v["right"] for v in bad.seen.values()), bad.seen
    assert not good.bug and all(v["right"] and v["queries"] for v in good.seen.values()), good.seen
    # the queries that stay inside their first chunk were right on stock too: the judge is per query
    assert "1@5" not in bad.seen["xqa_decode"]["wrong_queries"]
    # preview off: decode and verify by chunk, the prefill as sglang runs it (not judged, and wrong)
    assert not default.bug
    assert {k for k, v in default.seen.items() if v["right"] is None} == {"xqa_extend", "blackwell_extend"}
    assert default.seen["xqa_extend"]["was"] is False and default.seen["xqa_decode"]["right"] is True


@pytest.mark.parametrize("page", [1, 4])
def test_chunk_rows_start_at_the_chunk_page(page):
    """Per row: ``L - start`` keys from the page holding its chunk's start; a verify's draft rows
    one by one (crossing a boundary mid-draft); padded graph rows (``L`` 0 or 1) stay in range."""
    chunk, pages = 8, 24 // page + 2
    table = torch.arange(3 * pages, dtype=torch.int32).view(3, pages) * 7
    seq_lens = torch.tensor([21, 1, 16], dtype=torch.int32)
    lens, rows = tla.chunk_rows(seq_lens, table, 1, chunk, page)
    assert lens.tolist() == [5, 1, 8] and lens.dtype == torch.int32
    for r, start in enumerate([16, 0, 8]):
        assert rows[r, 0].item() == table[r, start // page].item()
        assert rows[r, : pages - start // page].tolist() == table[r, start // page:].tolist()
    lens, rows = tla.chunk_rows(torch.tensor([18, 0], dtype=torch.int32), table[:2], 4, chunk, page)
    assert lens.tolist() == [7, 8, 1, 2, 1, 1, 1, 1]  # drafts at 14..17: chunk 8 then chunk 16
    assert rows[2, 0].item() == table[0, 16 // page].item() and rows[0, 0].item() == table[0, 8 // page].item()
    assert int(rows.max()) <= int(table.max()) and int(rows.min()) >= 0


def _reads_right(env, call, queries):
    return sc.judge(sc.call_reads(call, queries, env.backend.page_size, env.slot), queries)


@pytest.mark.parametrize("mode", ["DECODE", "TARGET_VERIFY"])
def test_cuda_graph_replays_read_the_current_chunks(mode):
    """sglang's warm-up runs, the capture and several replays with other requests and lengths
    (one padded batch); at each replay the kernel call the graph makes must read each query's
    chunk. Without the fix the captured call reads the whole context."""
    q_len = 1 if mode == "DECODE" else sc.DRAFTS
    capture = (9, 14, 6) if mode == "DECODE" else (6, 14, 3)
    replays = [((0, 1, 2), (21, 7, 16)), ((2, 0, 1), (17, 24, 9)), ((3,), (12,))]
    if mode == "TARGET_VERIFY":
        replays = [((0, 1, 2), (14, 5, 9)), ((2, 0, 1), (7, 15, 16)), ((3,), (12,))]

    def run(install):
        graph, calls, out = CpuGraph(), [], []
        with contextlib.ExitStack() as stack:
            stack.enter_context(stock())
            if install:
                stack.enter_context(fix_in_effect(FIX))
            env = sc.build(xqa=True)  # decode and verify: not the prefill preview
            assert env.rows.tolist() == [0, 1, 2, 3]
            layer = env.layer
            batch = env.tb.make_forward_batch(env.runner, mode.lower(), req_pool_indices=[0, 1, 2],
                                              seq_lens=list(capture), attn_backend=env.backend)
            q = torch.zeros(batch.input_ids.shape[0], layer.tp_q_head_num * layer.head_dim, dtype=torch.bfloat16)
            method = env.backend.forward_decode if mode == "DECODE" else env.backend.forward_extend
            stack.enter_context(cpu_trtllm_kernels(graph, calls))
            prepare_capture(env.backend, batch, q_len)
            for _ in range(2):  # warm-up
                in_graph(env.backend, batch)
                method(q, None, None, layer, batch, save_kv_cache=False)
            with graph.capture():
                in_graph(env.backend, batch)
                method(q, None, None, layer, batch, save_kv_cache=False)
            for rows, lens in replays:
                prepare_replay(env.backend, batch, q_len, rows, lens)
                calls.clear()
                graph.replay()
                queries = ([(r, n - 1) for r, n in zip(rows, lens)] if mode == "DECODE"
                           else [(r, n + i) for r, n in zip(rows, lens) for i in range(q_len)])
                out.append(_reads_right(env, calls[-1], queries))
        return out

    fixed, bad = run(True), run(False)
    print(f"\n{mode} fixed: {fixed}\nstock: {[b['right'] for b in bad]}")
    assert all(r["right"] for r in fixed), fixed
    assert not any(r["right"] for r in bad[:2]), bad


def test_a_chunk_that_is_not_a_multiple_of_the_page_size_is_left_with_one_warning(caplog):
    """The hook on a real backend whose pages (3) do not tile the chunk (8): sglang's own method
    runs as it is, with sglang's flashinfer, and one warning names the path."""
    log.WARNED.clear()
    with stock(), fix_in_effect(FIX):
        env = sc.build(xqa=True)
    env.backend.page_size = 3
    seen = []

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        seen.append(optional_module(tla.MODULE).flashinfer)
        return "sglang's own"

    fb = env.tb.make_forward_batch(env.runner, "decode", req_pool_indices=[0], seq_lens=[21], attn_backend=env.backend)
    mod, rec = optional_module(tla.MODULE), kernels.kernel_recorders([], [0])
    with caplog.at_level(logging.WARNING), swapped(mod, "flashinfer", rec):
        outs = [tla._by_chunk(forward_decode, env.backend, None, None, None, env.layer, fb) for _ in range(2)]
        env.backend.page_size = 1  # the same call on pages that tile the chunk: the fix's view
        tla._by_chunk(forward_decode, env.backend, None, None, None, env.layer, fb)
    warned = [r.getMessage() for r in caplog.records if "trtllm_local_attn" in r.getMessage()]
    print("\n", warned)
    assert outs == ["sglang's own"] * 2 and seen[0] is rec and seen[1] is rec
    assert len(warned) == 2 and "not a multiple of the page size (3)" in warned[0]
    assert seen[2] is not rec and "kernel form this fix does not rewrite" in warned[1]  # no kernel ran


def test_with_the_prefill_preview_off_the_prefill_is_sglangs_own_with_one_warning(caplog):
    log.WARNED.clear()
    calls = []
    with stock(), fix_in_effect(FIX), prefill_preview(False):
        env = sc.build(xqa=False)
        fb = env.tb.make_forward_batch(env.runner, "extend", req_pool_indices=[0, 1], seq_lens=[23, 7],
                                       extend_seq_lens=[10, 7], attn_backend=env.backend)
        q = torch.zeros(17, env.layer.tp_q_head_num * env.layer.head_dim, dtype=torch.bfloat16)
        with caplog.at_level(logging.WARNING), kernels.cpu_kernels(), swapped(
                optional_module(tla.MODULE), "flashinfer", kernels.kernel_recorders(calls, [0])):
            env.backend.init_forward_metadata(fb)
            for _ in range(2):
                env.backend.forward_extend(q, None, None, env.layer, fb, save_kv_cache=False)
    warned = [r.getMessage() for r in caplog.records if "trtllm_local_attn" in r.getMessage()]
    print("\n", warned)
    assert [c.batch_size for c in calls] == [2, 2] and calls[0].window_left == -1  # sglang's own call
    assert len(warned) == 1 and f"SGLANG_SWA_PLUGIN_PREVIEW={tla.PREFILL}" in warned[0]


def test_the_check_command_runs_the_scenario():
    from sglang_swa_plugin.cli import check_report

    with stock():
        rep = check_report()
    row = next(r for r in rep["rows"] if r["fix"] == FIX.name)
    print("\n", row)
    assert row["reproduced_without"] is True and row["fixed_with"] is True and row["detection"] == "needed"
