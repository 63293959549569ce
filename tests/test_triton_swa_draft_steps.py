"""triton_swa_draft with the fixes a server installs beside it (``triton_swa_window``,
``swa_write_loc``): the keys each multi-step draft-decode step's sliding layer reads and where it
writes, on a real ``TritonMultiStepDraftBackend`` (topk 1, 3 steps, two draft-decode steps) over a
real ``SWAKVPool`` whose full and SWA index spaces differ (``check.triton_bench``: window 7),
driven as ``EAGLEWorker``/``EagleWorkerV2.draft_forward`` drives it: the metadata of all steps
built once (eager, at CUDA-graph capture, at replay of other requests on the captured metadata),
then per step ``forward_batch.out_cache_loc`` set to that step's slice
(``per_step_draft_out_cache_loc``) of the draft's slots, which are the request's
``req_to_token`` entries past its prefix (sglang's ``assign_draft_cache_locs``), and the layer's
real ``forward_decode`` run (its kernel recorded, sglang's Triton index kernels as torch twins).

Right, per step ``s`` and request of prefix ``P`` (``L = P + s + 1`` keys: the prefix and the
draft tokens of steps ``0..s``): the decode kernel reads the last ``min(L, keys)`` of them in SWA
space, ``keys`` being what the target's own decode reads for a request of ``L`` keys (``window +
1`` with ``triton_swa_window``: what the model and triton's extend, so the draft's extend, attend;
MiMo-V2's MTP layer reads the OLDEST key of that window), the last of them the key this step
writes; and the step's key lands at the SWA translation of its own slot. 0.5.23 builds the
draft steps' rail itself (Triton kernels: run under Triton's interpreter in a child process),
``sliding_window_size`` keys, which triton_swa_window widens there. Found on an H100
(MiMo-V2, triton, NEXTN 3 steps): the draft steps read one key less than the target and the
draft extend: accept length 2.08 against 4.0."""

from __future__ import annotations

import contextlib
import functools
import importlib

import pytest
import torch

import sglang.srt.model_executor.model_runner  # noqa: F401  (0.5.10: the start-up hook)

from sglang_swa_plugin.check import triton_bench as bench
from sglang_swa_plugin.check.triton_swa_draft import draft_metadata
from sglang_swa_plugin.core import temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import swa_write_loc as wl
from sglang_swa_plugin.hooks import triton_swa_draft as tsd
from sglang_swa_plugin.hooks import triton_swa_window as tsw

from helpers import methods_alone

MODULE = importlib.import_module(tsd.MODULE)
BACKEND, MULTI = MODULE.TritonAttnBackend, MODULE.TritonMultiStepDraftBackend
PREFIXES = (20, 5, 13)  # two longer than the window, one shorter; different lengths
REPLAY_PREFIXES = (9, 16, 11)
FIXES = (tsw.FIX, tsd.FIX, wl.FIX)  # the order a server installs them (swa_write_loc wraps last)
PHASES = ("eager", "capture", "replay")


def _methods(fix) -> dict:
    """Every class method and module function ``fix`` may hook, by class or module (0.5.10: the
    start-up hook installed every fix in this process)."""
    from sglang_swa_plugin.probe import optional_module

    out: dict = {}
    for target in fix.targets:
        owner, name = target.rsplit(".", 1)
        module, cls_name = owner.rsplit(".", 1)
        obj = getattr(optional_module(module), cls_name, None) if cls_name[:1].isupper() else optional_module(owner)
        if obj is not None and name in obj.__dict__:
            out.setdefault(obj, []).append(name)
    return out


@contextlib.contextmanager
def served(with_draft_fix: bool = True):
    """The three fixes as a server has them where needed (``with_draft_fix`` False: triton_swa_draft
    left out, which cannot run the draft decode of 0.5.10-0.5.22 at all)."""
    fixes = [f for f in FIXES if with_draft_fix or f is not tsd.FIX]
    with contextlib.ExitStack() as stack:
        for fix in fixes:
            stack.enter_context(methods_alone(fix, _methods(fix)))
        needed = [f for f in fixes if f.detect().verdict is Verdict.NEEDED]
        stack.enter_context(temporarily_installed(*needed))
        yield needed


