"""trtllm_extend_routing: which flashinfer kernel ``TRTLLMHAAttnBackend.forward_extend`` runs,
and with what, for EXTEND, TARGET_VERIFY and DRAFT_EXTEND_V2 (uniform and ragged), on a real
backend over diverged full/SWA pools with the two flashinfer entry points replaced by
recorders; #24566's routing on upstream main's own code (nox -s "mainwindow(S3)": detected,
corrected); the released routing left alone.

Which release routes how is the research map (../shared/research/sglang-versions.md §3.4):
the tests pick their expectations by release (or by the main commit installed, see
tests/main_window.py), the fix never does."""

from __future__ import annotations

import contextlib
import inspect
from types import SimpleNamespace

import pytest
import torch

from sglang_swa_plugin.core import decide, temporarily_installed
from sglang_swa_plugin.config import parse
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import trtllm_extend_routing as routing
from sglang_swa_plugin.check import kernels
from sglang_swa_plugin.patching import DirectHooks, target_marked_by
from sglang_swa_plugin.probe import swapped

from helpers import main_window_snapshot, sglang_release, snapshot_carries, without_fix

FIX = routing.FIX
SGLANG = sglang_release()
SNAPSHOT = main_window_snapshot()
BUG_24566 = snapshot_carries(FIX.name) == "#24566"  # main between #24566 and #24856 (S3)
if SNAPSHOT:  # main commits route V2 as #24566 (S3) or as #24856 (the others); #25002 is not pinned
    ROUTES_V2_TO_DECODE, UNIFORM_V2_GRAPH_METADATA = BUG_24566, None
else:
    ROUTES_V2_TO_DECODE = SGLANG >= (0, 5, 14)  # #28241
    UNIFORM_V2_GRAPH_METADATA = SGLANG >= (0, 5, 13)  # #25002
NUM_DRAFT = 3
PREFIX = (4, 6)


@pytest.fixture(scope="module")
def bench():
    return kernels.extend_bench(num_draft_tokens=NUM_DRAFT, prefix_lens=PREFIX)


def record(bench, mode, extend_lens):
    return kernels.record_extend(bench.backend, bench.batch(mode, extend_lens), bench.layers)


def check_page_tables(bench, calls):
    """Each layer's kernel got its own index space: SWA layers the translated table, full
    layers the req_to_token slots (page_size 1), for each request's first seq_len tokens."""
    swa_ids = {i for i, (_, is_swa) in bench.pool.layers_mapping.items() if is_swa}
    for call in calls:
        for i, n in enumerate(call.seq_lens):
            slots = bench.req_to_token.req_to_token[bench.rows[i], :n].long()
            want = bench.pool.translate_loc_from_full_to_swa(slots).long() if call.layer_id in swa_ids else slots
            assert torch.equal(call.page_table[i, :n].long(), want), (call.layer_id, i)
    assert {c.layer_id for c in calls} == {l.layer_id for l in bench.layers}
    full, swa = (next(c for c in calls if (c.layer_id in swa_ids) == s) for s in (False, True))
    assert not torch.equal(full.page_table[:, :4], swa.page_table[:, :4])  # the spaces really diverge


def assert_fixed_routing(bench):
    """With the fix in effect: DRAFT_EXTEND_V2 (ragged or uniform) runs the context kernel on
    the metadata the backend built; TARGET_VERIFY and EXTEND are untouched."""
    ragged = record(bench, "DRAFT_EXTEND_V2", [1, 3])
    assert_context(ragged, [0, 1, 4], [5, 9])
    check_page_tables(bench, ragged)
    assert_context(record(bench, "DRAFT_EXTEND_V2", [NUM_DRAFT] * 2), [0, 3, 6], [7, 9])
    assert_decode(record(bench, "TARGET_VERIFY", [NUM_DRAFT] * 2), NUM_DRAFT, [7, 9])
    assert_context(record(bench, "EXTEND", [3, 2]), [0, 3, 5], [7, 8])


def assert_context(calls, cu_seqlens_q, seq_lens):
    assert [c.kernel for c in calls] == ["context"] * len(calls)
    for c in calls:
        assert c.batch_size == len(PREFIX) and c.cu_seqlens_q == cu_seqlens_q and c.seq_lens == seq_lens
        assert c.q_rows == cu_seqlens_q[-1]


