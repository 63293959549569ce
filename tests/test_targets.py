"""The selftest targets' checks (selftest/targets/readout.check, check_problems) on the CPU:
every target passes each check on a few short requests, its float32 tokens are the pinned ones
(``PINNED`` in its module), and each check fails on a target built blind to it:
(a) a reference that ignores the window it is asked for;
(b) the two-vote design the targets had before (only the oldest key of a window, a weak vote,
    reads a prompt slot: a wrong slot rarely shows);
(c) full-attention layers that add nothing;
(d) a vote of a twelfth of the others' weight (margins below the floor).
Sized for one core: 8 requests of 40 tokens, 24 new ones (long enough for a slot to be read
both as the oldest key and as the previous token)."""

from __future__ import annotations

import pytest

from sglang_swa_plugin.selftest import targets
from sglang_swa_plugin.selftest.targets import readout

N, LENGTH, NEW = 8, 40, 24
# The target checks are the plugin's own computation (transformers' models, no sglang): they
# run on noxfile.TARGET_VERSIONS (the newest release, where transformers has every target's class).
pytestmark = pytest.mark.targets
PIN = dict(n=2, length=60, max_new=12)  # the pins: the first two prompts of seed 1


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """One torch thread for this file's tests (conftest's one_torch_thread)."""


def _target(name: str):
    t = targets.load(name)
    why_not = targets.unavailable(t)
    if why_not:
        pytest.skip(why_not)
    return t


def _changed(model, fault, n: int = N, seed: int = 1) -> int:
    """Requests whose float32 tokens ``fault`` (readout.kv_perturbed's function) changes."""
    ps = readout.prompts(n, LENGTH, seed)
    ref, _ = readout.greedy(model, ps, NEW)
    with readout.kv_perturbed(model, fault):
        other, _ = readout.greedy(model, ps, NEW)
    return sum(a != b for a, b in zip(ref, other))


@pytest.mark.parametrize("name", targets.NAMES)
def test_a_target_passes_every_check_and_gives_its_pinned_tokens(name):
    t = _target(name)
    row = readout.check(t.hf_model, t.SIZE, t.LABEL, [1], n=N, length=LENGTH, max_new=NEW, show=None)[1]
    assert row["problems"] == [] and row["bf16_equal"] == N and row["min_margin"] >= readout.MARGIN_FLOOR, row
    assert 2 * row["slot_changed"] > N and 2 * row["full_changed"] > N, row
    model = t.hf_model()
    assert readout.greedy(model, readout.prompts(PIN["n"], PIN["length"], 1), PIN["max_new"])[0] == t.PINNED


@pytest.mark.parametrize("name", targets.NAMES)
def test_the_cached_greedy_gives_the_recomputed_tokens(name):
    """The selftest's reference runs through the model's KV cache; the checks recompute every
    step. Both give the same tokens and margins (the targets without a cache recompute)."""
    t = _target(name)
    model, ps = t.hf_model(), readout.prompts(4, LENGTH, 2)
    (got, m1), (want, m2) = readout.greedy(model, ps, NEW, cache=True), readout.greedy(model, ps, NEW)
    assert got == want and max(abs(a - b) for a, b in zip(m1, m2)) < 1e-5, (got, want)


def test_the_reference_recomputes_where_the_cache_disagrees(monkeypatch):
    """command.reference holds the cached tokens to the recomputed ones on the checks' requests
    and recomputes everything where they differ (a cache that gives other tokens)."""
    from sglang_swa_plugin.selftest import command

    t = _target("gptoss")
    protocol = command.Protocol(requests=4, prompt_len=LENGTH, new_tokens=8, check_requests=2)
    right = command.reference(t, [1], protocol)
    plain = readout.greedy

    def bad_cache(model, ps, max_new, cache=False):
        out, margins = plain(model, ps, max_new)
        return ([[x + 1 for x in o] for o in out] if cache else out), margins

    monkeypatch.setattr(readout, "greedy", bad_cache)
    assert command.reference(t, [1], protocol) == right
    assert len(right) == 4 and all(len(o) == 8 for o in right)


