"""trtllm_xqa_dense_query: on XQA hardware (sm90/sm120) the single-token decode-kernel calls of
``TRTLLMHAAttnBackend`` get the query dense. A real backend over diverged full/SWA pools,
built by the release's own ``__init__`` as on XQA hardware, three requests decoding together,
the query a split view of a fused qkv projection (as GPT-OSS and MiMo-V2 hand it over), the
flashinfer entry points replaced by recorders that keep the query they receive. XQA reads the
query rows as dense: ``QueryCall.rows_as_xqa_reads`` is what it reads.

Which release does what is the research map: the tests pick their expectations by release,
the fix never does."""

from __future__ import annotations

import contextlib
from importlib.metadata import version
from types import SimpleNamespace

import pytest
import torch

# Import sglang's model runner first: on sglang without a plugin framework that is when the
# start-up hook installs the plugin, which the tests must see before peeling it off.
import sglang.srt.model_executor.model_runner  # noqa: F401

from sglang_swa_plugin.check import kernels
from sglang_swa_plugin.check import trtllm_xqa_dense_query as scen
from sglang_swa_plugin.core import temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import trtllm_xqa_dense_query as dq
from sglang_swa_plugin.hooks import trtllm_xqa_spec_decode as spec
from sglang_swa_plugin.patching import target_marks
from sglang_swa_plugin.probe import function_text, optional_module, own_function, swapped, target_class
from sglang_swa_plugin.trtllm_mha import CLASS, MODULE, XQA_FLAG, syntax

from cpu_graph import CpuGraph
from helpers import fix_in_effect, main_window_snapshot, sglang_release, without_fix

FIX = dq.FIX
SGLANG = sglang_release()
# forward_decode: #22517 (0.5.11) .. #31667 (0.5.16). Main of May-June 2026
# (tests/main_window.py) sits inside that window. (forward_extend's single-token ENCODER_ONLY
# verify rows of 0.5.17-0.5.18, DFlash drafts, are not the fix's.)
DECODE_STRIDED = bool(main_window_snapshot()) or (0, 5, 11) <= SGLANG < (0, 5, 16)
NEEDED = DECODE_STRIDED


@contextlib.contextmanager
def stock():
    """The release's own ``forward_decode``/``forward_extend`` (whatever of ours is on them
    peeled: the 0.5.10 start-up hook installs the needed fixes for good)."""
    cls = target_class(CLASS)
    with without_fix(cls, "forward_decode"), without_fix(cls, "forward_extend"):
        yield


def test_detection_is_the_release_map():
    det = FIX.detect()
    print(f"\nsglang {version('sglang')}: {det.verdict.value}: {det.reason}")
    assert det.verdict is (Verdict.NEEDED if NEEDED else Verdict.NOT_NEEDED), det.reason
    assert {t.rpartition(".")[2] for t in det.targets} == ({"forward_decode"} if DECODE_STRIDED else set())


def test_the_text_reading_agrees_with_the_syntax_tree():
    """Where the methods' text decides (upstream's forms, read without parsing), the syntax
    tree of the same method gives the same verdict."""
    cls = target_class(CLASS)
    for method in dq.TARGETS:
        fn = own_function(cls, method)
        fast = dq.text_verdict(method, function_text(fn), lambda: dq._xqa_flags(cls))
        full = dq.tree_verdict(method, syntax(fn), lambda: dq._xqa_flags(cls))
        print(f"\n{method}: text {fast}; tree {full}")
        assert full[0] is not None and (fast is None or fast[0] == full[0]), (fast, full)


def test_detection_matches_what_the_backend_does():
    """The structural verdict (read at start-up) equals what the real backend hands XQA."""
    with stock():
        out = scen.scenario()
    print(f"\nsglang {version('sglang')}: {FIX.detect().verdict.value}; calls: {out.seen}")
    assert out.bug is (FIX.detect().verdict is Verdict.NEEDED)


@pytest.mark.skipif(not DECODE_STRIDED, reason="this sglang's forward_decode hands XQA a dense query")
def test_without_the_fix_batched_requests_read_other_rows_as_their_query():
    with stock():
        calls = scen.decode_calls()
    assert [c.layer_id for c in calls] and all(c.q_len_per_req == 1 for c in calls)
    for call in calls:
        assert not call.dense and call.query.stride(0) > call.query.shape[1] * call.query.shape[2]
        assert torch.equal(call.query, call.model_rows)  # right values, strided: XQA ignores the strides
        assert call.misread_rows() == [1, 2], call.misread_rows()  # every request after the first


@pytest.mark.skipif(not NEEDED, reason="nothing to install on this sglang")
def test_with_the_fix_every_single_token_xqa_call_gets_the_models_query_dense():
    with stock():
        before = scen.xqa_calls()
        planned = set(FIX.detect().targets)
        with temporarily_installed(FIX):
            assert planned == {t for t in dq.TARGETS.values() if FIX.name in target_marks(t)}
            after = scen.xqa_calls()
    assert any(not c.dense for c in before) and len(after) == len(before)
    for b, a in zip(before, after):
        assert (a.mode, a.layer_id, a.q_len_per_req) == (b.mode, b.layer_id, b.q_len_per_req)
        assert a.dense and a.query.shape == b.query.shape and a.query.dtype == b.query.dtype
        assert torch.equal(a.query, a.model_rows) and not a.misread()


