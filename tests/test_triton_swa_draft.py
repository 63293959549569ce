"""triton_swa_draft: the window KV indices a sliding-window layer's Triton kernels receive in
speculative drafting, on a real ``TritonAttnBackend`` (EAGLE, window 7) over a real ``SWAKVPool``
whose full and SWA index spaces differ (``sglang_swa_plugin.check.triton_swa_draft``): eager
DRAFT_EXTEND (0.5.10-0.5.13, where the backend has its own branch for it), DRAFT_EXTEND_V2 at
CUDA-graph capture and at replay of a second batch on the captured metadata, and the real
``TritonMultiStepDraftBackend`` (topk 1, 3 steps) eager, at capture and at replay. The kernels
are recorded (they cannot run on a CPU); sglang's Triton gathers run as torch twins. Expected:
per request the last ``min(P, 7)`` of its ``P`` keys before the tokens being extended (decode
step ``s``: prefix plus ``s + 1`` draft tokens), through the pool's real
``translate_loc_from_full_to_swa``, and (extend) window offset ``P - min(P, 7)``. Without the
fix (0.5.10-0.5.22) the kernels get ``kv_indices=None`` (a Triton compile error on a GPU)."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch

import sglang.srt.model_executor.model_runner  # noqa: F401,E402  (0.5.10: the start-up hook)

from sglang_swa_plugin.check import triton_swa_draft as scen
from sglang_swa_plugin.core import temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import triton_swa_draft as tsd

from helpers import fixed_alone, methods_alone, sglang_release

FIX = tsd.FIX
BACKEND = importlib.import_module(tsd.MODULE).TritonAttnBackend
MULTI = importlib.import_module(tsd.MODULE).TritonMultiStepDraftBackend
METHODS = {BACKEND: [t.rsplit(".", 1)[1] for t in (tsd.EAGER, tsd.CAPTURE, tsd.REPLAY, tsd.FILL, tsd.BUILD,
                                                    tsd.OUT_GRAPH)],
           MULTI: [t.rsplit(".", 1)[1] for t in (tsd.MULTI_REPLAY, tsd.MULTI_OUT_GRAPH)]}
PATHS = ("eager", "capture", "replay", "decode_eager", "decode_capture", "decode_replay")


def expected(path: str):
    """Upstream's state per path: None (no such path), False (broken), True (fixed)."""
    release = sglang_release()
    if path.startswith("decode"):
        return release >= (0, 5, 23)
    if path == "eager":
        return False if release < (0, 5, 14) else None
    return release >= (0, 5, 23)


def sglang_alone():
    return methods_alone(FIX, METHODS)


def fixed():
    return fixed_alone(FIX, METHODS)


def seen(ctx) -> dict:
    with ctx():
        return scen.scenario().seen


def test_detection_per_half_matches_the_release():
    with sglang_alone():
        det = FIX.detect()
        halves = tsd.probe(BACKEND)
    assert halves == {"eager": expected("eager"), "graph": expected("graph"), "decode": expected("decode")}, halves
    want = Verdict.NOT_NEEDED if sglang_release() >= (0, 5, 23) else Verdict.NEEDED
    assert det.verdict is want, det


def test_check_scenario_reproduces_and_the_fix_corrects_it():
    with sglang_alone():
        bug = FIX.reproduce()
        assert bug == (not expected("graph"))
        if bug:
            with temporarily_installed(FIX):
                assert not FIX.reproduce()


@pytest.mark.parametrize("path", PATHS)
def test_sliding_layer_gets_its_window_in_swa_space(path):
    got = seen(fixed).get(path)
    if expected(path) is None:
        assert got is None
        pytest.skip(f"this sglang runs no {path} DRAFT_EXTEND branch of its own")
    if got is None and expected(path):
        pytest.skip("not needed: this sglang builds the multi-step draft window rail itself (0.5.23's Triton "
                    "kernels have no CPU twin here)")
    assert got["right"], got


@pytest.mark.parametrize("path", PATHS)
def test_without_the_fix_the_sliding_layer_gets_no_window(path):
    """What the fix is for: sglang alone, where it needs the fix."""
    if expected(path) is not False:
        pytest.skip(f"not needed: this sglang builds the {path} window itself" if expected(path)
                    else f"this sglang has no {path} DRAFT_EXTEND branch of its own")
    got = seen(sglang_alone)[path]
    whys = [x.get("why", "") for x in got.get("steps", [got])]
    assert not got["right"] and all("None" in w for w in whys), got


def test_other_graph_modes_are_left_to_sglang():
    """TARGET_VERIFY capture metadata (sglang's own window rail) is the same with the fix in."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    def verify_window(ctx):
        with ctx():
            env = scen.build()
            be, bs = env.backend, len(scen.PREFIXES)
            with scen.cpu_triton(be, []):
                fb = env.tb.make_forward_batch(env.runner, "target_verify", req_pool_indices=env.rows,
                                               seq_lens=list(scen.PREFIXES), attn_backend=be)
                if hasattr(be, "init_forward_metadata_out_graph"):
                    be.init_forward_metadata_out_graph(fb, in_capture=True)
                else:  # a chain mask, as the verify graph runner hands it
                    spec = SimpleNamespace(custom_mask=torch.ones(bs * scen.DRAFT_TOKENS * 64, dtype=torch.bool))
                    be.init_forward_metadata_capture_cuda_graph(bs, bs * scen.DRAFT_TOKENS, fb.req_pool_indices,
                                                                 fb.seq_lens, None, ForwardMode.TARGET_VERIFY, spec)
            md = be.forward_metadata
            return md.window_kv_indptr[: bs + 1].tolist(), md.window_kv_indices[:32].tolist()

    assert verify_window(fixed) == verify_window(sglang_alone)


def test_capture_after_a_larger_batch_stays_in_range():
    """Issue 18, GPU: NEXTN 3 steps died capturing the draft-decode graph of bs 30 after bs 32
    (a device-side "index out of bounds"). The warm-up runs of the larger batch advance the
    shared position buffer; sglang's rail kernel then writes a ``kv_indptr`` (from positions)
    longer than the ``kv_indices`` slice (from ``seq_lens``) it hands each step. The window
    build must stay in range and give SWA-pool slots only."""
    if expected("decode") is not False:
        pytest.skip("not needed: this sglang builds the multi-step draft window rail itself")
    env = scen.build()
    with fixed():
        got = scen.stale_capture(env)
    assert "error" not in got, got
    for window in got["windows"]:
        assert window is not None and 0 <= int(window.min()) and int(window.max()) <= env.pool.size_swa, got
