"""triton_swa_tree_verify on a real TritonAttnBackend over a real SWAKVPool (CPU): a tree's
target verify on a sliding-window layer, through sglang's own Triton extend kernel (Triton's
interpreter) against the model, and its rail built inside a (CPU stand-in of a) CUDA graph."""

from __future__ import annotations

import importlib
import logging
import os
from types import SimpleNamespace

from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import triton_swa_tree_verify as tv

from helpers import fixed_alone, methods_alone, scenario_or_skip, skip_unless_needed

FIX = tv.FIX


def _methods():
    return {importlib.import_module(tv.MODULE).TritonAttnBackend: ("forward_extend",)}


def test_detection_reads_the_installed_kernel(monkeypatch):
    """Needed where the extend kernel windows by row (no query position among its parameters);
    a kernel that takes positions is not needed; no such kernel: unknown."""
    params = tv.kernel_parameters()
    assert FIX.detect().verdict is (Verdict.NEEDED if params and "SLIDING_WINDOW_SIZE" in params else Verdict.UNKNOWN)
    if params:
        monkeypatch.setattr(tv, "kernel_parameters", lambda: params + ["q_positions"])
        assert FIX.detect().verdict is Verdict.NOT_NEEDED
        monkeypatch.setattr(tv, "kernel_parameters", lambda: [p for p in params if p != "SLIDING_WINDOW_SIZE"])
        assert FIX.detect().verdict is Verdict.UNKNOWN


def test_the_recorded_kernel_call_windows_drafts_by_row_stock_and_by_position_fixed():
    """``check``'s scenario: the keys and drafts each draft of a tree attends, read off the recorded
    kernel call: stock, the drafts whose row is past their depth (the third and fourth of each
    request) attend other keys than the model; with the fix every draft attends the model's."""
    skip_unless_needed(FIX)
    with methods_alone(FIX, _methods()), deterministic_preview():
        stock = scenario_or_skip("triton_swa_tree_verify")
    assert stock.bug and sorted(stock.seen["wrong_drafts"]) == [f"{b}:draft{i}" for b in range(3) for i in (2, 3)], stock
    with fixed_alone(FIX, _methods()), deterministic_preview():
        fixed = scenario_or_skip("triton_swa_tree_verify")
    assert not fixed.bug and fixed.seen["drafts"] == 12, fixed
    assert ("deterministic" in stock.seen) is _has_unified_kernel(), stock.seen.keys()
    if "deterministic" in stock.seen:
        # the unified kernel: a chain's drafts of the requests longer than the window (0 and 2) but
        # the last attend later drafts; a tree's drafts past their depth lose keys as well
        det = stock.seen["deterministic"]
        assert det["chain"] == [f"{b}:draft{i}" for b in (0, 2) for i in range(3)], det
        assert {"1:draft2", "1:draft3"} | {f"0:draft{i}" for i in range(4)} <= set(det["tree"]), det
        assert fixed.seen["deterministic"] == {"tree": [], "chain": []}, fixed


def deterministic_preview(on: bool = True):
    """The fix's deterministic preview on (or off) for the block, as SGLANG_SWA_PLUGIN_PREVIEW decides it."""
    from sglang_swa_plugin.probe import swapped

    return swapped(FIX, "previews_on", frozenset({tv.DETERMINISTIC}) if on else frozenset())


def _has_unified_kernel() -> bool:
    """Whether this sglang's deterministic inference runs its unified extend kernel, and it reads a
    sliding-window layer's new keys at their SWA ids (0.5.10-0.5.11 read them at full-pool ids:
    the fix leaves those, a gap)."""
    return bool(tv.unified_reads_swa_ids())


def test_the_plan_covers_the_unified_kernel_where_it_reads_swa_ids():
    """The unified path's source names the new keys' SWA ids: the plan's hook covers a deterministic
    verify; it does not (0.5.10-0.5.11: full-pool ids): the hook that leaves it to sglang."""
    hook = FIX.detect().plan[0].fn
    assert hook is (tv._tree_window_not_unified if tv.unified_reads_swa_ids() is False else tv._tree_window), hook


def test_a_deterministic_verify_is_the_models_attention_through_sglangs_kernel():
    """Deterministic inference (sglang's unified kernel): a chain's verify (topk 1) and two trees',
    requests longer and shorter than the window: every output row is the model's attention with
    the fix; stock none is (the chain's rows past the window attend later drafts). Where the
    unified kernel reads new keys at full-pool ids (0.5.10-0.5.11), the fix leaves the verify as
    sglang runs it (wrong: a gap). Seeds: ``WINDOW_SEEDS`` (default 0)."""
    from interpreted import run_script

    skip_unless_needed(FIX)
    seeds = os.environ.get("WINDOW_SEEDS", "0").split(",")
    rows = run_script("interpreted_swa_deterministic.py", seeds)
    assert len(rows) == 3 * len(seeds), rows
    for row in rows:
        assert row["stock"] > 1e-2, row
        assert (row["fixed"] < 1e-5) if _has_unified_kernel() else (row["fixed"] == row["stock"]), row


def test_a_tree_verify_is_the_models_attention_through_sglangs_kernel():
    """A chain's verify (right stock) and two trees' (drafts past their depth), requests longer and
    shorter than the window: every output row is the model's attention with the fix; stock's trees
    are not. Seeds: ``WINDOW_SEEDS`` (default 0,1)."""
    from interpreted import run_script

    skip_unless_needed(FIX)
    seeds = os.environ.get("WINDOW_SEEDS", "0,1").split(",")
    rows = run_script("interpreted_swa_tree.py", seeds)
    assert len(rows) == 3 * len(seeds), rows
    for row in rows:
        assert row["fixed"] < 1e-5, row  # float32 rounding
        assert (row["stock"] < 1e-5) is (row["path"] == "verify-chain"), row  # stock: right on a chain only


