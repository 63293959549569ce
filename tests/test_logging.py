"""Our log lines go into sglang's log stream: after sglang's configure_logger they carry its
format and rank prefix, once each, in every process that loads the plugin, also when the
plugin was loaded before sglang configured logging (a scheduler loads plugins first)."""

from __future__ import annotations

import re

from helpers import BUILTIN_NAMES, HAS_PLUGIN_FRAMEWORK, child_json, run_child

# What a scheduler process does, in its order: import the scheduler module, load_plugins()
# (0.5.11+; on 0.5.10 the start-up hook loads the plugin when the model runner is imported,
# here before logging is configured too), then configure_logger(server_args, prefix=" TP3")
# through the scheduler module's own binding. No logging is configured before.
SCHEDULER_LIKE = """
import sglang.srt.managers.scheduler as scheduler
import sglang.srt.model_executor.model_runner
{load}
from sglang_swa_plugin.check import testbed
server_args = testbed.make_server_args(testbed._tiny_model_dir("gpt_oss"), publish=False, log_level="{level}")
scheduler.configure_logger(server_args, prefix=" TP3")
import logging
logging.getLogger("sglang.srt.plugins.swa_plugin").warning("sglang-swa-plugin: a later line")
import sglang_swa_plugin
print("RESULT=" + json.dumps(sglang_swa_plugin.status()["registered"]))
"""

SGLANG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? TP3\] sglang-swa-plugin: ")


def test_lines_emitted_before_sglang_configures_logging_come_in_its_format_once_each():
    load = "from sglang.srt.plugins import load_plugins\nload_plugins()" if HAS_PLUGIN_FRAMEWORK else ""
    proc = run_child(SCHEDULER_LIKE.format(load=load, level="info"), prelude=False)
    assert child_json(proc) is True
    ours = [line for line in proc.stderr.splitlines() if "sglang-swa-plugin: " in line]
    for name in BUILTIN_NAMES:
        mine = [line for line in ours if f"sglang-swa-plugin: fix {name}: " in line]
        assert len(mine) == 1, (name, ours)
    assert ours and all(SGLANG_LINE.match(line) for line in ours), ours
    assert sum("a later line" in line for line in ours) == 1, ours


def test_at_log_level_warning_a_held_back_error_still_comes_at_once():
    """Held-back lines are emitted when logging is set up, at the level it chose: with
    ``--log-level warning`` the fix lines (INFO) stay out, a bad setting's ERROR line shows, in
    sglang's format, before the process's later lines (not at exit)."""
    load = "from sglang.srt.plugins import load_plugins\nload_plugins()" if HAS_PLUGIN_FRAMEWORK else ""
    proc = run_child(SCHEDULER_LIKE.format(load=load, level="warning"), prelude=False, SGLANG_SWA_PLUGIN_GUARD="2")
    assert child_json(proc) is True
    ours = [line for line in proc.stderr.splitlines() if "sglang-swa-plugin: " in line]
    assert not any("sglang-swa-plugin: fix " in line for line in ours), ours
    errors = [i for i, line in enumerate(ours) if "SGLANG_SWA_PLUGIN_GUARD='2'" in line]
    later = [i for i, line in enumerate(ours) if "a later line" in line]
    assert len(errors) == 1 and later and errors[0] < later[0], ours
    assert all(SGLANG_LINE.match(line) for line in ours), ours
