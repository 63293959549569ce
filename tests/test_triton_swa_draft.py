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

import contextlib
import importlib
from types import SimpleNamespace

import pytest
import torch

import sglang.srt.model_executor.model_runner  # noqa: F401  (0.5.10: the start-up hook)

from sglang_swa_plugin.check import triton_swa_draft as scen
from sglang_swa_plugin.core import temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import triton_swa_draft as tsd
from sglang_swa_plugin.hooks import triton_swa_window as tsw

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


@contextlib.contextmanager
def without_window_fix():
    """sglang's window rail builders without triton_swa_window's wider rails (0.5.10: the start-up
    hook installed every fix in this process): the scenario is this fix's alone, whose draft steps
    keep ``window`` keys there (``tsd.decode_keys``)."""
    module = importlib.import_module(tsd.MODULE)
    with methods_alone(tsw.FIX, {module: [n for n in tsw.BUILDERS if n in module.__dict__]}):
        yield


@contextlib.contextmanager
def sglang_alone():
    with without_window_fix(), methods_alone(FIX, METHODS):
        yield


@contextlib.contextmanager
def fixed():
    with without_window_fix(), fixed_alone(FIX, METHODS):
        yield


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


def rail_reference(env, kv_indptr, kv_indices, bs):
    """Per request, in plain Python: the last ``min(L, window)`` keys of its full rail, through
    the pool's own translation; a key outside the ``kv_indices`` slice or the full pool reads 0."""
    w, size, out, ptr = scen.WINDOW, env.pool.full_to_swa_index_mapping.shape[0], [], [0]
    for r in range(bs):
        start, end = int(kv_indptr[r]), int(kv_indptr[r + 1])
        n = max(0, min(end - start, w))
        for src in range(end - n, end):
            full = int(kv_indices[src]) if 0 <= src < kv_indices.shape[0] else -1
            out.append(int(env.pool.translate_loc_from_full_to_swa(torch.tensor([full]))[0]) if 0 <= full < size else 0)
        ptr.append(ptr[-1] + n)
    return ptr, out + [0] * (bs * w - len(out))


def test_window_of_rail_equals_a_per_request_reference():
    """The draft step's window gather (fixed shapes, the pool's translation and size looked up
    once per backend) on rails of 1 and many requests, shorter and longer than the window,
    empty, claiming keys past the ``kv_indices`` slice (a stale capture) and holding ids
    outside the full pool (padded rows), twice on the same backend (``window`` keys: the
    fix alone, ``without_window_fix``)."""
    with without_window_fix():
        _window_of_rail_cases()


def _window_of_rail_cases():
    env = scen.build()
    be, size = env.backend, env.pool.full_to_swa_index_mapping.shape[0]
    ids = torch.cat([torch.cat(env.tokens).long(), torch.tensor([size + 5, -3, 0])])
    gen = torch.Generator().manual_seed(7)
    cases = [[3], [20], [0, 0], [2, 9, 7, 1], [25, 1, 8, 30]]
    cases += [torch.randint(0, 12, (bs,), generator=gen).tolist() for bs in (1, 5, 8)]
    for lens in cases:
        bs = len(lens)
        kv_indptr = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32)
        kv_indices = ids[torch.randint(0, ids.shape[0], (max(1, int(kv_indptr[-1]) - 3),), generator=gen)]
        out_indptr = torch.full((bs + 3,), -1, dtype=torch.int32)
        out_indices = torch.full((bs * scen.WINDOW + 4,), -1, dtype=torch.int64)
        tsd.window_of_rail(be, kv_indptr, kv_indices, bs, out_indptr, out_indices)
        ptr, want = rail_reference(env, kv_indptr, kv_indices, bs)
        assert out_indptr[1 : bs + 1].tolist() == ptr[1:], (lens, out_indptr.tolist(), ptr)
        assert out_indices[: bs * scen.WINDOW].tolist() == want, (lens, out_indices.tolist(), want)
        assert out_indices[bs * scen.WINDOW :].tolist() == [-1] * 4


def test_graph_window_translation_keeps_the_rest_of_the_buffer():
    """The draft-extend graph fill translates ``out[:indptr[bs]]`` over fixed shapes (sglang's
    helper reads that total on the host): as sglang's own translation there, the buffer past
    it untouched."""
    env = scen.build()
    be = env.backend
    full = torch.cat(env.tokens).long()[:40]
    assert full.shape[0] == 40
    for lens in ([7], [3, 7, 0, 5], [1, 1], [8, 8, 2]):  # 8: window + 1 keys (with triton_swa_window)
        bs = len(lens)
        indptr = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
        out = torch.cat([full, torch.full((30,), 999)])
        total = int(indptr[-1])
        want = torch.cat([env.pool.translate_loc_from_full_to_swa(full[:total]).long(), out[total:]])
        tsd.translate_window(be, indptr, bs, out)
        assert out.tolist() == want.tolist(), lens


def test_the_window_kernels_lay_out_what_the_torch_forms_do():
    """The Triton kernel a GPU runs for a draft step's window rail (``rail_kernel``, under
    Triton's interpreter) and the torch form of the CPU give the same offsets and ids for random
    rails: empty rows, rows shorter and longer than the window (and than the kernel's block),
    stale rails past the ``kv_indices`` slice, ids outside the pool, with and without the pool's
    mapping; and leave the rest of the buffers as they were. The same for the draft-extend graph
    fill's translation (``translate_head``, ``translate_window``)."""
    from interpreted import run_script

    rows = run_script("interpreted_swa_draft_rail.py", ["0", "1"])
    assert len(rows) == 2, rows
    for row in rows:
        assert row["cases"] == 30 and row["slots"] > 5000 and row["differ"] == 0, row
        assert row["translate_cases"] == 30 and row["translate_slots"] > 5000 and row["translate_differ"] == 0, row


def test_the_window_kernels_are_a_preview():
    """The one-kernel rails (``rail_kernel``) have run on a GPU but served no row yet: they are used only where
    ``SGLANG_SWA_PLUGIN_PREVIEW`` names ``triton_swa_draft_kernels``; otherwise the torch forms
    that ran on the GPU (per backend, decided once)."""
    from sglang_swa_plugin.probe import swapped

    mapping = torch.arange(8)
    pool = SimpleNamespace(full_to_swa_index_mapping=mapping, translate_loc_from_full_to_swa=lambda ids: mapping[ids])
    assert tsd.KERNELS in tsd.FIX.previews
    for on in (False, True):
        be = SimpleNamespace(sliding_window_size=4, token_to_kv_pool=pool)
        with swapped(tsd.FIX, "previews_on", frozenset({tsd.KERNELS}) if on else frozenset()):
            assert tsd._rail_state(be)["kernel"] is on
