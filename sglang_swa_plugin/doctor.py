"""``sglang-swa-plugin doctor``: what the plugin will do in this environment, and whether
it will load at all. Never a false all-clear (exit 1 and the reason whenever the plugin will
not load or a selected, needed fix cannot be installed) and never a traceback: what cannot be
imported is one line, and the rest of the report is still shown."""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import List, Optional

from . import __version__
from . import config as _config
from .core import PROBLEMS, broken_records, decide, load_fixes
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


def _sglang_importable() -> Optional[str]:
    """None when ``import sglang`` works, else why not (one line)."""
    try:
        if importlib.util.find_spec("sglang") is None:
            return "sglang is not installed"
        importlib.import_module("sglang")
    except Exception as e:  # noqa: BLE001
        return f"cannot import sglang: {type(e).__name__}: {e}"
    return None


def load_problem(has_framework: bool, ours: list, allowed: str) -> Optional[str]:
    """Why sglang's processes will not load the plugin, or None when they will."""
    why = _sglang_importable()
    if why:
        return why
    if not has_framework:
        if not _startup_hook_installed():
            return "this sglang has no plugin framework and the start-up hook (sglang_swa_plugin_autoload.pth) is not installed"
        return None
    if not ours:
        return f"the entry point {ENTRY_POINT_NAME} (group {ENTRY_POINT_GROUP}) is not installed"
    allow = {x.strip() for x in allowed.split(",") if x.strip()}
    if allow and not any(ep.name in allow for ep in ours):
        return f"SGLANG_PLUGINS={allowed} does not name {ENTRY_POINT_NAME}: sglang will not load the plugin"
    return None


def environment_report() -> dict:
    has_fw = None if _sglang_importable() else _has_plugin_framework()
    ours = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.value.startswith("sglang_swa_plugin")]
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    problem = load_problem(has_fw, ours, allowed)
    if problem:
        loader = "none: " + problem
    elif has_fw:
        loader = "sglang's plugin loader (entry point group sglang.srt.plugins)"
    else:
        loader = "start-up hook (sglang_swa_plugin_autoload.pth): this sglang has no plugin framework"
    return {
        "plugin_version": __version__,
        "sglang_version": _sglang_version(),
        "python": sys.version.split()[0],
        "plugin_framework": has_fw,
        "entry_point_found": bool(ours),
        "entry_point": ours[0].name + " = " + ours[0].value if ours else None,
        "allowed_by_SGLANG_PLUGINS": not (problem or "").startswith("SGLANG_PLUGINS="),
        "SGLANG_PLUGINS": allowed or None,
        "loads": problem is None,
        "loaded_by": loader,
    }


def _trial(fix, source, cfg) -> dict:
    """The fix decided and (where needed) installed directly, verified, then undone."""
    trial: List[DirectHooks] = []

    def factory(name):
        trial.append(DirectHooks(name))
        return trial[-1]

    try:
        rec = decide(fix, source, cfg, factory)
        rec.verify()
    finally:
        for hooks in trial:
            hooks.undo()
    return {k: v for k, v in rec.as_dict().items() if k != "in_effect"}


def doctor_report() -> dict:
    fixes = load_fixes()
    cfg = _config.parse()
    if cfg.enabled:
        cfg = cfg.checked_against([f.name for f, _ in fixes])
    records = [_trial(fix, source, cfg) for fix, source in fixes]  # first: the first import error is the telling one
    env = environment_report()
    for rec in broken_records() if cfg.enabled else ():
        records.append({k: v for k, v in rec.as_dict().items() if k != "in_effect"})
    problems = []
    if not env["loads"]:
        problems.append(env["loaded_by"][len("none: "):])
    if not cfg.enabled:
        problems.append(f"{_config.ENABLE}={cfg.raw.get(_config.ENABLE)}: the plugin installs nothing")
    problems += [f"fix {r['name']}: {r['status']}" for r in records if r["selected"] and r["status"] in PROBLEMS]
    problems += [f"bad setting: {e}" for e in cfg.errors]
    return {**env, "config": cfg.as_dict(), "fixes": records, "ok": not problems, "problems": problems}


def print_doctor(rep: dict) -> None:
    p = print
    p(f"sglang-swa-plugin {rep['plugin_version']}   python {rep['python']}")
    p(f"sglang:            {rep['sglang_version'] or 'not installed'}")
    fw = rep["plugin_framework"]
    p(f"plugin framework:  {'unknown (sglang cannot be imported)' if fw is None else 'yes' if fw else 'no (sglang < 0.5.11)'}")
    p(f"entry point:       {rep['entry_point'] or 'NOT FOUND'}"
      + ("" if rep["allowed_by_SGLANG_PLUGINS"] else f"  (excluded by SGLANG_PLUGINS={rep['SGLANG_PLUGINS']})"))
    p(f"loaded by:         {rep['loaded_by']}")
    for var in _config.ALL_VARS:
        p(f"{var + ':':<26}{rep['config']['env'].get(var) or '(unset)'}")
    p(f"guard:             {'on' if rep['config']['guard'] else 'off'}")
    for err in rep["config"]["errors"]:
        p(f"BAD SETTING: {err}")
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
