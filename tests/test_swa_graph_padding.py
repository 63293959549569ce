"""swa_graph_padding on sglang's own CUDA-graph input buffers (``DecodeInputBuffers``, hybrid
SWA pool) on the CPU: a padded replay must not leave an earlier batch's SWA write locations
in the padded rows (the captured graph writes the padded rows' KV through them)."""

from __future__ import annotations

import pytest

from sglang_swa_plugin.fix import ScenarioUnavailable, Verdict
from sglang_swa_plugin.hooks import swa_graph_padding as gp

from helpers import fixed_alone, methods_alone, scenario_or_skip, skip_unless_needed

FIX = gp.FIX


def _methods():
    from sglang.srt.model_executor import cuda_graph_runner as cgr

    return {cgr.DecodeInputBuffers: ("populate_from_forward_batch",)}


def _scenario():
    return scenario_or_skip("swa_graph_padding")


def test_detection_is_decided():
    assert FIX.detect().verdict is not Verdict.UNKNOWN, FIX.detect().reason


def test_stock_sglang_keeps_stale_swa_slots_in_padded_rows_where_detection_says_needed():
    skip_unless_needed(FIX)
    with methods_alone(FIX, _methods()):
        out = _scenario()
    assert out.bug, out.seen
    assert out.seen["padded_rows_swa_locs"] == [1000 + 10 + 12 + i for i in range(4)]  # batch 1's 4th request


def test_padded_rows_hold_the_padding_slot_with_the_fix_or_upstream_fix():
    if FIX.detect().verdict is Verdict.NOT_APPLICABLE:
        pytest.skip(f"not applicable here: {FIX.detect().reason}")
    with fixed_alone(FIX, _methods()):
        out = _scenario()
    assert not out.bug, out.seen
    assert out.seen["padded_rows_swa_locs"] == [0, 0, 0, 0]


def test_unpadded_replays_are_left_alone():
    """The fix touches only padded replays: a full batch keeps every SWA location."""
    if FIX.detect().verdict is Verdict.NOT_APPLICABLE:
        pytest.skip(f"not applicable here: {FIX.detect().reason}")
    from sglang_swa_plugin.check import swa_graph_padding as scen

    with fixed_alone(FIX, _methods()):
        try:
            buffers, fill = scen.buffers_and_batch()
        except ScenarioUnavailable as e:
            pytest.skip(str(e))
        fill(scen.MAX_BS, scen.MAX_BS, 10)
    assert buffers.out_cache_loc_swa[: scen.MAX_BS * scen.N].tolist() == [1010 + i for i in range(scen.MAX_BS * scen.N)]


def test_repeated_padded_replays_clear_every_tail_and_a_replaced_buffer():
    """The padded tail's view is made once per size and reused: padded replays of 1, 3, 1
    and 2 requests (interleaved with full ones) each leave the padding slot from their last
    real row on; a buffer sglang replaces is cleared, not the old one's view."""
    skip_unless_needed(FIX)
    import torch

    from sglang_swa_plugin.check import swa_graph_padding as scen

    n, full = scen.N, scen.MAX_BS
    with fixed_alone(FIX, _methods()):
        try:
            buffers, fill = scen.buffers_and_batch()
        except ScenarioUnavailable as e:
            pytest.skip(str(e))
        for raw in (1, 3, 1, 2):
            fill(full, full, 10)
            fill(raw, full, 40)
            swa = buffers.out_cache_loc_swa
            assert swa[: raw * n].tolist() == [1040 + i for i in range(raw * n)], raw
            assert swa[raw * n:].tolist() == [0] * (swa.shape[0] - raw * n), raw
        old = buffers.out_cache_loc_swa
        buffers.out_cache_loc_swa = torch.full_like(old, 5)
        old.fill_(7)
        fill(2, full, 40)
        assert buffers.out_cache_loc_swa[2 * n:].tolist() == [0] * (old.shape[0] - 2 * n)
        assert old.tolist() == [7] * old.shape[0]
