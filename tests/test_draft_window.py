"""Issue #47: an EAGLE-3 draft window (``--speculative-draft-window-size``, sglang #24664, 0.5.12+)
over a hybrid SWA target. The drafter's layers slide over the draft's own full-only pool while the
draft runner shares the target's SWA allocator (``sglang_swa_plugin.check.draft_window``): on
triton, with the fixes the plugin applies on the installed release, the window keys a draft layer's
kernels get must be full-pool ids of the draft pool, as sglang's pool-keyed window helpers
(0.5.13+) and its own multi-step draft rail (0.5.23+) leave them. Through the target's full->SWA
mapping they read other keys of the draft pool (fewer accepted drafts; the target verifies).

0.5.12: sglang's own window helper translates through the allocator (the draft's EXTEND too), and
the plugin's rails follow it: the window stays in the target's space (a gap, ``gaps.py``)."""

from __future__ import annotations

import json

import pytest

import sglang.srt.model_executor.model_runner  # noqa: F401  (0.5.10: the start-up hook)

from sglang_swa_plugin.check import draft_window as scen
from sglang_swa_plugin.core import temporarily_installed
from sglang_swa_plugin.fix import ScenarioUnavailable

from helpers import run_child, sglang_release

PATHS = ("eager", "capture", "replay", "decode_eager", "decode_capture", "decode_replay")
FIRST = (0, 5, 12)  # llama_eagle3 reads the draft window


def expected_space() -> str:
    """Where the draft layer's window ids are: the target's space where sglang's own window
    helper translates through the shared allocator (0.5.12), else the draft pool's."""
    return "target" if sglang_release() < (0, 5, 13) else "draft"


@pytest.fixture(scope="module")
def with_the_plugin():
    if sglang_release() < FIRST:
        return None
    with temporarily_installed(*scen.applied_fixes()):
        return scen.scenario().seen


def test_the_draft_window_exists_from_0_5_12():
    assert scen.release_has_draft_window() == (sglang_release() >= FIRST)
    if sglang_release() < FIRST:
        with pytest.raises(ScenarioUnavailable):
            scen.scenario()


def test_the_drafter_is_no_hybrid_swa_model():
    """Why the draft owns a full-only pool: sglang's hybrid rule does not take the drafter."""
    from sglang.srt.configs.model_config import is_hybrid_swa_model

    assert not is_hybrid_swa_model(["LlamaForCausalLMEagle3"])


@pytest.mark.parametrize("path", PATHS)
def test_the_draft_layer_reads_its_window_in_the_draft_pool(path, with_the_plugin):
    """Per path: the ids the draft layer's kernel gets, with the plugin's applied fixes.
    0.5.13-0.5.22: ``triton_swa_draft`` builds the draft-extend graph and multi-step decode rails
    (sglang builds none); it must translate only through a pool that has an SWA part."""
    if with_the_plugin is None:  # no draft window in this sglang
        return
    got = with_the_plugin.get(path)
    if path == "eager" and sglang_release() >= (0, 5, 14):
        assert got is None  # DRAFT_EXTEND runs as EXTEND: no branch of its own
        return
    if got is None and path.startswith("decode") and sglang_release() >= (0, 5, 23):
        return  # sglang's own Triton kernels build it: test_sglangs_own_draft_decode_rail
    assert got is not None, with_the_plugin
    spaces = [s for step in got.get("steps", [got]) for s in step.get("spaces", [step.get("why")])]
    assert spaces and all(s == expected_space() for s in spaces), got


def test_sglangs_own_draft_decode_rail_is_in_the_draft_pool():
    """0.5.23+: the multi-step draft decode's window rail, built by sglang's own Triton kernels
    (Triton's interpreter, a child process), with the plugin's applied fixes: draft-pool ids."""
    if sglang_release() < (0, 5, 23):
        assert scen.release_has_draft_window() == (sglang_release() >= FIRST)
        return  # the rail is the plugin's (triton_swa_draft): the test above
    proc = run_child("""
        import sglang.srt.model_executor.model_runner
        from sglang_swa_plugin.check import draft_window as scen
        from sglang_swa_plugin.core import temporarily_installed
        with temporarily_installed(*scen.applied_fixes()):
            print("RESULT=" + json.dumps(scen.scenario().seen.get("decode_eager")))
    """, timeout=600, TRITON_INTERPRET="1")
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT=")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    got = json.loads(line.removeprefix("RESULT="))
    assert got and got["right"] and all(s == "draft" for step in got["steps"] for s in step["spaces"]), got
