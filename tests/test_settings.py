"""A bad setting never lowers protection: the variable falls back to its default (plugin on,
all fixes, guard off), one ERROR line names the variable, its value and the valid values,
and strict mode stops start-up and says so in that line. Fix names are case-insensitive."""

from __future__ import annotations

import pytest

from helpers import BUILTIN_NAMES, child_json, run_child, third_party_dist

from sglang_swa_plugin import config

# Settings are read by the plugin's own code, the same on every release: these start-up and
# CLI runs go in the session of noxfile.COMMAND_LINE_VERSIONS (the newest release).
pytestmark = pytest.mark.cli

REGISTER = """
import sglang_swa_plugin
from sglang_swa_plugin.startup import register
register("test")
print("RESULT=" + json.dumps(sglang_swa_plugin.status()))
"""

# Built from the model runner, where strict mode stops start-up (on 0.5.10 importing it
# runs the start-up hook; the explicit register() is then a no-op).
STRICT_PROBE = """
import sglang.srt.model_executor.model_runner
from sglang_swa_plugin.startup import register
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


def test_all_with_exclusions_is_every_fix_but_those():
    for raw in ("all,-trtllm_swa_pool", "ALL, -Trtllm_Swa_Pool", "-trtllm_swa_pool"):
        c = config.parse({config.FIXES: raw}).checked_against(BUILTIN_NAMES)
        assert not c.errors and c.include is None and c.exclude == {"trtllm_swa_pool"}, (raw, c)
        assert [n for n in BUILTIN_NAMES if not c.selected(n)] == ["trtllm_swa_pool"], raw
    c = config.parse({config.FIXES: "all,trtllm_swa_pool"}).checked_against(BUILTIN_NAMES)
    assert not c.errors and all(c.selected(n) for n in BUILTIN_NAMES)
    c = config.parse({config.FIXES: "all,-bogus"}).checked_against(BUILTIN_NAMES)
    assert len(c.errors) == 1 and "'bogus'" in c.errors[0] and "'all'" not in c.errors[0], c.errors


def test_a_malformed_strict_value_reads_as_on_in_one_coherent_message():
    c = config.parse({config.STRICT: "maybe"})
    assert c.strict and len(c.errors) == 1
    msg = c.errors[0]
    assert "SGLANG_SWA_PLUGIN_STRICT='maybe' is not a boolean" in msg, msg
    assert "using on (a malformed SGLANG_SWA_PLUGIN_STRICT counts as on)" in msg, msg
    assert "safe reading" not in msg and "using the default" not in msg, msg


PREVIEWS = ["acme_demo_tree"]  # a third-party fix's preview (no built-in fix has one today)
PREVIEW_FIX = 'ThirdPartyFix.previews = {"acme_demo_tree": "a path of the demo fix not yet run on a GPU"}\n'


def test_a_preview_is_off_unless_named_and_an_unknown_name_turns_none_on():
    c = config.parse({}).checked_against(BUILTIN_NAMES, PREVIEWS)
    assert c.previews == frozenset() and not c.errors
    c = config.parse({config.PREVIEW: " Acme_Demo_Tree "}).checked_against(BUILTIN_NAMES, PREVIEWS)
    assert c.previews == {"acme_demo_tree"} and not c.errors
    c = config.parse({config.PREVIEW: "acme_demo_tree,bogus"}).checked_against(BUILTIN_NAMES, PREVIEWS)
    assert c.previews == frozenset() and len(c.errors) == 1, c
    assert "SGLANG_SWA_PLUGIN_PREVIEW='acme_demo_tree,bogus' names unknown preview(s) 'bogus'" in c.errors[0]
    assert "acme_demo_tree" in c.errors[0].split("valid values:")[1], c.errors[0]
    c = config.parse({config.PREVIEW: "acme_demo_tree"}).checked_against(BUILTIN_NAMES)
    assert c.previews == frozenset() and "(no fix has a preview)" in c.errors[0], c


@pytest.mark.parametrize("value,on", [(None, False), ("acme_demo_tree", True), ("bogus", False)])
def test_a_named_preview_reaches_its_fix_at_start_up(value, on, tmp_path):
    """What a server's process registers, with a third-party fix that has a preview: the fix's
    record says whether its preview is on, and the fix's hooks read the same (``Fix.previews_on``)."""
    code = REGISTER + (
        "import acme_swa_fix as t\n"
        "print('ON=' + json.dumps(sorted(t.FIX.previews_on)))\n")
    env = {config.PREVIEW: value} if value else {}
    proc = run_child(code, PYTHONPATH=third_party_dist(tmp_path, extra=PREVIEW_FIX), **env)
    rec = child_json(proc)["fixes"]["acme_demo_fix"]
    assert rec["previews"]["acme_demo_tree"]["on"] is on, rec
    assert child_json(proc, "ON") == (["acme_demo_tree"] if on else []), proc.stdout
    assert (len(_errors(proc)) == 1) is (value == "bogus"), proc.stderr[-3000:]


def test_with_the_plugin_off_fix_names_are_not_checked():
    c = config.parse({config.ENABLE: "0", config.FIXES: "bogus"}).checked_against(BUILTIN_NAMES)
    assert not c.enabled and not c.errors


def test_the_start_up_hook_has_no_settings_parser_of_its_own():
    """``_autoload`` asks ``config`` (no list of false values of its own)."""
    import ast
    import inspect

    from sglang_swa_plugin import _autoload

    tree = ast.parse(inspect.getsource(_autoload))
    words = {n.value.lower() for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not words & {"0", "false", "off", "no", config.ENABLE.lower()}, words
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "config.get" in calls, calls


def _environment_variables_read() -> set:
    """Every environment variable the plugin's code reads by name (``os.environ.get(X)``,
    ``os.environ[X]``, ``os.getenv(X)``), X a literal or a module constant."""
    import ast
    from pathlib import Path

    import sglang_swa_plugin

    found = set()
    for path in sorted(Path(sglang_swa_plugin.__file__).parent.rglob("*.py")):  # hooks/ included
        tree = ast.parse(path.read_text())
        consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                  for t in n.targets if isinstance(t, ast.Name)}

        def value(node):
            if isinstance(node, ast.Constant):
                return node.value
            if isinstance(node, ast.Name):
                return consts.get(node.id)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "_config":
                return getattr(config, node.attr, None)
            return None

        for n in ast.walk(tree):
            key = None
            if isinstance(n, ast.Call) and n.args and ast.unparse(n.func) in ("os.environ.get", "os.getenv", "environ.get"):
                key = value(n.args[0])
            elif isinstance(n, ast.Subscript) and ast.unparse(n.value) in ("os.environ", "environ") \
                    and isinstance(n.ctx, ast.Load):
                key = value(n.slice)
            if isinstance(key, str):
                found.add(key)
    return found


def test_every_environment_variable_the_code_reads_is_documented():
    from helpers import HERE

    read = _environment_variables_read()
    assert config.SGLANG_PLUGINS in read, read  # the scan sees the code
    readme = (HERE.parent / "README.md").read_text()
    for var in read | set(config.ALL_VARS):
        assert var in config.__doc__, var
        assert f"`{var}`" in readme, var
