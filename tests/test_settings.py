"""A bad setting never lowers protection: the variable falls back to its default (plugin on,
all fixes, guard off), one ERROR line names the variable, its value and the valid values,
and strict mode stops start-up and says so in that line. Fix names are case-insensitive."""

from __future__ import annotations

import pytest

from helpers import BUILTIN_NAMES, child_json, run_child

from sglang_swa_plugin import config

REGISTER = """
import sglang_swa_plugin
from sglang_swa_plugin.core import register
register("test")
print("RESULT=" + json.dumps(sglang_swa_plugin.status()))
"""

# Built from the model runner, where strict mode stops start-up (on 0.5.10 importing it
# runs the start-up hook; the explicit register() is then a no-op).
STRICT_PROBE = """
import sglang.srt.model_executor.model_runner
from sglang_swa_plugin.core import register
register("test")
from sglang.srt.model_executor.model_runner import ModelRunner
try:
    ModelRunner.__init__(object.__new__(ModelRunner))
except Exception as e:
    print("ERR=" + json.dumps([type(e).__name__, str(e)]))
"""


def _statuses(proc) -> dict:
    return {name: rec["status"] for name, rec in child_json(proc)["fixes"].items()}


def _errors(proc) -> list:
    return [line for line in proc.stderr.splitlines() if "|ERROR|" in line]


@pytest.fixture(scope="module")
def default_statuses():
    proc = run_child(REGISTER)
    assert not _errors(proc)
    return _statuses(proc)


@pytest.mark.parametrize(
    "var,value,valid",
    [
        (config.ENABLE, "maybe", config.BOOL_VALUES),
        (config.GUARD, "2", config.BOOL_VALUES),
        (config.FIXES, "bogus_fix", "trtllm_swa_pool"),
        (config.FIXES, "trtllm_swa_pool,-no_such_fix", "trtllm_swa_pool"),
    ],
)
def test_bad_value_keeps_every_default_fix_and_says_so_in_one_line(default_statuses, var, value, valid):
    proc = run_child(REGISTER, **{var: value})
    errors = _errors(proc)
    assert len(errors) == 1, errors
    assert f"{var}={value!r}" in errors[0] and "valid values: " in errors[0] and valid in errors[0], errors
    assert "using the default" in errors[0] and "strict" not in errors[0], errors
    assert _statuses(proc) == default_statuses


def test_bad_value_in_strict_mode_stops_startup_and_the_line_says_so():
    proc = run_child(STRICT_PROBE, SGLANG_SWA_PLUGIN_STRICT="1", SGLANG_SWA_PLUGIN_GUARD="2")
    errors = _errors(proc)
    assert len(errors) == 1 and "SGLANG_SWA_PLUGIN_GUARD='2'" in errors[0], errors
    assert "strict mode (SGLANG_SWA_PLUGIN_STRICT) stops start-up" in errors[0], errors
    kind, msg = child_json(proc, "ERR")
    assert kind == "StrictModeError" and "SGLANG_SWA_PLUGIN_GUARD='2'" in msg, msg


def test_fix_names_are_case_insensitive(default_statuses):
    victim = "trtllm_swa_pool"
    proc = run_child(REGISTER, SGLANG_SWA_PLUGIN_FIXES=f"-{victim.upper()}")
    assert not _errors(proc)
    want = dict(default_statuses, **{victim: "disabled"})
    assert _statuses(proc) == want


def test_parsing_falls_back_to_the_defaults():
    c = config.parse({config.GUARD: "2"})
    assert not c.guard and c.enabled and len(c.errors) == 1
    c = config.parse({config.ENABLE: "maybe"}).checked_against(BUILTIN_NAMES)
    assert c.enabled and len(c.errors) == 1
    c = config.parse({config.FIXES: "Trtllm_Swa_Pool"}).checked_against(BUILTIN_NAMES)
    assert c.include == {"trtllm_swa_pool"} and not c.errors and c.selected("trtllm_swa_pool")
    c = config.parse({config.FIXES: "trtllm_swa_pool,bogus"}).checked_against(BUILTIN_NAMES)
    assert c.include is None and not c.exclude and len(c.errors) == 1 and "'bogus'" in c.errors[0]
    assert all(c.selected(n) for n in BUILTIN_NAMES)
