"""The expected accept length of the selftest's speculative rows (selftest/acceptance.py) on the
CPU: every target's drafts agree with it (the expectation is high), and a draft that reads the
wrong keys (every cached key from the slot before; a sliding window one key off) lowers the
expectation by more than the tolerance a row is judged with, so such a row cannot pass."""

from __future__ import annotations

import pytest

from sglang_swa_plugin.selftest import acceptance, rows, targets
from sglang_swa_plugin.selftest.targets import readout

# A few short requests: the file in about a minute. The prompts end mid-chunk (Llama 4's chunk
# of 32): after a chunk boundary its previous-token reads pair up the generated tokens (the
# chunk's first query has no previous key in its chunk), which hides a one-slot shift half the time.
N, LENGTH, NEW, SEED = 4, 80, 40, 1
HIGH = 2.0  # every draft accepts at least one draft token per step on average (above acceptance.DRAFT_ACCEPTS)


def _cases():
    out = []
    for name in targets.NAMES:
        kind = targets.draft_kind(targets.load(name))
        out += [(name, mode) for mode, spec in rows.MODES.items() if spec is not None and spec.draft == kind
                and not (name == "step3p5" and spec.algorithm != "EAGLE")]  # below: Step3.5 NEXTN
    return out


CASES = _cases()


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """One torch thread for this file's tests (conftest's one_torch_thread)."""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Per target, once: its module, float32 reference model, checkpoint dirs, prompts and
    float32 greedy outputs (built on first use)."""
    cache = {}

    def get(name: str):
        if name not in cache:
            t = targets.load(name)
            why_not = targets.unavailable(t)
            if why_not:
                pytest.skip(why_not)
            model = t.hf_model(t.SIZE)
            saved = t.save(str(tmp_path_factory.mktemp(name)))
            ps = readout.prompts(N, LENGTH, SEED)
            cache[name] = (t, model, saved, ps, readout.greedy(model, ps, NEW, cache=True)[0])
        return cache[name]

    return get


def _expected(built, name: str, mode: str, fault=None):
    t, model, saved, ps, ref = built(name)
    return acceptance.expected_accept(t, rows.MODES[mode], ps, NEW, ref, fault=fault, model=model, saved=saved)


def test_every_draft_kind_has_rows():
    """The speculative modes of rows.MODES reach the emulation for both draft kinds."""
    assert {rows.MODES[m].draft for _, m in CASES} == {"eagle3", "mtp"}, CASES


@pytest.mark.targets  # the targets' float32 models and drafts on the CPU: on noxfile.TARGET_VERSIONS only
@pytest.mark.parametrize("name,mode", CASES)
def test_drafts_agree_and_a_wrong_key_lowers_the_expectation(built, name, mode):
    """The draft as sglang should run it: high; every key read from the slot before, and (a
    draft with a sliding window) the window one key narrower and one wider: lower by more than
    the tolerance."""
    spec = rows.MODES[mode]
    if spec.algorithm == "EAGLE" and spec.topk > 1:
        pytest.skip("multi-layer EAGLE with topk > 1 is not computed")
    good = _expected(built, name, mode)
    assert good is not None and HIGH <= good <= spec.steps + 1, (name, mode, good)
    faults = ["shift"] + (["window-1", "window+1"] if spec.draft == "mtp" else [])
    if spec.draft == "mtp" and spec.algorithm != "EAGLE":  # EAGLEWorker's draft decode (on a GPU: MiMo-V2
        faults.append("decode-window-1")  # NEXTN on triton accepted 2.08 of 4.0 with it)
    for fault in faults:
        bad = _expected(built, name, mode, fault)
        assert bad < good - acceptance.TOLERANCE, (name, mode, fault, good, bad)


@pytest.mark.targets
def test_not_computable_is_none(built):
    """No spec, a draft the target does not have, multi-layer EAGLE with topk > 1: None; a
    window fault on a draft without a window: ValueError."""
    eagle3 = next(n for n, m in CASES if rows.MODES[m].draft == "eagle3")
    t, model, saved, ps, ref = built(eagle3)
    assert acceptance.expected_accept(t, None, ps, NEW, ref, model=model, saved=saved) is None
    assert acceptance.expected_accept(t, rows.MODES["mtp"], ps, NEW, ref, model=model, saved=saved) is None
    assert acceptance.expected_accept(t, rows.MODES["k1"], [], NEW, [], model=model, saved=saved) is None
    with pytest.raises(ValueError):
        acceptance.expected_accept(t, rows.MODES["k1"], ps, NEW, ref, fault="window-1", model=model, saved=saved)
    mtp = next(n for n, m in CASES if m == "mtp")
    t, model, saved, ps, ref = built(mtp)
    with pytest.raises(ValueError):  # multi-layer EAGLE runs no draft decode
        acceptance.expected_accept(t, rows.MODES["mtp"], ps, NEW, ref, fault="decode-window-1", model=model, saved=saved)
    mtp = next((n for n, m in CASES if rows.MODES[m].draft == "mtp"), None)
    if mtp is not None:
        t = targets.load(mtp)
        assert acceptance.expected_accept(t, rows.Spec("mtp", "EAGLE", 2, 3, 4), ps, NEW, ref, saved=("-", "-")) is None


@pytest.mark.targets
def test_step3p5_mtp_is_multi_layer_eagle_only(built):
    """Step3.5's MTP layers load in sglang only as multi-layer EAGLE's (Step3p5MTP needs a
    ``draft_model_idx``; tests/test_step3p5_target.py): its NEXTN rows have no expectation."""
    t, model, saved, ps, ref = built("step3p5")
    for mode, spec in rows.MODES.items():
        if spec is not None and spec.draft == "mtp" and spec.algorithm != "EAGLE":
            assert acceptance.expected_accept(t, spec, ps, NEW, ref, model=model, saved=saved) is None, mode


@pytest.mark.parametrize("topk,steps,draft_tokens", [(1, 3, 4), (2, 3, 4), (2, 4, 6), (3, 3, 5)])
def test_tree_is_sglangs(topk, steps, draft_tokens):
    """The emulation's draft tree (acceptance._Tree) is the one sglang's own
    ``select_top_k_tokens`` and ``organize_draft_results`` build from the same draft
    probabilities: the same draft tokens, at the same flat indices, with the same parents."""
    import importlib

    import torch

    found = {}
    for mod in ("sglang.srt.speculative.spec_utils", "sglang.srt.speculative.eagle_utils"):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        found.update({n: getattr(m, n) for n in ("select_top_k_tokens", "organize_draft_results") if hasattr(m, n)})
    if len(found) < 2:
        pytest.skip("this sglang has no select_top_k_tokens / organize_draft_results where looked")
    g = torch.Generator().manual_seed(topk * 100 + steps)
    for trial in range(40):  # flat to peaked drafts: trees from wide to deep
        sharp = 2.0 + trial
        probs = [(torch.rand(1 if i == 0 else topk, 50, generator=g) * sharp).softmax(-1) for i in range(steps)]
        tree = acceptance._Tree(topk)
        tree.first(*probs[0][0].topk(topk))
        for p in probs[1:]:
            tree.expand(*p.topk(topk, dim=-1))
        scores, toks, parents = [], [], []
        topk_p, topk_index = probs[0].topk(topk, dim=-1)
        hidden, sc = torch.zeros(1, 4), None
        for i in range(steps):
            _, hidden, sc, info = found["select_top_k_tokens"](i, topk_p, topk_index, hidden, sc, topk)
            scores.append(info[0]), toks.append(info[1]), parents.append(info[2])
            if i < steps - 1:
                topk_p, topk_index = probs[i + 1].topk(topk, dim=-1)
                hidden = torch.zeros(topk, 4)
        parent_list, index, tokens = found["organize_draft_results"](scores, toks, parents, draft_tokens)
        chosen = tree.chosen(draft_tokens)
        assert chosen == index[0].tolist()
        assert [tree.tokens[c] for c in chosen] == tokens[0].tolist()
        want = [-1 if c < topk else int(parent_list[0][c // topk]) for c in chosen]
        assert [tree.parents[c] for c in chosen] == want
