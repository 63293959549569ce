"""``sglang-swa-plugin doctor`` and ``sglang-swa-plugin check``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import List, Optional

from . import __version__
from . import config as _config
from .core import PROBLEMS, decide, load_fixes, safe_detect, temporarily_installed
from .fix import ScenarioUnavailable, Verdict
from .patching import DirectHooks

ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "swa_plugin"


def _sglang_version() -> Optional[str]:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def _has_plugin_framework() -> bool:
    try:
        return importlib.util.find_spec("sglang.srt.plugins") is not None
    except Exception:  # noqa: BLE001 - sglang absent or failing to import
        return False


def _startup_hook_installed() -> bool:
    return any(os.path.isfile(os.path.join(d, "sglang_swa_plugin_autoload.pth")) for d in sys.path if d)


def loader_path(has_framework: bool) -> str:
    """Which path loads the plugin into sglang's processes in this environment."""
    if has_framework:
        return "sglang's plugin loader (entry point group sglang.srt.plugins)"
    if not _config.parse().enabled:
        return f"none: disabled by {_config.ENABLE}"
    if _startup_hook_installed():
        return "start-up hook (sglang_swa_plugin_autoload.pth): this sglang has no plugin framework"
    return "none: this sglang has no plugin framework and the start-up hook is not installed"


def environment_report() -> dict:
    has_fw = _has_plugin_framework()
    ours = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.value.startswith("sglang_swa_plugin")]
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    allow_set = {x.strip() for x in allowed.split(",") if x.strip()}
    return {
        "plugin_version": __version__,
        "sglang_version": _sglang_version(),
        "python": sys.version.split()[0],
        "plugin_framework": has_fw,
        "entry_point_found": bool(ours),
        "entry_point": ours[0].name + " = " + ours[0].value if ours else None,
        "allowed_by_SGLANG_PLUGINS": (not allow_set) or any(ep.name in allow_set for ep in ours),
        "SGLANG_PLUGINS": allowed or None,
        "loaded_by": loader_path(has_fw),
    }


def doctor_report() -> dict:
    fixes = load_fixes()
    cfg = _config.parse().checked_against([f.name for f, _ in fixes])
    records = []
    for fix, source in fixes:
        trial: List[DirectHooks] = []

        def factory(name, _trial=trial):
            _trial.append(DirectHooks(name))
            return _trial[-1]

        rec = decide(fix, source, cfg, factory)  # a trial install, undone right away
        for hooks in trial:
            hooks.undo()
        d = rec.as_dict()
        d.pop("in_effect")
        records.append(d)
    env = environment_report()
    problems = [r["name"] for r in records if r["selected"] and r["status"] in PROBLEMS] + list(cfg.errors)
    return {**env, "config": cfg.as_dict(), "fixes": records, "ok": not problems, "problems": problems}


def _print_doctor(rep: dict) -> None:
    p = print
    p(f"sglang-swa-plugin {rep['plugin_version']}   python {rep['python']}")
    p(f"sglang:            {rep['sglang_version'] or 'not installed'}")
    p(f"plugin framework:  {'yes' if rep['plugin_framework'] else 'no (sglang < 0.5.11)'}")
    p(f"entry point:       {rep['entry_point'] or 'NOT FOUND'}"
      + ("" if rep["allowed_by_SGLANG_PLUGINS"] else f"  (excluded by SGLANG_PLUGINS={rep['SGLANG_PLUGINS']})"))
    p(f"loaded by:         {rep['loaded_by']}")
    for var in _config.ALL_VARS:
        p(f"{var + ':':<26}{rep['config']['env'].get(var) or '(unset)'}")
    p(f"guard:             {'on' if rep['config']['guard'] else 'off'}")
    for err in rep["config"]["errors"]:
        p(f"CONFIG ERROR: {err}")
    p("")
    p("fixes (status at start-up in this environment):")
    w = max([len(r["name"]) for r in rep["fixes"]] + [4])
    for r in rep["fixes"]:
        p(f"  {r['name']:<{w}}  {r['status']:<14} {r['reason']}")
        p(f"  {'':<{w}}  {'':<14} upstream: {', '.join(r['upstream_prs']) or '-'}; {r['summary']}")
        if r["source"] != "builtin":
            p(f"  {'':<{w}}  {'':<14} from {r['source']}")
    if not rep["fixes"]:
        p("  (no fixes registered)")
    p("")
    p("OK" if rep["ok"] else "PROBLEM: " + "; ".join(rep["problems"]))


