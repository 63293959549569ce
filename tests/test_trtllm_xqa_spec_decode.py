"""trtllm_xqa_spec_decode: on XQA hardware (sm90/sm120) every multi-token decode-kernel call of
``TRTLLMHAAttnBackend.forward_extend`` (TARGET_VERIFY; DRAFT_EXTEND_V2 where it is routed there)
gets a bf16 query and the causal spec-decode mask, as 0.5.22 does. A real backend over
diverged full/SWA pools, set up as on XQA hardware, with an FP8 KV dtype and the flashinfer
entry points replaced by recorders. The GPU half (the real XQA kernel refusing what the
release passes and computing the right attention with what the fix passes) is
tests/gpu/fp8_xqa_probe.py.

Which release does what is the research map: the tests pick their expectations by release,
the fix never does."""

from __future__ import annotations

from importlib.metadata import version

import pytest
import torch

# Import sglang's model runner first: on sglang without a plugin framework that is when the
# start-up hook installs the plugin, which the tests must see before peeling it off.
import sglang.srt.model_executor.model_runner  # noqa: F401

from sglang_swa_plugin.core import temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.check import trtllm_xqa_spec_decode as xqa_check
from sglang_swa_plugin.hooks import trtllm_xqa_spec_decode as xqa
from sglang_swa_plugin.patching import target_marked_by
from sglang_swa_plugin.probe import target_class

from helpers import main_window_snapshot, sglang_release, snapshot_carries, without_fix

FIX = xqa.FIX
SGLANG = sglang_release()
if main_window_snapshot():  # main of May-June 2026 (tests/main_window.py): before #32269; V2 to decode by #24566
    V2_ON_DECODE, FIXED_UPSTREAM = snapshot_carries("trtllm_extend_routing") == "#24566", False
else:
    V2_ON_DECODE = SGLANG >= (0, 5, 14)  # #28241
    FIXED_UPSTREAM = SGLANG >= (0, 5, 22)


def stock():
    """The release's own ``forward_extend`` (the 0.5.10 start-up hook may have fixed it)."""
    return without_fix(target_class(xqa.CLASS), "forward_extend", FIX.name)


def kernels(calls):
    return [(c.kernel, c.layer_id, c.q_rows, c.q_len_per_req, c.batch_size) for c in calls]


def test_detection_matches_what_the_backend_does():
    """The structural verdict (read at start-up) equals the behaviour of the real backend."""
    det = FIX.detect()
    with stock():
        bad = xqa_check.broken(xqa_check.xqa_calls())
    print(f"\nsglang {version('sglang')}: {det.verdict.value}: {det.reason}; refused calls: {len(bad)}")
    assert det.verdict in (Verdict.NEEDED, Verdict.NOT_NEEDED)
    assert (det.verdict is Verdict.NEEDED) == bool(bad)
    assert (det.verdict is Verdict.NEEDED) == (not FIXED_UPSTREAM)


def test_the_scenario_runs_the_releases_own_mask():
    """The scenario judges the release, not the plugin: where the release's ``__init__`` builds
    its own spec-decode mask (0.5.21+), every mask that reaches the decode kernel without the
    fix is a view of that mask, and nothing of ours is on ``forward_extend``."""
    with stock():
        assert target_marked_by(xqa.TARGET) != FIX.name
        backend, calls = xqa_check.xqa_backend_calls()
    own = getattr(backend, "_xqa_spec_dec_mask", None)
    masks = [c.mask for c in calls if c.kernel == "decode" and c.mask is not None]
    if own is None:
        assert not masks, "a release without its own mask passed one"
        pytest.skip(f"sglang {version('sglang')} builds no spec-decode mask of its own")
    assert masks, "the release's own mask never reached the kernel"
    assert all(m.untyped_storage().data_ptr() == own.untyped_storage().data_ptr() for m in masks)


@pytest.mark.skipif(FIXED_UPSTREAM, reason="0.5.22+ passes the mask and a bf16 query itself")
def test_without_the_fix_xqa_gets_what_it_refuses():
    with stock():
        calls = xqa_check.xqa_calls()
    decode = [c for c in calls if c.kernel == "decode"]
    assert xqa_check.broken(calls)
    assert all(c.q_len_per_req == 3 for c in decode)
    # 0.5.21 (#32269) passes its own mask to TARGET_VERIFY (the first two calls) only.
    masked = [c.mask is not None for c in decode]
    assert masked == ([True, True, False, False] if SGLANG == (0, 5, 21) else [False] * len(decode)), masked
    fp8 = [c for c in decode if c.q_dtype == torch.float8_e4m3fn]
    if V2_ON_DECODE and not main_window_snapshot():  # TARGET_VERIFY keeps bf16, DRAFT_EXTEND_V2 gets FP8 (0.5.14-0.5.21)
        assert len(decode) == 4 and len(fp8) == 2
    else:  # every decode-kernel query cast to FP8 (0.5.10-0.5.13; main of May-June 2026, V2 there with #24566)
        assert len(decode) == (4 if V2_ON_DECODE else 2) and len(fp8) == len(decode)


