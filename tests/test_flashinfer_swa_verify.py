"""flashinfer_swa_verify on the installed sglang: detection form, and the kv indices and
masks a real FlashInferAttnBackend hands the kernel for an EAGLE verify batch past the
window (sglang_swa_plugin/check/flashinfer_swa_verify.py), stock vs fixed."""

from __future__ import annotations

import contextlib

import pytest
import torch

from sglang_swa_plugin.check import flashinfer_swa_verify as sc
from helpers import sglang_release, without_fix

from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import flashinfer_swa_verify as m
from sglang_swa_plugin.probe import target_class


def _form():
    return m.form(target_class(m.UPDATER), target_class(m.VERIFY_INPUT))


def _builder():
    import inspect

    return m.builder_form(inspect.signature(target_class(m.VERIFY_INPUT).generate_attn_arg_prefill).parameters)


def test_detection_form_per_release():
    """0.5.10-0.5.13 crash form; 0.5.14 on wrong keys, gathered from ``req_to_token`` up to
    0.5.21 and through the KV-index translator from 0.5.22: needed in every release."""
    form, det = _form()
    rel = sglang_release()
    assert det.verdict is Verdict.NEEDED, det
    assert form == (m.CRASH_FORM if rel < (0, 5, 14) else m.WRONG_KEYS_FORM)
    assert _builder() == (m.TRANSLATOR_BUILDER if rel >= (0, 5, 22) else m.CLASSIC_BUILDER)
    assert _builder() in det.reason


def _needed():
    if _form()[1].verdict is not Verdict.NEEDED:
        pytest.skip("the fix is not installed on this sglang (see test_detection_form_per_release)")


@contextlib.contextmanager
def stock():
    """The release's own three functions (the 0.5.10 start-up hook may have fixed them)."""
    with without_fix(target_class(m.UPDATER), "update_sliding_window", m.FIX.name), \
            without_fix(target_class(m.UPDATER), "call_begin_forward", m.FIX.name), \
            without_fix(target_class(m.VERIFY_INPUT), "generate_attn_arg_prefill", m.FIX.name):
        yield


@pytest.mark.parametrize("topk", [1, 2])
def test_stock_verify_is_not_windowed_attention(topk):
    """Without the fix the sliding wrapper gets a TypeError (0.5.10-0.5.13) or keys and mask
    bits that are not the row's window (0.5.14+); the full wrapper is right either way."""
    _needed()
    with stock():
        got = sc.run(topk, fix_on=False)
    if _form()[0] == m.CRASH_FORM:
        assert got["error"].startswith("TypeError")
    else:
        assert got["sliding"] and not got["full"]


@pytest.mark.parametrize("topk", [1, 2])
def test_fixed_verify_is_windowed_causal_attention(topk):
    _needed()
    got = sc.run(topk, fix_on=True)
    assert "error" not in got, got
    assert got["sliding"] == [] and got["full"] == [] and got["rows"] == len(sc.PREFIXES) * (4 if topk == 1 else 6)


def _brute(tree, prefixes, n, window, parents_depth):
    """The windowed mask request by request, from positions."""
    out = []
    off = 0
    for P in prefixes:
        L = min(P, window)
        old = tree[off: off + n * (P + n)].view(n, P + n)
        off += n * (P + n)
        new = torch.zeros(n, L + n, dtype=torch.bool)
        for i in range(n):
            d_i = parents_depth[i]
            for c in range(L):
                new[i, c] = (P - L + c) >= P + d_i - window
            for j in range(n):
                new[i, L + j] = bool(old[i, P + j]) and parents_depth[j] >= d_i - window
        out.append(new.view(-1))
    return torch.cat(out)


@pytest.mark.parametrize("topk,window", [(1, 7), (2, 7), (2, 2), (1, 1)])
def test_windowed_mask_matches_positions(topk, window):
    """The mask's torch twin (what the CPU scenario runs for the fix's kernel; the GPU tests
    compare the kernel with it) against a per-element rule, windows narrower than the tree
    included, and a stock mask shorter than the batch (padded CUDA-graph rows)."""
    n = 4 if topk == 1 else 6
    parents = sc.tree_parents(topk, n)
    depth = [len(sc.ancestors(parents, i)) - 1 for i in range(n)]
    prefixes = (20, 5, 13, 0, 3)
    parts = []
    for P in prefixes:
        mm = torch.zeros(n, P + n, dtype=torch.bool)
        mm[:, :P] = True
        for i in range(n):
            for a in sc.ancestors(parents, i):
                mm[i, P + a] = True
        parts.append(mm.view(-1))
    tree = torch.cat(parts)
    L = torch.tensor([min(p, window) for p in prefixes])
    start = torch.tensor(prefixes) - L
    got = sc.mask_twin(tree, L, start, n, window, int(L.sum()))
    assert torch.equal(got, _brute(tree, prefixes, n, window, depth))
    # padded rows past the stock mask: no out-of-range read, real rows unchanged
    short = tree[: tree.numel() - 7]
    got2 = sc.mask_twin(short, L, start, n, window, int(L.sum()))
    keep = int((n * (L[:-1] + n)).sum())
    assert torch.equal(got2[:keep], got[:keep])