def check_report() -> dict:
    rows = []
    cfg = _config.parse()
    for fix, _source in load_fixes():
        row = {"fix": fix.name, "detection": None, "reproduced_without": None, "fixed_with": None, "note": ""}
        det = safe_detect(fix)
        row["detection"] = det.verdict.value
        if fix.opt_in and not getattr(cfg, fix.opt_in, False):
            # The scenario still runs (it shows what the opt-in does), but it is off here.
            row["detection"] = "opt-in, off"
            row["note"] = f"{_config.opt_in_variable(fix.opt_in)}=1 turns it on"
        if not fix.has_scenario():
            row["note"] = "no CPU scenario for this fix yet"
            rows.append(row)
            continue
        try:
            bug_without = bool(fix.reproduce())
            row["reproduced_without"] = bug_without
            if det.verdict is Verdict.NEEDED:
                with temporarily_installed(fix):
                    row["fixed_with"] = not fix.reproduce()
            else:
                row["fixed_with"] = not bug_without
                row["note"] = f"fix {det.verdict.value}: {det.reason}"
        except ScenarioUnavailable as e:
            row["note"] = f"scenario unavailable: {e}"
        except Exception as e:  # noqa: BLE001
            row["note"] = f"scenario failed: {type(e).__name__}: {e}"
            row["fixed_with"] = False
        rows.append(row)
    ok = all(r["fixed_with"] is not False for r in rows)
    return {"sglang_version": _sglang_version(), "rows": rows, "ok": ok}


def _yn(v) -> str:
    return "-" if v is None else ("yes" if v else "no")


def _print_check(rep: dict) -> None:
    print(f"sglang {rep['sglang_version']}: CPU reproductions on the installed sglang's real classes")
    hdr = ("fix", "detection", "bug without plugin", "fixed with plugin", "note")
    rows = [(r["fix"], r["detection"], _yn(r["reproduced_without"]), _yn(r["fixed_with"]), r["note"]) for r in rep["rows"]]
    widths = [max(len(str(x[i])) for x in rows + [hdr]) for i in range(4)]
    line = lambda x: "  ".join(str(v).ljust(widths[i]) if i < 4 else str(v) for i, v in enumerate(x))  # noqa: E731
    print(line(hdr))
    for r in rows:
        print(line(r))
    if not rows:
        print("(no fixes registered)")
    elif not any(r["reproduced_without"] is not None for r in rep["rows"]):
        print("No CPU scenario exists yet for the registered fixes.")
    print("OK" if rep["ok"] else "PROBLEM: a fix did not correct its scenario")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="sglang-swa-plugin", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doctor", help="show sglang, loading, settings and per-fix status")
    d.add_argument("--json", action="store_true")
    c = sub.add_parser("check", help="run each fix's CPU reproduction without and with the fix")
    c.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    # On sglang without a plugin framework the start-up hook would apply every fix as soon
    # as a scenario imports sglang's model runner; doctor and check judge stock sglang.
    from . import _autoload

    _autoload.disarm()
    if args.cmd == "doctor":
        rep = doctor_report()
        print(json.dumps(rep, indent=2)) if args.json else _print_doctor(rep)
    else:
        rep = check_report()
        print(json.dumps(rep, indent=2)) if args.json else _print_check(rep)
    return 0 if rep["ok"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