@pytest.mark.skipif(FIXED_UPSTREAM, reason="nothing to install on 0.5.22+")
def test_with_the_fix_every_multi_token_call_gets_bf16_and_the_causal_mask():
    with stock():
        before = xqa_check.xqa_calls()
        with temporarily_installed(FIX):
            assert target_marked_by(xqa.TARGET) == FIX.name
            after = xqa_check.xqa_calls()
    assert xqa_check.broken(before) and not xqa_check.broken(after)
    assert [c[:3] for c in kernels(after)] == [c[:3] for c in kernels(before)]  # routing untouched
    full = [c for c in after if c.kernel == "decode" and c.window_left < 0]
    sliding = [c for c in after if c.kernel == "decode" and c.window_left >= 0]
    assert full and sliding and all(c.q_dtype == torch.bfloat16 for c in full + sliding)
    for call in full:
        assert call.q_len_per_req == 3 and call.mask.dtype == torch.uint16 and tuple(call.mask.shape) == (2, 3, 2)
        assert call.mask[:, :, 0].tolist() == [[0b1, 0b11, 0b111]] * 2 and not call.mask[:, :, 1].any()
    # Sliding-window layers: one single-token request per draft row, no mask; row r of a
    # request with S tokens sees S-2+r tokens through the same page-table row.
    for call, orig in zip(sliding, (c for c in before if c.kernel == "decode" and c.window_left >= 0)):
        assert call.q_len_per_req == 1 and call.mask is None and call.q_rows == orig.q_rows == 6
        assert call.seq_lens == [s - 2 + r for s in orig.seq_lens for r in range(3)]
        for i, n in enumerate(call.seq_lens):  # the pages each row reads (page_size 1)
            assert torch.equal(call.page_table[i, :n], orig.page_table[i // 3, :n])


@pytest.mark.skipif(FIXED_UPSTREAM, reason="nothing to install on 0.5.22+")
def test_on_blackwell_the_fix_changes_nothing():
    """trtllm-gen (sm100) takes FP8 queries and needs no mask: the hook must pass through."""
    with stock():
        before = xqa_check.xqa_calls(xqa=False)
        with temporarily_installed(FIX):
            after = xqa_check.xqa_calls(xqa=False)
    assert [(c.kernel, c.q_dtype, c.mask is None) for c in after] == [(c.kernel, c.q_dtype, True) for c in before]
    assert kernels(after) == kernels(before)


@pytest.mark.parametrize("q_len", [2, 3, 7, 16, 17, 33, 40])
def test_mask_is_causal_within_the_draft(q_len):
    mask = xqa.spec_decode_mask(q_len, 3)
    words = mask.shape[-1]
    assert mask.shape == (3, q_len, words) and words == (q_len + 31) // 32 * 2
    bits = torch.stack([(mask.to(torch.int32) >> b) & 1 for b in range(16)], dim=-1).reshape(3, q_len, words * 16)
    want = (torch.arange(words * 16)[None, :] <= torch.arange(q_len)[:, None]).to(torch.int32)
    assert torch.equal(bits, want.expand(3, -1, -1))


def test_masks_handed_out_stay_alive():
    """A CUDA graph captured with one mask reads it at every replay: growing must not free it."""
    state = xqa._XqaState()
    small = state.mask(3, 2, torch.device("cpu"))
    big = state.mask(3, 9, torch.device("cpu"))
    assert big.shape[0] == 9 and state.mask(3, 4, torch.device("cpu")).data_ptr() == big.data_ptr()
    assert any(m.data_ptr() == small.data_ptr() for m in state.kept)


def test_single_token_rows_are_built_once_per_forward_pass():
    """All sliding-window layers of one forward pass share seq_lens and the SWA page table:
    the rows are built for the first and reused by later layers of the pass; a layer id that
    does not grow starts a new pass and builds them again (sglang runs a captured pass after
    eager warm-up runs on the same tensors: the capture must record its own build)."""
    state = xqa._XqaState()
    seq_lens, table = torch.tensor([5, 9], dtype=torch.int32), torch.arange(20, dtype=torch.int32).view(2, 10)

    def at(layer_id):
        state.layer_id = layer_id
        return state.single_token_rows(seq_lens, table, 3)

    rows = at(0)
    assert rows[0].tolist() == [3, 4, 5, 7, 8, 9] and torch.equal(rows[1], table.repeat_interleave(3, dim=0))
    assert at(2)[0] is rows[0] and at(4)[1] is rows[1]  # later layers of the same pass
    second = at(0)  # the next pass (same static tensors)
    assert second[0] is not rows[0] and torch.equal(second[0], rows[0])
    assert at(2)[0] is second[0]
    state.layer_id = 4
    assert state.single_token_rows(seq_lens.clone(), table, 3)[0] is not second[0]  # other tensors


def test_padded_graph_rows_never_get_a_length_below_one():
    state = xqa._XqaState()
    lens, _ = state.single_token_rows(torch.tensor([1, 7], dtype=torch.int32), torch.zeros(2, 4, dtype=torch.int32), 4)
    assert lens.tolist() == [1, 1, 1, 1, 4, 5, 6, 7]


def test_the_check_command_runs_the_scenario():
    from sglang_swa_plugin.cli import check_report

    with stock():  # `sglang-swa-plugin check` judges stock sglang (it disarms the start-up hook)
        rep = check_report()
    row = next(r for r in rep["rows"] if r["fix"] == FIX.name)
    print("\n", row)
    assert row["reproduced_without"] is (not FIXED_UPSTREAM) and row["fixed_with"] is (None if FIXED_UPSTREAM else True)
    assert row["detection"] == ("not needed" if FIXED_UPSTREAM else "needed")
