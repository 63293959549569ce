"""'applied' means in effect: a fix is reported applied only after its hooks were checked
on every target (the owner and each module that held the original), after sglang's
HookRegistry.apply_hooks, which logs and swallows a failure. Otherwise 'skipped' with the
reason, in the log line, in status() and in doctor; strict mode stops start-up."""

from __future__ import annotations

import pytest

from helpers import (
    LOAD,
    child_env,
    child_json,
    needs_framework,
    plugin_log_lines,
    run_child,
    run_cli,
    third_party_dist,
)

# HookRegistry refuses an AROUND hook on a class (it logs "Failed to apply hooks" and goes on).
CLASS_TARGET = "sglang.srt.mem_cache.swa_memory_pool.SWAKVPool"

# A module-level target of which another module holds a copy it cannot rebind.
STALE_COPY = '''
import sys, types
(_d := __import__("pathlib").Path(__file__).parent)
(_d / "acme_target.py").write_text("def compute(x):\\n    return x\\n")
(_d / "acme_user.py").write_text(
    "import sys, types\\n"
    "from acme_target import compute\\n"
    "class _ReadOnly(types.ModuleType):\\n"
    "    def __setattr__(self, name, value):\\n"
    "        raise AttributeError('read-only module')\\n"
    "sys.modules[__name__].__class__ = _ReadOnly\\n")
import acme_user
'''

REGISTER = """
import sglang_swa_plugin
from sglang_swa_plugin.startup import register
register("test")
print("RESULT=" + json.dumps(sglang_swa_plugin.status()))
"""


def _acme_lines(proc):
    return [line for line in plugin_log_lines(proc) if "fix acme_demo_fix:" in line]


@pytest.mark.release_independent  # the plugin's own start-up on sglang's plugin framework (noxfile CLI_VERSIONS)
@needs_framework
def test_a_hook_sglang_fails_to_apply_is_logged_skipped_not_applied(tmp_path):
    proc = run_child(LOAD, PYTHONPATH=third_party_dist(tmp_path, CLASS_TARGET))
    rec = child_json(proc)["fixes"]["acme_demo_fix"]
    assert rec["status"] == "skipped" and not rec["in_effect"], rec
    assert "hook not in effect" in rec["reason"] and CLASS_TARGET in rec["reason"], rec
    assert "Failed to apply hooks to " + CLASS_TARGET in proc.stderr  # sglang's own error: it did fail
    lines = _acme_lines(proc)
    assert len(lines) == 1 and "|WARNING|" in lines[0] and ": skipped (hook not in effect" in lines[0], lines


@pytest.mark.release_independent  # the plugin's own start-up on sglang's plugin framework (noxfile CLI_VERSIONS)
@needs_framework
def test_strict_mode_stops_startup_when_sglang_failed_to_apply_a_hook(tmp_path):
    code = LOAD + """
from sglang.srt.model_executor.model_runner import ModelRunner
try:
    ModelRunner.__init__(object.__new__(ModelRunner))
except Exception as e:
    print("ERR=" + json.dumps([type(e).__name__, str(e)]))
"""
    proc = run_child(code, SGLANG_SWA_PLUGIN_STRICT="1", PYTHONPATH=third_party_dist(tmp_path, CLASS_TARGET))
    kind, msg = child_json(proc, "ERR")
    assert kind == "StrictModeError" and "acme_demo_fix: skipped (hook not in effect" in msg, msg


@pytest.mark.release_independent  # the plugin's own start-up on sglang's plugin framework (noxfile CLI_VERSIONS)
def test_a_module_keeping_the_unhooked_original_is_not_applied(tmp_path):
    proc = run_child(REGISTER, PYTHONPATH=third_party_dist(tmp_path, "acme_target.compute", STALE_COPY))
    rec = child_json(proc)["fixes"]["acme_demo_fix"]
    assert rec["status"] in ("skipped", "error") and not rec["in_effect"], rec
    lines = _acme_lines(proc)
    assert len(lines) == 1 and "applied" not in lines[0] and "|WARNING|" in lines[0], lines
    if rec["status"] == "skipped":  # HookRegistry: it could not rebind acme_user's copy
        assert "acme_user.compute still hold(s) the unhooked compute" in rec["reason"], rec


@pytest.mark.release_independent  # the plugin's own start-up on sglang's plugin framework (noxfile CLI_VERSIONS)
@needs_framework
def test_doctor_reports_the_same_verified_status(tmp_path):
    proc = run_cli("doctor", tmp_path=tmp_path, env=child_env(PYTHONPATH=third_party_dist(tmp_path, CLASS_TARGET)))
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("acme_demo_fix"))
    assert proc.returncode == 1 and "applied" not in row, proc.stdout
