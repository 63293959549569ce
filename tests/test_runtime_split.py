"""What a server process loads is the runtime only: after sglang's own plugin loading, no
module of the check side (``sglang_swa_plugin.check``, the CPU testbed, the per-fix CPU
scenarios, the GPU selftest ``sglang_swa_plugin.selftest`` and its targets, the command line)
is imported, no loaded module of ours carries scenario code, and every fix still gets the
status its detection gives."""

from __future__ import annotations

import pytest

from helpers import child_json, needs_framework, run_child
from sglang_swa_plugin.core import load_fixes, safe_detect
from sglang_swa_plugin.fix import Verdict

CHILD = """
import sys, types
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang_swa_plugin
ours = {n: m for n, m in sys.modules.items() if n.split(".")[0] == "sglang_swa_plugin" and m is not None}
scenario_code = sorted(
    f"{n}.{attr}" for n, m in ours.items() for attr in ("scenario", "reproduce", "testbed")
    if isinstance(getattr(m, attr, None), (types.FunctionType, types.ModuleType)))
print("RESULT=" + json.dumps({
    "modules": sorted(ours),
    "scenario_code": scenario_code,
    "statuses": {n: r["status"] for n, r in sglang_swa_plugin.status()["fixes"].items()},
}))
"""

STATUS = {Verdict.NEEDED: "applied", Verdict.NOT_NEEDED: "not needed", Verdict.NOT_APPLICABLE: "not applicable"}
# The packages and modules of the check side: commands and what only they run.
CHECK_SIDE = ("sglang_swa_plugin.check", "sglang_swa_plugin.selftest", "sglang_swa_plugin.cli")


def check_side(modules) -> list:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in CHECK_SIDE) or "testbed" in m]


@pytest.fixture(scope="module")
def loaded():
    return child_json(run_child(CHILD))


@needs_framework
def test_load_plugins_imports_no_check_module(loaded):
    assert loaded["modules"], "the plugin was not loaded"
    assert not check_side(loaded["modules"]), check_side(loaded["modules"])


def test_the_check_side_is_recognised():
    """The filter above sees every check-side package as the command line imports it (the
    selftest's modules included), and none of the runtime's."""
    import sys

    import sglang_swa_plugin.cli  # imports the check side's commands
    import sglang_swa_plugin.selftest.command
    import sglang_swa_plugin.selftest.targets.gptoss  # noqa: F401

    ours = [n for n in sys.modules if n.split(".")[0] == "sglang_swa_plugin"]
    seen = check_side(ours)
    for name in ("sglang_swa_plugin.check", "sglang_swa_plugin.selftest", "sglang_swa_plugin.selftest.command",
                 "sglang_swa_plugin.selftest.server", "sglang_swa_plugin.selftest.targets.gptoss", "sglang_swa_plugin.cli"):
        assert name in seen, name
    assert not check_side(["sglang_swa_plugin", "sglang_swa_plugin.core", "sglang_swa_plugin.startup",
                           "sglang_swa_plugin.hooks.trtllm_swa_pool", "sglang_swa_plugin.checks_of_nothing"])


@needs_framework
def test_loaded_modules_carry_no_scenario_code(loaded):
    assert not loaded["scenario_code"], loaded["scenario_code"]


@needs_framework
def test_load_plugins_statuses_are_the_detections(loaded):
    want = {}
    for fix, _ in load_fixes():
        want[fix.name] = "disabled" if fix.opt_in else STATUS.get(safe_detect(fix).verdict, "unknown")
    assert loaded["statuses"] == want