def _target_decode_keys(env, lens) -> list:
    """How many keys the target's own decode (a plain DECODE through a ``TritonAttnBackend``, its
    window rail built by sglang's helper) reads per request of ``lens`` keys."""
    calls: list = []
    be = bench.triton_backend(env.runner)
    with bench.cpu_triton(be, calls):
        fb = env.tb.make_forward_batch(env.runner, "decode", req_pool_indices=env.rows[: len(lens)],
                                       seq_lens=list(lens), attn_backend=be)
        be.init_forward_metadata(fb)
        call = bench.layer_call(env, be, fb, calls)
    ptr = call["kv_indptr"]
    return [int(ptr[b + 1] - ptr[b]) for b in range(len(lens))]


def _draft_batch(env, multi, prefixes):
    """The draft-decode batch of requests holding ``prefixes`` keys: positions the first draft
    token's, ``out_cache_loc`` the draft's slots (topk 1: per request, its steps' slots)."""
    rows, rtt = env.rows[: len(prefixes)], env.runner.req_to_token_pool.req_to_token
    loc = torch.cat([rtt[r, p:p + bench.NUM_STEPS] for r, p in zip(rows, prefixes)]).long()
    fb = env.tb.make_forward_batch(env.runner, "draft_decode", req_pool_indices=rows, seq_lens=list(prefixes),
                                   out_cache_loc=loc, attn_backend=multi)
    fb.positions = fb.seq_lens.clone()
    assert fb.out_cache_loc.tolist() == loc.tolist()
    return fb


def _steps(env, multi, fb, calls, captured=None) -> list:
    """Per draft-decode step, as ``draft_forward`` runs it: its slice of ``out_cache_loc``, the
    sliding layer's ``forward_decode`` writing marker keys; what the kernel read, where the keys landed."""
    from sglang.srt.speculative import eagle_utils

    layer, pool = env.swa_layer, env.pool
    keys = pool.get_key_buffer(layer.layer_id)
    whole, bs = fb.out_cache_loc, fb.batch_size
    per_step = eagle_utils.per_step_draft_out_cache_loc(whole, bs, 1, bench.NUM_STEPS) \
        if hasattr(eagle_utils, "per_step_draft_out_cache_loc") \
        else whole.view(bs, bench.NUM_STEPS).t().contiguous()
    out = []
    for s, be in enumerate(multi.attn_backends):
        if captured is not None:
            be.forward_metadata = captured[s]
        fb.out_cache_loc = per_step[s]
        q = torch.zeros(bs, layer.tp_q_head_num * layer.qk_head_dim)
        marker = (100 * (s + 1) + torch.arange(bs)).to(keys.dtype)
        kv = marker[:, None, None].expand(bs, layer.tp_k_head_num, layer.qk_head_dim).contiguous()
        keys.zero_()
        calls.clear()
        be.forward_decode(q, kv, kv.clone(), layer, fb)
        call = calls[-1]
        ptr, ids = call["kv_indptr"], call["kv_indices"]
        out.append({"read": [ids[int(ptr[b]):int(ptr[b + 1])].tolist() for b in range(bs)],
                    "own_slots": env.tb.translate(pool, per_step[s]).tolist(),
                    "written": keys[env.tb.translate(pool, per_step[s]), 0, 0].tolist(),
                    "marker": marker.tolist()})
    fb.out_cache_loc = whole
    return out


