"""``sglang-swa-plugin doctor``: what the plugin will do in this environment, and whether
it will load at all. Never a false all-clear (exit 1 and the reason whenever the plugin will
not load or a selected, needed fix cannot be installed) and never a traceback: what cannot be
imported is one line, and the rest of the report is still shown. ``check`` reads the
settings, the loading and each fix's status through the same functions (``settings``,
``fix_records``, ``setting_problems``), so the two never disagree."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import List, Optional

from . import __version__
from . import config as _config
from . import gaps as _gaps
from .core import ERROR, PROBLEMS, UNKNOWN, broken_records, checked_settings, decide, load_fixes
from .patching import DirectHooks

ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "swa_plugin"
NOT_LOADED = "not loaded"  # every fix's status where sglang's processes will not load the plugin

# Import failures of sglang's CUDA-only stack on a machine without a GPU or CUDA runtime.
_CUDA_ONLY = re.compile(r"torchvision::\w+ does not exist|libcudart|libcuda\b|libnvrtc|CUDA driver|NVIDIA driver|"
                        r"sgl_kernel|no CUDA|not compiled with CUDA")
CUDA_ONLY_MODULES = ("torchvision", "flashinfer", "sgl_kernel")  # what sglang imports that needs CUDA binaries
IMPORT_HINT = ("hint: a CUDA-only part of sglang's stack does not load on this machine (no GPU, or a CPU-only "
               "torch); on a CPU machine put tests/cpu_import_shims of the plugin's source tree on PYTHONPATH "
               "(it makes those binaries importable), or run this where the GPU stack is installed")


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


def _cuda_only_import_failure() -> Optional[str]:
    """The first of sglang's usual CUDA-only dependencies that is installed and fails to
    import here with a CUDA-only error (one line), else None."""
    for name in CUDA_ONLY_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
        except Exception as e:  # noqa: BLE001
            why = f"{name}: {type(e).__name__}: {e}"
            if _CUDA_ONLY.search(why):
                return why
    return None


def import_hint(import_error: Optional[str], records: List[dict]) -> Optional[str]:
    """One line of advice where sglang (``import_error``) or a fix's target (a record's
    reason) cannot be imported because a CUDA-only binary fails on this machine; else None.
    Where the failures do not say so themselves (transformers, for one, reports a failed
    torchvision as "Could not import module 'AutoProcessor'"), the usual suspects are
    imported to find out."""
    failures = [import_error] if import_error else []
    failures += [r["reason"] for r in records if r["status"] in (UNKNOWN, ERROR) and "cannot import" in r["reason"]]
    if not failures:
        return None
    if any(_CUDA_ONLY.search(why) for why in failures):
        return IMPORT_HINT
    found = _cuda_only_import_failure()
    return f"{IMPORT_HINT} (here: {found})" if found else None


def load_problem(has_framework: Optional[bool], ours: list, allowed: str, import_error: Optional[str]) -> Optional[str]:
    """Why sglang's processes will not load the plugin, or None when they will."""
    if import_error:
        return import_error
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
    import_error = _sglang_importable()
    has_fw = None if import_error else _has_plugin_framework()
    ours = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.value.startswith("sglang_swa_plugin")]
    allowed = os.environ.get(_config.SGLANG_PLUGINS, "")
    problem = load_problem(has_fw, ours, allowed, import_error)
    if problem:
        loader = "none: " + problem
    elif has_fw:
        loader = "sglang's plugin loader (entry point group sglang.srt.plugins)"
    else:
        loader = "start-up hook (sglang_swa_plugin_autoload.pth): this sglang has no plugin framework"
    return {
        "plugin_version": __version__,
        "sglang_version": _sglang_version(),
        "sglang_import_error": import_error,
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


def settings(fixes) -> _config.Config:
    """The settings as ``register()`` reads them: parsed, then checked against the fixes and
    previews that exist (an unknown fix name falls back to all fixes, an unknown preview to none)."""
    return checked_settings(_config.parse(), fixes)


def fix_records(fixes, cfg: _config.Config) -> "tuple[List[dict], dict]":
    """Per fix what ``register()`` would do here (decided, installed for a trial, verified,
    undone), and the environment report. Where sglang is importable but will not load the
    plugin, every fix is ``not loaded``: it will not be applied (``if_loaded``: its status if
    it were loaded)."""
    # sglang's own import first: where it fails, the first attempt's error is the telling one
    # (a second attempt may fail otherwise, or even pass, with sglang half initialised).
    env = environment_report()
    records = [_trial(fix, source, cfg) for fix, source in fixes]
    for rec in broken_records() if cfg.enabled else ():
        records.append({k: v for k, v in rec.as_dict().items() if k != "in_effect"})
    if not env["loads"] and not env["sglang_import_error"]:
        for r in records:
            r["if_loaded"] = r["status"]
            r["status"], r["reason"] = NOT_LOADED, f"will not be applied: the plugin does not load (if it did: {r['status']})"
    return records, env


def setting_problems(cfg: _config.Config, env: dict) -> List[str]:
    """What keeps the plugin from protecting this environment as configured, one line each:
    it will not load, it is off, a setting is bad."""
    problems = []
    if not env["loads"]:
        problems.append(env["loaded_by"][len("none: "):])
    if not cfg.enabled:
        problems.append(f"{_config.ENABLE}={cfg.raw.get(_config.ENABLE)}: the plugin installs nothing")
    return problems + [f"bad setting: {e}" for e in cfg.errors]


def doctor_report() -> dict:
    fixes = load_fixes()
    cfg = settings(fixes)
    records, env = fix_records(fixes, cfg)
    problems = setting_problems(cfg, env)
    if not env["sglang_import_error"]:  # else every fix is unknown for that one reason
        problems += [f"fix {r['name']}: {r['status']}" for r in records if r["selected"] and r["status"] in PROBLEMS]
    return {**env, "config": cfg.as_dict(), "fixes": records, **_gaps.report(), "ok": not problems,
            "problems": problems, "hint": import_hint(env["sglang_import_error"], records)}


def print_doctor(rep: dict) -> None:
    p = print
    p(f"sglang-swa-plugin {rep['plugin_version']}   python {rep['python']}")
    p(f"sglang:            {rep['sglang_version'] or 'not installed'}")
    fw = rep["plugin_framework"]
    p(f"plugin framework:  {'unknown (sglang cannot be imported)' if fw is None else 'yes' if fw else 'no (sglang < 0.5.11)'}")
    p(f"entry point:       {rep['entry_point'] or 'NOT FOUND'}"
      + ("" if rep["allowed_by_SGLANG_PLUGINS"] else f"  (excluded by SGLANG_PLUGINS={rep['SGLANG_PLUGINS']})"))
    p(f"loaded by:         {rep['loaded_by']}")
    w = max(map(len, _config.ALL_VARS)) + 2
    for var in _config.ALL_VARS:
        p(f"{var + ':':<{w}}{rep['config']['env'].get(var) or '(unset)'}")
    p(f"guard:             {'on' if rep['config']['guard'] else 'off'}")
    for err in rep["config"]["errors"]:
        p(f"BAD SETTING: {err}")
    p("")
    p("fixes (status at start-up in this environment):")
    w = max([len(r["name"]) for r in rep["fixes"]] + [4])
    for r in rep["fixes"]:
        p(f"  {r['name']:<{w}}  {r['status']:<14} {r['reason']}")
        p(f"  {'':<{w}}  {'':<14} upstream: {', '.join(r['upstream_prs']) or '-'}; {r['summary']}")
        for name, preview in r.get("previews", {}).items():
            turn = "on" if preview["on"] else f"off; {_config.PREVIEW}={name} turns it on"
            p(f"  {'':<{w}}  {'':<14} preview {name} ({turn}): {preview['what']}")
        if r["source"] != "builtin":
            p(f"  {'':<{w}}  {'':<14} from {r['source']}")
    if not rep["fixes"]:
        p("  (no fixes registered)")
    p("")
    _gaps.print_gaps(rep, p)
    p("")
    if rep.get("hint"):
        p(rep["hint"])
    p("OK" if rep["ok"] else "PROBLEM: " + "; ".join(rep["problems"]))