@pytest.mark.skipif(not NEEDED, reason="nothing to install on this sglang")
def test_on_blackwell_the_fix_changes_nothing():
    """trtllm-gen (sm100) reads strides: the hook passes the release's query through."""
    with stock():
        before = scen.xqa_calls(xqa=False)
        with temporarily_installed(FIX):
            after = scen.xqa_calls(xqa=False)
    assert [(c.mode, c.layer_id, c.query.stride()) for c in after] == [(c.mode, c.layer_id, c.query.stride())
                                                                      for c in before]


def test_the_hook_copies_only_a_strided_query_on_xqa():
    """forward_decode gets ``q.contiguous()`` where q is strided on XQA; a dense q is passed on as
    it is (no copy), and nothing changes off XQA (trtllm-gen reads strides)."""
    got = []
    original = lambda self, q, *args, **kwargs: got.append((q, args, kwargs))
    q = scen.fused_query(6, SimpleNamespace(tp_q_head_num=4, tp_k_head_num=2, head_dim=8))
    assert not q.is_contiguous()
    xqa, gen = SimpleNamespace(**{XQA_FLAG: True}), SimpleNamespace(**{XQA_FLAG: False})
    dq._dense_query(original, xqa, q, "k", layer="L")
    assert got[-1][0].is_contiguous() and torch.equal(got[-1][0], q) and got[-1][1:] == (("k",), {"layer": "L"})
    dense = q.contiguous()
    dq._dense_query(original, xqa, dense)
    assert got[-1][0] is dense
    dq._dense_query(original, gen, q)
    assert got[-1][0] is q


def test_with_the_plugin_every_verify_call_reaches_xqa_dense():
    """The two trtllm XQA fixes together, as they apply here: every decode-kernel call of a
    TARGET_VERIFY step (multi-token: trtllm_xqa_spec_decode's) gets the model's query dense."""
    with stock(), fix_in_effect(spec.FIX), fix_in_effect(FIX):
        calls = scen.verify_calls()
    assert calls and all(c.dense and torch.equal(c.query.reshape(c.model_rows.shape), c.model_rows) for c in calls)


@pytest.mark.skipif(not DECODE_STRIDED, reason="nothing to install for forward_decode on this sglang")
def test_under_a_cuda_graph_the_copy_is_part_of_the_captured_pass():
    """sglang captures decode and replays it with no Python: the dense copy must be a captured
    operation reading the static qkv buffer (no host-device sync), so every replay's kernel
    reads the current step's query."""
    b = scen.bench()
    batch = b.batch("DECODE", [1] * scen.BATCH)
    layer = b.layers[0]
    heads = (layer.tp_q_head_num, layer.head_dim)
    qkv = torch.zeros(scen.BATCH, (layer.tp_q_head_num + 2 * layer.tp_k_head_num) * layer.head_dim,
                      dtype=torch.bfloat16)
    q = qkv[:, : layer.tp_q_head_num * layer.head_dim]
    graph, received = CpuGraph(), []
    rec = kernels.kernel_recorders([], [layer.layer_id])
    record = rec.decode.trtllm_batch_decode_with_kv_cache

    def decode(*args, **kwargs):
        received.append(kwargs["query"])
        return record(*args, **kwargs)

    rec.decode.trtllm_batch_decode_with_kv_cache = graph.kernel(decode)
    with stock(), temporarily_installed(FIX), swapped(optional_module(MODULE), "flashinfer", rec), kernels.cpu_kernels():
        b.backend.init_forward_metadata(batch)
        b.backend.forward_decode(q, None, None, layer, batch, save_kv_cache=False)  # warm-up
        with graph.capture():
            b.backend.forward_decode(q, None, None, layer, batch, save_kv_cache=False)
        for step in range(1, 4):
            qkv.copy_(torch.randn(qkv.shape, generator=torch.Generator().manual_seed(step)).to(qkv.dtype))
            received.clear()
            graph.replay()
            assert len(received) == 1 and received[0].is_contiguous()
            assert torch.equal(received[0], q.reshape(scen.BATCH, *heads)), step
    assert graph.syncs == [], f"host-device sync inside the captured pass: {graph.syncs}"


def test_the_check_command_runs_the_scenario():
    from sglang_swa_plugin.cli import check_report

    with stock():  # `sglang-swa-plugin check` judges stock sglang
        rep = check_report()
    row = next(r for r in rep["rows"] if r["fix"] == FIX.name)
    print("\n", row)
    assert row["reproduced_without"] is NEEDED and row["fixed_with"] is (True if NEEDED else None)
    assert row["detection"] == ("needed" if NEEDED else "not needed")
