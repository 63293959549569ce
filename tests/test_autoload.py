"""The start-up hook for sglang without a plugin framework (0.5.10): it loads the plugin in
a freshly spawned process that imports sglang's model runner (as the scheduler does), and
stays inert where sglang has its own plugin loader."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import child_env, child_json, needs_framework, no_framework_only
from helpers import plugin_log_lines, run_child

# The scheduler is started with multiprocessing's spawn context: a brand-new interpreter
# that imports sglang and builds the model runner. Do the same, with no import of ours.
SPAWNED = """
import multiprocessing as mp

def scheduler_like(q):
    import sglang.srt.model_executor.model_runner  # what every backend-building process imports
    import sys
    mod = sys.modules.get("sglang_swa_plugin")
    q.put(mod.status() if mod and hasattr(mod, "status") else None)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=scheduler_like, args=(q,))
    p.start(); st = q.get(timeout=300); p.join()
    print("RESULT=" + json.dumps(st))
"""


def _spawn(tmp_path, **env):
    script = tmp_path / "launch.py"
    script.write_text("import json\n" + SPAWNED)
    proc = subprocess.run([sys.executable, str(script)], env=child_env(**env), capture_output=True, text=True,
                          timeout=400, cwd=str(tmp_path))
    return proc


def test_startup_hook_file_is_installed():
    import sglang_swa_plugin

    site = os.path.dirname(os.path.dirname(sglang_swa_plugin.__file__))
    with open(os.path.join(site, "sglang_swa_plugin_autoload.pth")) as f:
        assert f.read().strip() == "import sglang_swa_plugin._autoload"


@pytest.mark.release_independent  # the plugin's own start-up on sglang's plugin framework (noxfile CLI_VERSIONS)
@no_framework_only
def test_spawned_process_gets_the_fixes_without_any_import_of_ours(tmp_path):
    st = child_json(_spawn(tmp_path))
    assert st and st["registered"] and st["loaded_via"] == "start-up hook", st
    applied = [n for n, r in st["fixes"].items() if r["status"] == "applied"]
    assert applied and all(st["fixes"][n]["in_effect"] for n in applied), st["fixes"]


@pytest.mark.release_independent  # the plugin's own start-up on sglang's plugin framework (noxfile CLI_VERSIONS)
@no_framework_only
def test_startup_hook_honours_the_off_switch(tmp_path):
    st = child_json(_spawn(tmp_path, SGLANG_SWA_PLUGIN="0"))
    assert st["registered"] is False and st["fixes"] == {}


@pytest.mark.release_independent  # the plugin's own start-up on sglang's plugin framework (noxfile CLI_VERSIONS)
@needs_framework
def test_startup_hook_is_inert_where_sglang_has_plugins_and_entry_point_loads_once(tmp_path):
    st = child_json(_spawn(tmp_path))
    assert st["registered"] is False  # importing the model runner did not load the plugin
    code = """
import sglang.srt.model_executor.model_runner
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang_swa_plugin
print("RESULT=" + json.dumps(sglang_swa_plugin.status()))
"""
    proc = run_child(code)
    st = child_json(proc)
    assert st["loaded_via"] == "entry point"
    executed = [l for l in proc.stderr.splitlines() if "Executed general plugin: swa_plugin" in l]
    assert len(executed) == 1


@pytest.mark.release_independent  # the plugin's own start-up on sglang's plugin framework (noxfile CLI_VERSIONS)
@no_framework_only
def test_a_plugin_that_cannot_load_never_breaks_the_model_runner_import():
    """pluggy missing: the start-up hook logs why, and sglang's model runner imports."""
    code = """
sys.modules["pluggy"] = None  # as if it were not installed
import sglang.srt.model_executor.model_runner
print("RESULT=" + json.dumps("imported"))
"""
    proc = run_child(code)
    assert child_json(proc) == "imported"
    errors = [line for line in plugin_log_lines(proc) if "|ERROR|" in line]
    assert len(errors) == 1 and "could not load the plugin" in errors[0], proc.stderr[-3000:]


def test_off_switch_imports_no_sglang_module():
    code = """
before = set(sys.modules)
import sglang_swa_plugin
from sglang_swa_plugin.startup import register
register("test")
st = sglang_swa_plugin.status()
new = sorted(m for m in set(sys.modules) - before if m.split(".")[0] == "sglang")
print("RESULT=" + json.dumps([new, sorted({r["status"] for r in st["fixes"].values()})]))
"""
    new, statuses = child_json(run_child(code, SGLANG_SWA_PLUGIN="0"))
    assert new == [] and statuses == ["disabled"], (new, statuses)
