"""The check side: ``sglang-swa-plugin check`` (per fix, its CPU reproduction on the
installed sglang's real classes, once without and once with the plugin as this environment
configures it), the CPU testbed (``testbed``), the shared kernel recorders and CPU stand-ins
(``kernels``) and one scenario module per fix, named like the fix. ``register()`` never
imports anything of this package; ``Fix.reproduce`` reaches a fix's module by its dotted
name (``Fix.check_module``).

Every per-fix module has the same shape: ``scenario() -> Outcome`` (the bug shows, and
what was seen) and ``reproduce() -> bool`` (``scenario().bug``)."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from .. import config as _config
from ..core import DISABLED, load_fixes, plan_installed, safe_detect
from ..doctor import NOT_LOADED, _sglang_importable, _sglang_version, fix_records, import_hint, settings, setting_problems
from ..fix import Fix, ScenarioUnavailable, Verdict


def print_outcome(scenario) -> None:
    """What ``python -m sglang_swa_plugin.check.<fix>`` prints: the scenario's outcome as one
    JSON line."""
    import json
    import sys

    out = scenario()
    json.dump({"bug": out.bug, "seen": out.seen}, sys.stdout, default=str)
    print()


class Outcome(NamedTuple):
    """What a fix's CPU scenario found: ``bug`` (the bug shows) and ``seen`` (what the
    scenario observed: per backend/view verdicts, recorded kernel calls, a message)."""

    bug: bool
    seen: Any = None


def _off_reason(fix: Fix, record: dict, cfg: _config.Config) -> Optional[str]:
    """Why the plugin, as configured here, would not install ``fix`` (None: it would): the
    reason of its record, as ``doctor`` shows it (``disabled`` or ``not loaded``)."""
    if record["status"] == NOT_LOADED:
        return record["reason"]
    if record["status"] != DISABLED:
        return None
    off = f"disabled: {record['reason']}"
    if fix.opt_in and cfg.enabled and cfg.selected(fix.name):
        off += f"; {_config.opt_in_variable(fix.opt_in)}=1 turns it on"
    return off


def check_row(fix: Fix, record: dict, cfg: _config.Config) -> dict:
    """``reproduced_without``: the bug shows on stock sglang. ``fixed_with``: with the plugin as
    configured here the scenario is correct (None where the plugin installs nothing for this
    fix: not needed, or off). ``fixed_if_on``: the same with the fix turned on (off fixes).
    ``record``: what ``register()`` would do with the fix here (``doctor``'s row); ``cfg``:
    the settings it was decided with."""
    det = safe_detect(fix)
    off = _off_reason(fix, record, cfg)
    row = {"fix": fix.name, "status": record["status"], "reason": record["reason"], "detection": det.verdict.value,
           "scenario": fix.scenario_description(), "reproduced_without": None, "fixed_with": None,
           "fixed_if_on": None, "note": off or ""}
    if fix.opt_in and DISABLED in (record["status"], record.get("if_loaded")):
        row["detection"] = "opt-in, off"
    if not fix.has_scenario():
        row["note"] = "; ".join(filter(None, (off, "no CPU scenario for this fix yet")))
        return row
    try:
        bug = row["reproduced_without"] = bool(fix.reproduce())
        if det.verdict is Verdict.NEEDED:
            with plan_installed(fix.name, det.plan):
                corrected = not fix.reproduce()
            row["fixed_if_on" if off else "fixed_with"] = corrected
        elif bug:  # detection says nothing to do, yet the bug shows: the plugin leaves it
            row["fixed_with"] = False
            row["note"] = f"detection says {det.verdict.value} ({det.reason}), but the bug reproduces"
        elif not off:
            row["note"] = f"{det.verdict.value}: {det.reason}"
    except ScenarioUnavailable as e:
        row["note"] = "; ".join(filter(None, (off, f"scenario unavailable: {e}")))
    except Exception as e:  # noqa: BLE001
        row["note"] = f"scenario failed: {type(e).__name__}: {e}"
        row["fixed_with"] = False
    return row


def check_report(attention_tp: int = 1) -> dict:
    """Per fix its scenario without and with the plugin; ``problems``: what keeps the plugin
    from protecting this environment as configured, exactly as ``doctor`` finds it (sglang
    cannot be imported, the plugin will not load or is off, a bad setting). ``attention_tp``:
    the scenarios run as rank 0 of that many attention tensor-parallel ranks (each pool, layer
    and backend holds one rank's heads, ``testbed.attention_tp``)."""
    import_error = _sglang_importable()
    if import_error:  # no scenario can run: one line, not one error per fix
        return {"sglang_version": _sglang_version(), "config": None, "rows": [], "ok": False,
                "problems": [import_error], "hint": import_hint(import_error, []), "attention_tp": attention_tp}
    from .testbed import attention_tp as ranks

    fixes = load_fixes()
    cfg = settings(fixes)
    records, env = fix_records(fixes, cfg)
    by_name = {r["name"]: r for r in records}
    with ranks(attention_tp):
        rows = [check_row(fix, by_name[fix.name], cfg) for fix, _source in fixes]
    problems = setting_problems(cfg, env)
    if not all(r["fixed_with"] is not False and r["fixed_if_on"] is not False for r in rows):
        problems.append("a fix did not correct its scenario")
    return {"sglang_version": _sglang_version(), "config": cfg.as_dict(), "rows": rows, "ok": not problems,
            "problems": problems, "hint": import_hint(None, records), "attention_tp": attention_tp}


def _yn(v) -> str:
    return "-" if v is None else ("yes" if v else "no")


def _with_plugin(r: dict) -> str:
    if r["fixed_if_on"] is not None:
        return f"off ({_yn(r['fixed_if_on'])} if on)"
    return _yn(r["fixed_with"])


def print_check(rep: dict) -> None:
    if rep["config"] is None:  # sglang cannot be imported: nothing else to say
        print("PROBLEM: " + "; ".join(rep["problems"]) + (f" ({rep['hint']})" if rep["hint"] else ""))
        return
    tp = rep.get("attention_tp", 1)
    print(f"sglang {rep['sglang_version']}: CPU reproductions on the installed sglang's real classes"
          + (f", as rank 0 of {tp} attention tensor-parallel ranks" if tp > 1 else ""))
    for err in rep["config"]["errors"]:
        print(f"BAD SETTING: {err}")
    hdr = ("fix", "detection", "bug without plugin", "fixed with plugin", "note")
    rows = [(r["fix"], r["detection"], _yn(r["reproduced_without"]), _with_plugin(r), r["note"]) for r in rep["rows"]]
    widths = [max(len(str(x[i])) for x in rows + [hdr]) for i in range(4)]

    def line(x):
        return "  ".join(str(v).ljust(widths[i]) if i < 4 else str(v) for i, v in enumerate(x)).rstrip()

    print(line(hdr))
    for r, shown in zip(rep["rows"], rows):
        print(line(shown))
        if r["scenario"]:
            print(" " * (widths[0] + 2) + "scenario: " + r["scenario"])
    if not rows:
        print("(no fixes registered)")
    elif not any(r["reproduced_without"] is not None for r in rep["rows"]):
        print("No CPU scenario exists yet for the registered fixes.")
    if rep["hint"]:
        print(rep["hint"])
    print("OK" if rep["ok"] else "PROBLEM: " + "; ".join(rep["problems"]))