def assert_decode(calls, q_len_per_req, seq_lens):
    assert [c.kernel for c in calls] == ["decode"] * len(calls)
    for c in calls:
        assert c.q_len_per_req == q_len_per_req and c.seq_lens == seq_lens
        assert c.q_rows == len(seq_lens) * q_len_per_req and not c.breaks_decode_contract()


# ------------------------------------------------------------------ the installed routing


def test_extend_runs_the_context_kernel(bench):
    calls = record(bench, "EXTEND", [3, 2])
    assert_context(calls, [0, 3, 5], [7, 8])
    check_page_tables(bench, calls)


def test_target_verify_runs_the_decode_kernel_with_post_write_totals(bench):
    calls = record(bench, "TARGET_VERIFY", [NUM_DRAFT] * 2)
    assert_decode(calls, NUM_DRAFT, [p + NUM_DRAFT for p in PREFIX])
    check_page_tables(bench, calls)


def test_uniform_draft_extend_v2(bench):
    calls = record(bench, "DRAFT_EXTEND_V2", [NUM_DRAFT] * 2)
    if ROUTES_V2_TO_DECODE:  # #28241 on #25002: one query length per request
        assert_decode(calls, NUM_DRAFT, [7, 9])
    else:  # #24856 form
        assert_context(calls, [0, 3, 6], [7, 9])
    check_page_tables(bench, calls)


def test_ragged_draft_extend_v2(bench):
    """Accepted lengths 1 and 3. Releases that route V2 to the decode kernel never build such
    a batch (their producers and CUDA-graph metadata give every request num_draft_tokens
    rows); fed one anyway, the decode kernel's contract breaks, which is #24566's bug."""
    calls = record(bench, "DRAFT_EXTEND_V2", [1, 3])
    if ROUTES_V2_TO_DECODE:
        assert [c.kernel for c in calls] == ["decode", "decode"]
        assert all(c.q_len_per_req == 3 and c.q_rows == 4 and c.breaks_decode_contract() for c in calls)
    else:
        assert_context(calls, [0, 1, 4], [5, 9])
    check_page_tables(bench, calls)


@pytest.mark.skipif(BUG_24566, reason="this sglang carries #24566's bug")
def test_released_routing_is_left_alone(bench):
    det = FIX.detect()
    assert det.verdict is Verdict.NOT_NEEDED, det
    assert ("uniform" in det.reason) == ROUTES_V2_TO_DECODE, det.reason
    if UNIFORM_V2_GRAPH_METADATA is not None:
        assert routing.uniform_v2_metadata(type(bench.backend)) == UNIFORM_V2_GRAPH_METADATA
    trial = []
    rec = decide(FIX, "builtin", parse(), lambda name: trial.append(DirectHooks(name)) or trial[-1])
    assert rec.status == "not needed" and not trial and target_marked_by(routing.TARGET) != FIX.name
    assert not FIX.reproduce()
    if ROUTES_V2_TO_DECODE:  # upstream's speed-up is kept: uniform V2 still on the decode kernel
        assert_decode(record(bench, "DRAFT_EXTEND_V2", [NUM_DRAFT] * 2), NUM_DRAFT, [7, 9])


def test_forward_extend_signature_matches_the_hook():
    params = list(inspect.signature(routing.backend_class().forward_extend).parameters)
    assert params[: len(FIX.target_params[routing.TARGET])] == list(FIX.target_params[routing.TARGET])


# ------------------------------------------------------------------ #24566 on main


@pytest.mark.skipif(not BUG_24566, reason="needs main between #24566 and #24856 (nox -s \"mainwindow(S3)\")")
def test_24566_is_detected_and_corrected(bench):
    """Upstream main's own #24566 routing, on its ragged (pre-#25002) draft-extend metadata."""
    det = FIX.detect()
    assert det.verdict is Verdict.NEEDED and "#24566" in det.reason, det
    # The bug: requests that accepted 1 and 3 tokens reach the decode kernel as
    # q_len_per_req=3 over 4 query rows (it would infer 1 request, not 2).
    calls = record(bench, "DRAFT_EXTEND_V2", [1, 3])
    assert [c.kernel for c in calls] == ["decode", "decode"] and all(c.breaks_decode_contract() for c in calls)
    assert FIX.reproduce()
    with temporarily_installed(FIX):
        assert target_marked_by(routing.TARGET) == FIX.name
        assert_fixed_routing(bench)
        assert not FIX.reproduce()
    assert target_marked_by(routing.TARGET) is None


