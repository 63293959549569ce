"""The plugin's foundation on the installed sglang: loading, idempotency, toggles, third-party
fixes, doctor, and the per-version contract of every needed fix."""

from __future__ import annotations

import inspect
import json
import textwrap

import pytest

from helpers import (
    BUILTIN_NAMES,
    HAS_PLUGIN_FRAMEWORK,
    LOAD,
    MOVED_TARGET,
    REAL_TARGET,
    child_env,
    child_json,
    needs_framework,
    no_framework_only,
    plugin_log_lines,
    run_child,
    run_cli,
    third_party_dist,
)

from sglang_swa_plugin import config
from sglang_swa_plugin.gaps import GAPS
from sglang_swa_plugin.core import BUILTIN_MODULES, load_fixes, safe_detect
from sglang_swa_plugin.fix import Verdict, resolve

# ------------------------------------------------------------------------ loading


@needs_framework
def test_load_plugins_runs_plugin_and_logs_one_line_per_fix():
    proc = run_child(LOAD)
    st = child_json(proc)
    assert st["registered"] and st["loaded_via"] == "entry point"
    assert sorted(st["fixes"]) == BUILTIN_NAMES
    lines = plugin_log_lines(proc)
    for name in BUILTIN_NAMES:
        mine = [l for l in lines if f"fix {name}:" in l]
        assert len(mine) == 1, (name, lines)
    for name, rec in st["fixes"].items():
        opt_in_off = rec["status"] == "disabled" and rec["reason"].startswith("opt-in")
        assert opt_in_off or rec["status"] in {"applied", "not needed", "not applicable"}, (name, rec)
        assert rec["in_effect"] == (rec["status"] == "applied"), (name, rec)


@pytest.mark.release_independent  # the plugin's own start-up on sglang's plugin framework (noxfile CLI_VERSIONS)
@needs_framework
def test_sglang_plugins_naming_something_else_keeps_plugin_out():
    st = child_json(run_child(LOAD, SGLANG_PLUGINS="some_other_plugin"))
    assert st["registered"] is False and st["fixes"] == {}


@pytest.mark.release_independent  # the plugin's own start-up on sglang's plugin framework (noxfile CLI_VERSIONS)
@needs_framework
def test_sglang_plugins_naming_us_selects_us():
    st = child_json(run_child(LOAD, SGLANG_PLUGINS="some_other_plugin,swa_plugin"))
    assert st["registered"] is True


@pytest.mark.cli
@needs_framework
def test_disabled_installs_nothing(tmp_path):
    code = LOAD + f"""
from sglang_swa_plugin.patching import target_marked_by
print("MARK=" + json.dumps(target_marked_by({REAL_TARGET!r})))
"""
    proc = run_child(code, SGLANG_SWA_PLUGIN="0", PYTHONPATH=third_party_dist(tmp_path))
    st = child_json(proc)
    assert {r["status"] for r in st["fixes"].values()} == {"disabled"}
    assert "acme_demo_fix" in st["fixes"]
    assert child_json(proc, "MARK") is None
    assert len(plugin_log_lines(proc)) == len(st["fixes"])


@needs_framework
def test_loading_twice_hooks_each_target_once(tmp_path):
    code = """
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
import sglang_swa_plugin
from sglang_swa_plugin.startup import register
load_plugins()
sglang_swa_plugin.register(); register("again")
import sglang.srt.plugins as p; p._plugins_loaded = False; load_plugins()   # a second full load
HookRegistry.apply_hooks()
from sglang_swa_plugin.patching import hook_names, level_marks, stored_attribute
from sglang_swa_plugin.fix import split_target
out = {}
for name, rec in sglang_swa_plugin.status()["fixes"].items():
    for t in rec["installed_targets"]:
        ours = [h for _, h, _ in HookRegistry._hooks[t] if name in hook_names(h)]
        owner, attr = split_target(t)
        depth, f = 0, stored_attribute(owner, attr)
        f = getattr(f, "__func__", f)
        while f is not None:  # the wrappers that carry this fix (a chain of ours is one)
            depth += name in level_marks(f)
            f = getattr(f, "__wrapped__", None)
        out[f"{name} {t}"] = [len(ours), depth]
print("RESULT=" + json.dumps(out))
"""
    proc = run_child(code, PYTHONPATH=third_party_dist(tmp_path))
    counts = child_json(proc)
    assert any(key.endswith(" " + REAL_TARGET) for key in counts)
    for t, (registered, depth) in counts.items():  # t: "fix target", each fix on each of its targets
        assert registered == 1 and depth == 1, (t, registered, depth)