def _judge(env, steps, prefixes, keys_of, writes: bool = True) -> list:
    """The wrong things seen, per step and request ([] where all is right); ``writes`` False: the
    keys' slots not judged (a capture on 0.5.23+, whose write buffer a replay fills)."""
    rtt, wrong = env.runner.req_to_token_pool.req_to_token, []
    for s, got in enumerate(steps):
        for b, (row, p) in enumerate(zip(env.rows, prefixes)):
            n = p + s + 1
            w = min(n, keys_of(n))
            want = env.tb.translate(env.pool, rtt[row, n - w:n].long()).tolist()
            if got["read"][b] != want:
                wrong.append(f"step {s} request {b} (L={n}): read {got['read'][b]}, want the last {w}: {want}")
            if not got["read"][b] or got["read"][b][-1] != got["own_slots"][b]:
                wrong.append(f"step {s} request {b}: its own key (SWA slot {got['own_slots'][b]}) is not the last read")
            if writes and got["written"][b] != got["marker"][b]:
                wrong.append(f"step {s} request {b}: key {got['marker'][b]} not at SWA slot {got['own_slots'][b]}")
    return wrong


def _run(phase: str) -> tuple:
    env = bench.build()
    keys_of = lambda n: _target_decode_keys(env, [n])[0]  # noqa: E731
    multi = bench.make_backend(env.runner, "TritonMultiStepDraftBackend", 1, bench.NUM_STEPS)
    captured, calls = None, []
    prefixes = REPLAY_PREFIXES if phase == "replay" else PREFIXES
    with contextlib.ExitStack() as stack:
        for be in multi.attn_backends:
            stack.enter_context(bench.cpu_triton(be, calls))
        if phase != "eager":
            multi.init_cuda_graph_state(4, 4)
            fb = _draft_batch(env, multi, PREFIXES)
            draft_metadata(multi, fb, "capture")
            captured = [be.forward_metadata for be in multi.attn_backends]
        if phase != "capture":
            fb = _draft_batch(env, multi, prefixes)
            draft_metadata(multi, fb, phase)
        steps = _steps(env, multi, fb, calls, captured)
    return env, steps, prefixes, keys_of


@functools.lru_cache(maxsize=None)
def _interpreted() -> dict:
    from interpreted import run_script

    return {row["phase"]: row for row in run_script("interpreted_swa_draft_steps.py", ["0"])}


@pytest.mark.parametrize("phase", PHASES)
def test_each_draft_step_reads_the_targets_window_and_writes_its_own_slot(phase):
    """0.5.10-0.5.22 (triton_swa_draft builds the rail): here, sglang's index kernels as torch
    twins. 0.5.23+ (sglang builds it with Triton kernels of its own): in a child process under
    Triton's interpreter (tests/interpreted_swa_draft_steps.py), all phases at once."""
    if tsd.FIX.detect().verdict is not Verdict.NEEDED:
        rows = _interpreted()
        assert "triton_swa_window" in rows[phase]["installed"], rows
        assert rows[phase]["wrong"] == [], rows[phase]
        return
    with served() as installed:
        assert tsd.FIX in installed
        env, steps, prefixes, keys_of = _run(phase)
        widened = tsw.FIX in installed
        assert keys_of(30) == bench.WINDOW + (1 if widened else 0)  # the target's decode rail
        # a capture's writes: the captured gather (swa_write_loc's) that each replay runs
        assert _judge(env, steps, prefixes, keys_of) == []


def test_draft_steps_keep_as_many_keys_as_the_targets_decode_rail():
    """``decode_keys``: ``window + 1`` while triton_swa_window's hook is on sglang's rail builder,
    ``window`` without it (triton_swa_draft alone: its own scenario's expectation)."""
    widen = tsw.FIX.detect().verdict is Verdict.NEEDED
    with methods_alone(tsw.FIX, _methods(tsw.FIX)):
        assert tsd.decode_keys(7) == 7
        with temporarily_installed(tsw.FIX):
            assert tsd.decode_keys(7) == (8 if widen else 7)
        assert tsd.decode_keys(7) == 7