def test_the_rail_kernel_lays_out_what_the_torch_form_does():
    """The Triton kernel the GPU runs (``rail_kernel``, under Triton's interpreter) and the torch
    form of the CPU give the same offsets and mask cells, for random trees, both rules (this fix's
    window, ``triton_local_attn``'s chunks), edges crossed and rows longer than the kernel's block;
    and the decode's chunk rail (``triton_local_attn``) for random lengths. Seeds: ``WINDOW_SEEDS`` (default 0,1)."""
    from interpreted import run_script

    seeds = os.environ.get("WINDOW_SEEDS", "0,1").split(",")
    rows = run_script("interpreted_rail_kernel.py", seeds)
    assert len(rows) == len(seeds), rows
    for row in rows:
        assert row["cases"] == 24 and row["cells"] > 10_000 and row["differ"] == 0, row
        assert row["decode_cases"] == 24 and row["decode_keys"] > 1000 and row["decode_differ"] == 0, row


def test_an_uncovered_backend_form_runs_as_sglang_runs_it_and_is_named_once(caplog):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    backend = SimpleNamespace(dcp_size=2, forward_metadata=object())
    fb = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, spec_info=SimpleNamespace(topk=2, draft_token_num=4))
    layer = SimpleNamespace(sliding_window_size=7, layer_id=0)
    from sglang_swa_plugin import log

    log.WARNED.discard((tv.NAME, "decode context parallelism"))
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert tv._tree_window(lambda *a, **k: "stock", backend, None, None, None, layer, fb) == "stock"
    named = [r.getMessage() for r in caplog.records if tv.NAME in r.getMessage()]
    assert len(named) == 1 and "decode context parallelism" in named[0], named


def test_a_deterministic_verify_without_the_unified_kernel_runs_as_sglang_runs_it(caplog):
    """Deterministic inference on a backend without sglang's unified kernel, over a translating
    index space, where that kernel reads new keys at full-pool ids (the plan's other hook), or
    with the fix's deterministic preview off (named in the warning): a chain's verify runs stock,
    named once."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_swa_plugin import log

    fb = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, spec_info=SimpleNamespace(topk=1, draft_token_num=4))
    layer = SimpleNamespace(sliding_window_size=7, layer_id=0)
    metadata = SimpleNamespace(custom_mask=object())
    unified = dict(enable_deterministic=True, extend_attention_fwd_unified=None, forward_metadata=metadata)
    for hook, backend, path in (
            (tv._tree_window, SimpleNamespace(enable_deterministic=True, forward_metadata=metadata),
             "deterministic inference"),
            (tv._tree_window, SimpleNamespace(**unified, _translate_kv_loc=object()),
             "a translating KV index space (unified pool)"),
            (tv._tree_window_not_unified, SimpleNamespace(**unified), "deterministic inference"),
            (tv._tree_window, SimpleNamespace(**unified), f"deterministic inference (a preview: "
                                                          f"SGLANG_SWA_PLUGIN_PREVIEW={tv.DETERMINISTIC})")):
        log.WARNED.discard((tv.NAME, path))
        caplog.clear()
        preview = deterministic_preview(hook is not tv._tree_window or "preview" not in path)
        with caplog.at_level(logging.WARNING), preview:
            for _ in range(2):
                assert hook(lambda *a, **k: "stock", backend, None, None, None, layer, fb) == "stock"
        named = [r.getMessage() for r in caplog.records if tv.NAME in r.getMessage()]
        assert len(named) == 1 and path in named[0], named


def test_the_window_rail_replays_from_the_batch_buffers_without_a_sync():
    """Built inside a CPU stand-in of a CUDA-graph capture: no host-device sync, and a replay after
    the batch's buffers (lengths, positions, sglang's tree mask and its offsets) took another batch
    gives what that batch builds eagerly."""
    import torch

    from cpu_graph import replayed_tree_rail
    from sglang_swa_plugin.check import triton_bench as sd
    from sglang_swa_plugin.check.fa3_spec_translate import verify_input

    from interpreted import tree_inputs

    skip_unless_needed(FIX)
    n, batch = 4, tree_inputs((-1, 0, 0, 1))

    with fixed_alone(FIX, _methods()):
        env = sd.build()
        env.backend.num_draft_tokens = n
        lens, lens2 = [21, 6, 14], [9, 16, 3]
        mask, positions = batch(lens)
        fb = env.tb.make_forward_batch(env.runner, "target_verify", req_pool_indices=env.rows[:3], seq_lens=lens,
                                       spec_info=verify_input(mask, lens, 2, n, positions), attn_backend=env.backend)
        fb.positions = positions.clone()
        with sd.cpu_triton(env.backend, []):
            env.backend.init_forward_metadata(fb)
        captured, eager, syncs = replayed_tree_rail(
            env.backend, fb, lambda: tv._window_fields(env.backend, fb, sd.WINDOW, True), lens2, batch, n)
    assert syncs == [], syncs
    for name in ("window_kv_indptr", "window_kv_indices", "mask_indptr", "custom_mask"):
        assert torch.equal(captured[name], eager[name]), name
    width = [min(m, sd.WINDOW) + n for m in lens2]  # the second batch's rows, not the first's
    assert captured["mask_indptr"].tolist() == [0, n * width[0], n * (width[0] + width[1]), n * sum(width)]