@pytest.mark.cli
@needs_framework
def test_third_party_fix_is_found_applied_and_runs(tmp_path):
    code = LOAD + """
import acme_swa_fix
from sglang_swa_plugin.check import testbed
pool = testbed.make_swa_pool()
testbed.make_swa_allocator(pool)  # registers the full->SWA mapping
pool.translate_loc_from_full_to_swa(__import__("torch").arange(3))
print("CALLS=" + json.dumps(len(acme_swa_fix.CALLS)))
"""
    proc = run_child(code, PYTHONPATH=third_party_dist(tmp_path))
    st = child_json(proc)
    rec = st["fixes"]["acme_demo_fix"]
    assert rec["status"] == "applied" and rec["in_effect"], rec
    assert rec["source"].startswith("entry point acme")
    assert child_json(proc, "CALLS") == 1


@pytest.mark.cli
@needs_framework
def test_moved_target_is_skipped_with_one_warning_naming_it(tmp_path):
    proc = run_child(LOAD, PYTHONPATH=third_party_dist(tmp_path, MOVED_TARGET))
    rec = child_json(proc)["fixes"]["acme_demo_fix"]
    assert rec["status"] == "skipped" and MOVED_TARGET in rec["reason"]
    warns = [l for l in plugin_log_lines(proc) if "|WARNING|" in l]
    assert len(warns) == 1 and MOVED_TARGET in warns[0]


STRICT_PROBE = LOAD + """
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang_swa_plugin.patching import target_marked_by
from sglang_swa_plugin.startup import STRICT_GATE_TARGET
print("GATE=" + json.dumps(target_marked_by(STRICT_GATE_TARGET)))
try:
    ModelRunner.__init__(object.__new__(ModelRunner))
except Exception as e:
    print("ERR=" + json.dumps([type(e).__name__, str(e)]))
"""


@pytest.mark.cli
@needs_framework
def test_strict_mode_stops_startup_naming_the_fix(tmp_path):
    proc = run_child(STRICT_PROBE, SGLANG_SWA_PLUGIN_STRICT="1", PYTHONPATH=third_party_dist(tmp_path, MOVED_TARGET))
    kind, msg = child_json(proc, "ERR")
    assert kind == "StrictModeError" and "acme_demo_fix" in msg and MOVED_TARGET in msg


@needs_framework
@pytest.mark.parametrize("strict", ("1", "0"))
def test_strict_mode_passes_through_when_all_is_well(strict):
    """Strict mode puts its gate on ModelRunner.__init__ (and only strict mode does); with
    nothing wrong the gate lets sglang's real constructor run, which then fails on the
    missing arguments, as without the plugin."""
    from sglang_swa_plugin.startup import STRICT_GATE

    proc = run_child(STRICT_PROBE, SGLANG_SWA_PLUGIN_STRICT=strict)
    assert child_json(proc, "GATE") == (STRICT_GATE if strict == "1" else None)
    kind, msg = child_json(proc, "ERR")
    assert kind == "TypeError" and "missing" in msg and "argument" in msg, msg


# ------------------------------------------------------------------------ settings


def test_config_parsing_rules():
    c = config.parse({config.FIXES: "a, -b ,c", config.STRICT: "on", config.ENABLE: "1"})
    assert c.include == {"a", "c"} and c.exclude == {"b"} and c.strict and c.enabled and not c.errors
    assert c.selected("a") and not c.selected("b") and not c.selected("z")
    c = config.parse({config.FIXES: "-b"})
    assert c.include is None and c.selected("a") and not c.selected("b")
    c = config.parse({config.ENABLE: "off"})
    assert not c.enabled and not c.errors
    c = config.parse({config.STRICT: "bogus"})
    assert c.strict and c.errors  # a malformed strict value errs on the safe side
    c = config.parse({config.FIXES: "ALL"})
    assert c.include is None and not c.errors


@pytest.mark.cli
def test_fixes_selection_excludes_a_fix():
    victim = "trtllm_swa_pool"
    code = """
import sglang_swa_plugin
from sglang_swa_plugin.startup import register
register("test")
print("RESULT=" + json.dumps(sglang_swa_plugin.status()))
"""
    st = child_json(run_child(code, SGLANG_SWA_PLUGIN_FIXES=f"-{victim}"))
    assert st["fixes"][victim]["status"] == "disabled"
    others = [r for n, r in st["fixes"].items() if n != victim and not r["reason"].startswith("opt-in")]
    assert others and all(r["status"] != "disabled" for r in others)


# ------------------------------------------------------------------------ doctor