def test_installed_fix_runs_draft_extend_v2_on_the_context_kernel(bench):
    """The hook on this release's own forward_extend: DRAFT_EXTEND_V2 (ragged or uniform) runs
    the context kernel on the metadata the backend built; the other modes are untouched."""
    with temporarily_installed(FIX):
        assert_fixed_routing(bench)


# ------------------------------------------------------------------ the hook itself


def test_routing_decision_reads_the_mode_only():
    """The hook decides from ``forward_batch.forward_mode`` alone: a batch carrying nothing
    else (no tensor to read, so no device-to-host copy is possible) is routed, and the mode is
    restored afterwards, also when the method raises."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    seen = []

    def original(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        seen.append(forward_batch.forward_mode)
        if save_kv_cache is None:
            raise RuntimeError("boom")
        return "out"

    for mode in (ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2):
        batch = SimpleNamespace(forward_mode=mode)
        assert routing._v2_to_context_kernel(original, None, None, None, None, None, batch) == "out"
        assert batch.forward_mode is mode
    assert seen[:2] == [ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY]
    assert not seen[2].is_draft_extend_v2() and not seen[2].is_target_verify()
    batch = SimpleNamespace(forward_mode=ForwardMode.DRAFT_EXTEND_V2)
    with pytest.raises(RuntimeError):
        routing._v2_to_context_kernel(original, None, None, None, None, None, forward_batch=batch, save_kv_cache=None)
    assert batch.forward_mode is ForwardMode.DRAFT_EXTEND_V2


# ------------------------------------------------------------------ FP8 query on XQA (record)


def _torch_scaled_fp8_quant(x, scale=None, **_):
    """CPU stand-in for sglang's ``scaled_fp8_quant`` kernel entry point (dynamic per-tensor)."""
    fp8 = torch.float8_e4m3fn
    scale = (x.abs().amax().float() / torch.finfo(fp8).max).clamp(min=1e-12).reshape(1) if scale is None else scale
    return (x.float() / scale).clamp(torch.finfo(fp8).min, torch.finfo(fp8).max).to(fp8), scale


def test_query_dtype_reaching_the_decode_kernel_on_xqa_with_fp8_kv(bench):
    """Pins what the module record states about the FP8 question: with an FP8 KV cache on XQA
    hardware, DRAFT_EXTEND_V2 reaches the decode kernel with an FP8 query in 0.5.14-0.5.21 and
    a bf16 one from 0.5.22; TARGET_VERIFY keeps a bf16 query from 0.5.14 (0.5.10-0.5.13 cast
    every extend query to FP8). The releases' own behaviour: trtllm_xqa_spec_decode, which
    changes it, is peeled off where the 0.5.10 start-up hook installed it."""
    if SNAPSHOT:
        pytest.skip("pins the releases' query dtypes")
    backend = bench.backend
    mod = inspect.getmodule(type(backend))
    saved = backend.is_xqa_impl, backend.data_type
    stand_in = (swapped(mod, "scaled_fp8_quant", _torch_scaled_fp8_quant) if hasattr(mod, "scaled_fp8_quant")
                else contextlib.nullcontext())
    backend.is_xqa_impl, backend.data_type = True, torch.float8_e4m3fn
    try:
        with stand_in, without_fix(type(backend), "forward_extend", "trtllm_xqa_spec_decode"):
            verify = record(bench, "TARGET_VERIFY", [NUM_DRAFT] * 2)
            v2 = record(bench, "DRAFT_EXTEND_V2", [NUM_DRAFT] * 2)
    finally:
        backend.is_xqa_impl, backend.data_type = saved
    assert {c.kernel for c in verify} == {"decode"}
    assert {c.q_dtype for c in verify} == {torch.bfloat16 if SGLANG >= (0, 5, 14) else torch.float8_e4m3fn}
    if not ROUTES_V2_TO_DECODE:
        assert {c.kernel for c in v2} == {"context"}
    else:
        assert {c.kernel for c in v2} == {"decode"}
        want = torch.float8_e4m3fn if SGLANG < (0, 5, 22) else torch.bfloat16
        assert {c.q_dtype for c in v2} == {want}