def test_a_window_blind_target_fails_check_a():
    from sglang_swa_plugin.selftest.targets import gptoss

    blind = lambda size, dtype=None: gptoss.hf_model(gptoss.WINDOW, dtype)  # noqa: E731
    row = readout.check(blind, gptoss.WINDOW, "window", [1], n=N, length=LENGTH, max_new=NEW, show=None)[1]
    assert row["changed_by_window_15"] == row["changed_by_window_17"] == 0, row
    assert any("window 15 changes only 0" in p for p in row["problems"]), row


def test_the_two_vote_design_fails_check_b():
    """The two-vote GPT-OSS (a prompt slot is read only by the oldest-key vote, which wins a
    quarter of the choices) hardly shows a wrong slot."""
    from sglang_swa_plugin.selftest.targets import gptoss

    old = gptoss.hf_model(layers=None)
    kinds = readout.layer_kinds(old)
    fault = readout.wrong_slot(kinds, LENGTH, gptoss.WINDOW, NEW, N, seed=1)
    changed = _changed(old, fault)
    assert not 2 * changed > N, changed
    assert readout.check_problems({"bf16_equal": N, "min_margin": 1.0, "slot_changed": changed, "full_changed": N}, N)


def test_silent_full_layers_fail_check_c():
    from sglang_swa_plugin.selftest.targets import gptoss

    layers = [(v, r) if r != "first" else (None, None) for v, r in gptoss.LAYERS]
    model = gptoss.hf_model(layers=layers)
    fault = readout.wrong_index_space(readout.layer_kinds(model), seed=1)
    assert _changed(model, fault) == 0
    assert 2 * _changed(gptoss.hf_model(), fault) > N


def test_a_weak_vote_fails_check_d(monkeypatch):
    from sglang_swa_plugin.selftest.targets import gptoss

    monkeypatch.setitem(readout.WEIGHT, "B", 0.08)  # a B of weight 0.08 against A and C of 1.0
    margins = readout.greedy(gptoss.hf_model(), readout.prompts(N, LENGTH, 1), NEW)[1]
    problems = readout.check_problems({"bf16_equal": N, "min_margin": round(min(margins), 3), "slot_changed": N,
                                       "full_changed": N}, N)
    assert min(margins) < readout.MARGIN_FLOOR and len(problems) == 1 and "floor" in problems[0], (margins, problems)


def test_check_problems_reads_every_check():
    good = {"bf16_equal": 8, "min_margin": 0.1, "changed_by_window_15": 8, "changed_by_window_17": 5,
            "slot_changed": 5, "full_changed": 6}
    assert readout.check_problems(good, 8) == []
    for key, value, text in (("bf16_equal", 7, "bf16"), ("min_margin", 0.01, "floor"),
                             ("changed_by_window_17", 4, "window 17"), ("slot_changed", 4, "slot"),
                             ("full_changed", 4, "full layers"), ("full_changed", None, "no full-attention")):
        problems = readout.check_problems({**good, key: value}, 8)
        assert len(problems) == 1 and text in problems[0], (key, problems)


@pytest.mark.parametrize("name", ["mimo_v2", "step3p5"])
def test_an_own_forward_through_its_cache_gives_the_recomputed_tokens(name):
    """The targets' own forwards (their reference where transformers has no class for them) take
    readout.greedy's cache: the same tokens and margins as recomputing every step."""
    import torch

    t = targets.load(name)
    model = readout.OwnForward(t.forward32, {k: v.to(torch.bfloat16).float() for k, v in t.weights().items()},
                               t.WINDOW, t.LAYER_TYPES)
    assert readout.takes_cache(model)
    ps = readout.prompts(4, LENGTH, 2)
    (cached, m1), (recomputed, m2) = readout.greedy(model, ps, NEW, cache=True), readout.greedy(model, ps, NEW)
    assert cached == recomputed and m1 == pytest.approx(m2, abs=1e-4), (cached, recomputed)