@pytest.mark.cli
def test_doctor_json_lists_every_fix(tmp_path):
    proc = run_cli("doctor", "--json", tmp_path=tmp_path, env=child_env(PYTHONPATH=third_party_dist(tmp_path)))
    rep = json.loads(proc.stdout)
    names = sorted(r["name"] for r in rep["fixes"])
    assert names == sorted(BUILTIN_NAMES + ["acme_demo_fix"])
    assert rep["plugin_framework"] is HAS_PLUGIN_FRAMEWORK
    assert rep["entry_point_found"] and rep["entry_point"] == "swa_plugin = sglang_swa_plugin:register"
    for r in rep["fixes"]:
        assert r["status"] and r["reason"] and "upstream_prs" in r
    # the paths left wrong (README's "What it does not fix yet"), whatever the fixes' statuses
    assert [tuple(g.values()) for g in rep["gaps"]] == [tuple(g.as_dict().values()) for g in GAPS] and GAPS
    assert proc.returncode == (0 if rep["ok"] else 1)


@pytest.mark.cli
def test_doctor_exit_status_is_nonzero_when_a_needed_fix_cannot_be_installed(tmp_path):
    proc = run_cli("doctor", tmp_path=tmp_path, env=child_env(PYTHONPATH=third_party_dist(tmp_path, MOVED_TARGET)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "acme_demo_fix" in proc.stdout and MOVED_TARGET in proc.stdout


@pytest.mark.release_independent  # the plugin's own start-up on sglang's plugin framework (noxfile CLI_VERSIONS)
@no_framework_only
def test_doctor_says_no_plugin_framework(tmp_path):
    proc = run_cli("doctor", tmp_path=tmp_path)
    assert "plugin framework:  no" in proc.stdout, proc.stdout


# ------------------------------------------------------------------------ contracts


RECORD = ("Bug", "Upstream PRs", "Affected versions", "Detection", "Delete when")


def record_sections(doc: str) -> list:
    """[(heading, body)] of a module record: a heading is an unindented line that is exactly
    one of RECORD's names; its body is the indented text up to the next unindented line."""
    out = []
    for line in doc.splitlines():
        if line in RECORD:
            out.append((line, []))
        elif out and (line.startswith(" ") or not line.strip()):
            out[-1][1].append(line.strip())
        elif out and line.strip():
            out.append((None, []))  # unindented text: the section before it has ended
    return [(h, " ".join(b).strip()) for h, b in out if h is not None]


@pytest.mark.parametrize("modname", BUILTIN_MODULES)
def test_every_builtin_module_carries_its_record(modname):
    """The module docstring holds the five record sections, each once, in order, each with
    an indented body (a word somewhere in the prose is not a record)."""
    mod = pytest.importorskip(modname)
    sections = record_sections(inspect.getdoc(mod) or "")
    assert [h for h, _ in sections] == list(RECORD), f"{modname} record sections: {[h for h, _ in sections]}"
    empty = [h for h, body in sections if not body]
    assert not empty, f"{modname} record has empty sections: {empty}"


def _needed_fixes():
    return [f for f, src in load_fixes() if src == "builtin" and safe_detect(f).verdict is Verdict.NEEDED]


def test_contract_targets_of_needed_fixes_exist_with_expected_signature():
    """For each fix that says 'needed' on this sglang, each of its targets exists with
    the parameters its hook expects (cf. sglang's own plugin-contract test)."""
    for fix in _needed_fixes():
        plan = safe_detect(fix).targets
        assert plan and set(plan) <= set(fix.targets), (fix, plan)
        for target in plan:
            obj = resolve(target)
            want = list(fix.target_params.get(target, ()))
            if want:
                params = list(inspect.signature(inspect.unwrap(obj)).parameters)
                assert params[: len(want)] == want, (fix.name, target, params)


def test_no_fix_reports_unknown_on_this_sglang():
    for fix, src in load_fixes():
        det = safe_detect(fix)
        assert det.verdict is not Verdict.UNKNOWN, (fix.name, det.reason)


SOURCE_READ_MODULES = ("trtllm_mha_backend", "flashinfer_backend", "flashattention_backend", "triton_backend")


def test_function_text_equals_inspect_getsource_on_sglang_functions():
    """The unparsed text that detection searches (``function_text``, ``normalized_source``)
    is, comments and spacing aside, ``inspect.getsource``'s, for every function of the
    attention backends the fixes read (no parse behind it to catch a short cut)."""
    import inspect
    import re

    from sglang_swa_plugin.probe import function_text, normalized_source, optional_module

    def folded(src):
        return re.sub(r"\s+", " ", re.sub(r"#[^\n]*", "", src))

    fns = []
    for name in SOURCE_READ_MODULES:
        mod = optional_module(f"sglang.srt.layers.attention.{name}")
        for k in vars(mod).values() if mod is not None else ():
            if isinstance(k, type) and k.__module__ == mod.__name__:
                fns += [inspect.unwrap(getattr(f, "__func__", f)) for f in vars(k).values()
                        if inspect.isfunction(getattr(f, "__func__", f))]
    assert len(fns) >= 50
    for fn in fns:
        try:
            want = folded(textwrap.dedent(inspect.getsource(fn)))
        except OSError:  # generated (a dataclass's __init__): no file to read
            continue
        assert folded(function_text(fn)) == want, fn.__qualname__
        assert normalized_source(fn) == want, fn.__qualname__


def test_if_branches_mentioning_leaves_out_only_branches_without_those_names():
    import ast

    from sglang_swa_plugin.probe import if_branches, optional_module

    mod = optional_module("sglang.srt.layers.attention.flashattention_backend")
    if mod is None:
        pytest.skip("no FA3 backend")
    names, found = ("local_attn", "page_table"), 0
    for f in vars(mod.FlashAttentionBackend).values():
        fn = inspect.unwrap(getattr(f, "__func__", f))
        if not inspect.isfunction(fn):
            continue
        every = if_branches(fn, "is_target_verify")
        some = if_branches(fn, "is_target_verify", mentioning=names)
        want = [n for n in every if any(m in ast.unparse(n) for m in names)]
        assert [ast.dump(n) for n in some] == [ast.dump(n) for n in want], fn.__qualname__
        assert if_branches(fn, "is_target_verify", mentioning=("no_such_name_anywhere",)) == [], fn.__qualname__
        found += len(some)
    assert found >= 1  # the filter keeps the branches that mention the names


def test_check_reports_an_opt_in_fix_that_is_off_as_off(monkeypatch):
    from sglang_swa_plugin.cli import check_report

    monkeypatch.delenv("SGLANG_SWA_PLUGIN_GUARD", raising=False)
    row = next(r for r in check_report()["rows"] if r["fix"] == "swa_index_guard")
    assert row["detection"] == "opt-in, off" and "SGLANG_SWA_PLUGIN_GUARD=1" in row["note"]
    monkeypatch.setenv("SGLANG_SWA_PLUGIN_GUARD", "1")
    row = next(r for r in check_report()["rows"] if r["fix"] == "swa_index_guard")
    assert row["detection"] in ("needed", "not applicable")


def test_direct_hooks_rebind_module_level_copies_and_leave_methods_to_their_class(tmp_path, monkeypatch):
    """Direct patching (sglang without a plugin framework) rebinds ``from X import Y`` copies
    of a module-level function, as HookRegistry does; a method is set on its class only (no
    scan of every loaded module's globals per target)."""
    import sys

    from sglang_swa_plugin.patching import DirectHooks

    (tmp_path / "swa_demo_src.py").write_text("def f():\n    return 1\n\nclass C:\n    def m(self):\n        return 2\n")
    (tmp_path / "swa_demo_user.py").write_text("from swa_demo_src import f\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import swa_demo_src
    import swa_demo_user

    hooks = DirectHooks("demo")
    try:
        hooks.around("swa_demo_src.f", lambda original: original() + 10)
        hooks.around("swa_demo_src.C.m", lambda original, self: original(self) + 20)
        assert swa_demo_src.f() == 11 and swa_demo_user.f() == 11  # the copy is rebound too
        assert swa_demo_src.C().m() == 22
    finally:
        hooks.undo()
        sys.modules.pop("swa_demo_src", None)
        sys.modules.pop("swa_demo_user", None)
    assert swa_demo_src.f() == 1 and swa_demo_user.f() == 1 and swa_demo_src.C().m() == 2


def test_the_plugins_modules_import_no_cycle():
    """No module of ``sglang_swa_plugin`` imports, at module level or inside a function, one
    that imports it back (directly or through others)."""
    import ast
    from pathlib import Path

    import sglang_swa_plugin

    root = Path(sglang_swa_plugin.__file__).parent
    names = {p.stem for p in root.glob("*.py")} - {"__init__"}
    graph = {}
    for name in names:
        tree = ast.parse((root / f"{name}.py").read_text())
        found = set()
        for n in ast.walk(tree):
            if not isinstance(n, ast.ImportFrom):
                continue
            if n.module is None or n.module == "sglang_swa_plugin":  # from . import x
                found |= {alias.name for alias in n.names}
            elif n.level or n.module.startswith("sglang_swa_plugin."):
                found.add(n.module.replace("sglang_swa_plugin.", "").split(".")[0])
        graph[name] = found & names

    def reaches(start, goal, seen=()):
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, (*seen, nxt))) for nxt in graph[start])

    assert not [name for name in names if reaches(name, name)], graph
