"""triton_swa_window on a real TritonAttnBackend over a real SWAKVPool (CPU; the Triton decode
kernel recorded): a sliding-window layer's decode must attend the last ``window + 1`` keys of
each request (the model's rule, and triton's own extend kernel's), eager and in CUDA graphs."""

from __future__ import annotations

import importlib
import os

import pytest

from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import triton_swa_window as tw

from helpers import fixed_alone, methods_alone, scenario_or_skip, skip_unless_needed

FIX = tw.FIX
WINDOW = 7


def _methods():
    mod = importlib.import_module(tw.MODULE)
    return {mod: tuple(n for n in tw.BUILDERS if hasattr(mod, n)), mod.TritonAttnBackend: ("init_cuda_graph_state",)}


def _scenario():
    return scenario_or_skip("triton_swa_window")


def test_detection_is_decided():
    assert FIX.detect().verdict is not Verdict.UNKNOWN, FIX.detect().reason


def test_stock_triton_decode_attends_one_key_less_than_the_window_rule():
    skip_unless_needed(FIX)
    with methods_alone(FIX, _methods()):
        out = _scenario()
    assert out.bug, out.seen
    # requests longer than the window get `window` keys, not window + 1
    assert out.seen["eager"]["keys"] == [WINDOW, 6, WINDOW], out.seen
    assert out.seen["replay"]["keys"] == [WINDOW, WINDOW, 3], out.seen


def test_decode_attends_window_plus_one_keys_eager_and_in_graphs_with_the_fix():
    if FIX.detect().verdict is Verdict.NOT_APPLICABLE:
        pytest.skip(f"not applicable here: {FIX.detect().reason}")
    with fixed_alone(FIX, _methods()):
        out = _scenario()
    assert not out.bug, out.seen
    assert out.seen["eager"]["keys"] == [WINDOW + 1, 6, WINDOW + 1], out.seen
    assert out.seen["capture"]["right"] and out.seen["replay"]["right"], out.seen
    buf = out.seen["graph_window_buffer"]
    assert buf["slots"] >= buf["needed"], buf


def test_extend_prefix_rail_keeps_its_offsets_consistent():
    """Extend and verify get one prefix key more, which their kernel masks (``q <= k +
    window``): the rail's start offset moves with it, so each query's window is unchanged."""
    skip_unless_needed(FIX)
    import torch

    mod = importlib.import_module(tw.MODULE)
    from sglang_swa_plugin.check import triton_bench as base

    env = base.build()
    with fixed_alone(FIX, _methods()), base.cpu_triton(env.backend, []):
        prefixes = torch.tensor([20, 5, 13])
        indptr = torch.zeros(8, dtype=torch.int32)
        bound = {"window_kv_indptr": indptr, "req_to_token": env.runner.req_to_token_pool.req_to_token,
                 "sliding_window_size": WINDOW, "seq_lens": prefixes, "req_pool_indices": torch.as_tensor(env.rows[:3]),
                 "bs": 3, "device": "cpu", "token_to_kv_pool_allocator": env.runner.token_to_kv_pool_allocator}
        params = __import__("inspect").signature(mod.update_sliding_window_buffer).parameters
        if "translator" in params:  # 0.5.23's form takes other inputs
            pytest.skip("0.5.23's rail builder takes a translator and a plan")
        if "index_table" in params:  # the rail gathers from the batch's index table, built as the backend does
            bound["index_table"] = env.backend.kv_index_translator.build_index_table(
                req_pool_indices=bound["req_pool_indices"], seq_lens=prefixes)
        _, indices, lens, start = mod.update_sliding_window_buffer(**{k: v for k, v in bound.items() if k in params})
    assert lens.tolist() == [WINDOW + 1, 5, WINDOW + 1]
    assert start.tolist() == [20 - WINDOW - 1, 0, 13 - WINDOW - 1]


def test_detection_reads_the_installed_rule():
    """Needed exactly where the rail keeps ``min(seq_len, window)`` keys and the extend kernel
    masks ``q <= k + window``: both read from the installed code."""
    mod = importlib.import_module(tw.MODULE)
    from sglang_swa_plugin.probe import function_text

    text = function_text(mod.update_sliding_window_buffer)
    keeps = bool(tw._KEEPS_WINDOW.search(text))
    assert (FIX.detect().verdict is Verdict.NEEDED) == (keeps and not tw._KEEPS_WINDOW_PLUS_ONE.search(text))
    assert tw._extend_kernel_module(mod.TritonAttnBackend), "extend_attention_fwd's module not found"


def test_decode_is_the_models_attention_through_sglangs_kernel():
    """Through sglang's own Triton decode kernel (Triton's interpreter, CPU; float32), requests
    longer and shorter than the window: every output row is the model's attention (window + 1
    keys) with the fix; stock's are not. Seeds: ``WINDOW_SEEDS`` (default 0,1)."""
    from interpreted import run_script

    skip_unless_needed(FIX)
    seeds = os.environ.get("WINDOW_SEEDS", "0,1").split(",")
    rows = run_script("interpreted_swa_window.py", seeds)
    assert len(rows) == len(seeds) and {r["path"] for r in rows} == {"decode"}, rows
    for row in rows:
        assert row["fixed"] < 1e-5, row  # float32 rounding
        assert row["stock"] > 0.1, row  # stock leaves out the window's first key: the comparison can fail
