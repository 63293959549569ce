"""The plugin's core: collect fixes (pluggy), decide per fix, install, report."""

from __future__ import annotations

import contextlib
import importlib
import logging
import pkgutil
from dataclasses import asdict, dataclass, field
from importlib.metadata import entry_points
from typing import Any, Dict, Iterator, List, Optional, Sequence

import pluggy

from . import config as _config
from .fix import (
    FIXES_ENTRY_POINT_GROUP,
    PROJECT,
    Detection,
    Fix,
    FixSpecs,
    Hook,
    TargetMissing,
    Verdict,
    hookimpl,
    split_target,
)
from .log import emit
from .probe import ImportFailed
from .patching import DirectHooks, target_marks
from .verify import not_in_effect

# Final statuses, one per fix.
APPLIED = "applied"
NOT_NEEDED = "not needed"
NOT_APPLICABLE = "not applicable"
DISABLED = "disabled"
SKIPPED = "skipped"
UNKNOWN = "unknown"
ERROR = "error"
PENDING = "pending"  # registered on sglang's HookRegistry, not yet applied and verified
PROBLEMS = (SKIPPED, UNKNOWN, ERROR)  # a selected fix that is needed/undecided but not installed

@dataclass
class FixRecord:
    name: str
    summary: str
    upstream_prs: List[str]
    targets: List[str]
    status: str
    reason: str
    source: str = "builtin"  # or the third-party entry point
    via: Optional[str] = None  # HookRegistry / direct, when installed
    installed_targets: List[str] = field(default_factory=list)
    selected: bool = True
    previews: Dict[str, dict] = field(default_factory=dict)  # name -> {"what": ..., "on": bool}
    originals: Dict[str, Any] = field(default_factory=dict, repr=False)  # target -> unhooked object

    def in_effect(self) -> bool:
        """True when every installed target really carries this fix's hook now."""
        if self.status != APPLIED:
            return False
        return all(self.name in target_marks(t) for t in self.installed_targets)

    def verify(self) -> None:
        """``applied`` stays only where the hook is in effect on every target (in the owner
        and in each module that held the original); otherwise ``skipped`` with the reason."""
        if self.status not in (APPLIED, PENDING):
            return
        problems = not_in_effect(self.name, self.installed_targets, self.originals)
        if not self.installed_targets:
            problems.append("no hook was installed")
        if problems:
            self.status, self.reason = SKIPPED, "hook not in effect: " + "; ".join(problems)
        else:
            self.status = APPLIED

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("originals")
        d["in_effect"] = self.in_effect()
        return d


# ---------------------------------------------------------------------------- fixes

HOOKS_PACKAGE = "sglang_swa_plugin.hooks"


def _builtin_modules() -> "tuple[str, ...]":
    """Every module of ``sglang_swa_plugin.hooks`` (found, not imported): each is one built-in fix."""
    from . import hooks

    return tuple(sorted(f"{HOOKS_PACKAGE}.{m.name}" for m in pkgutil.iter_modules(hooks.__path__)
                        if not m.name.startswith("_")))


BUILTIN_MODULES = _builtin_modules()  # by name; ``load_fixes`` gives the install order
BROKEN: Dict[str, str] = {}  # built-in fix module -> why it is not a fix here


class _Builtin:
    """The pluggy plugin of one built-in fix module: its ``FIX``. Built-in and third-party
    fixes are collected by the same hook."""

    def __init__(self, module):
        self.module = module

    @hookimpl
    def sglang_swa_plugin_fixes(self):
        return [self.module.FIX]


def load_fixes() -> "List[tuple[Fix, str]]":
    """Built-in fixes plus third-party fixes from the ``sglang_swa_plugin.fixes``
    entry-point group, as (fix, source), in install order (:func:`install_order`). A module
    that cannot be imported is recorded in ``BROKEN`` (built-in) or reported (third party) and
    skipped; it never stops the others."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(FixSpecs)
    sources: Dict[int, str] = {}
    registered: Dict[int, Any] = {}  # id() -> each registered module (kept, so ids stay unique)
    for modname in BUILTIN_MODULES:
        try:
            mod = importlib.import_module(modname)
        except Exception as e:  # noqa: BLE001
            BROKEN[modname] = f"cannot import {modname}: {type(e).__name__}: {e}"
            continue
        if not isinstance(getattr(mod, "FIX", None), Fix):
            BROKEN[modname] = f"{modname} defines no FIX (a Fix instance)"
            continue
        plugin = _Builtin(mod)
        pm.register(plugin, name=modname)
        registered[id(mod)] = plugin
        sources[id(plugin)] = "builtin"
    for ep in entry_points(group=FIXES_ENTRY_POINT_GROUP):
        try:
            mod = ep.load()
            if id(mod) in registered:
                continue
            pm.register(mod, name=f"entry point {ep.name}")
            registered[id(mod)] = mod
            sources[id(mod)] = f"entry point {ep.name} ({ep.value})"
        except Exception as e:  # noqa: BLE001 - a broken third party must not break us
            emit(logging.WARNING, "sglang-swa-plugin: could not load third-party fix %s (%s): %s", ep.name, ep.value, e)
    out: List[tuple] = []
    names = set()
    for impl in pm.hook.sglang_swa_plugin_fixes.get_hookimpls():
        try:
            fixes = impl.function() or ()
        except Exception as e:  # noqa: BLE001
            emit(logging.WARNING, "sglang-swa-plugin: %s failed to list its fixes: %s", impl.plugin_name, e)
            continue
        for fix in fixes:
            if not fix.name or fix.name in names:
                emit(logging.WARNING, "sglang-swa-plugin: ignoring fix with empty or duplicate name %r from %s",
                     fix.name, impl.plugin_name)
                continue
            names.add(fix.name)
            out.append((fix, sources.get(id(impl.plugin), "builtin")))
    return install_order(out)


def install_order(fixes: "Sequence[tuple[Fix, str]]") -> "List[tuple[Fix, str]]":
    """``fixes`` (fix, source) in the order they go in: each after the fixes it ``wraps`` (its
    hooks wrap theirs where both hook one target), built-ins before third-party fixes, otherwise
    by name. A built-in that wraps a fix no module provides is recorded in ``BROKEN``."""
    by_name = {fix.name: (fix, source) for fix, source in fixes}
    for fix, source in fixes:
        for name in fix.wraps:
            module = f"{HOOKS_PACKAGE}.{name}"
            if source == "builtin" and name not in by_name and module not in BROKEN:
                BROKEN[module] = f"no built-in fix {name}: {fix.name} wraps it ({module} is missing)"
    after = {name: {w for w in fix.wraps if w in by_name} for name, (fix, _) in by_name.items()}
    order: List[str] = []
    while after:
        ready = [n for n, first in after.items() if not first - set(order)] or list(after)  # a cycle: by name
        name = min(ready, key=lambda n: (by_name[n][1] != "builtin", n))
        order.append(name)
        del after[name]
    return [by_name[n] for n in order]


# ---------------------------------------------------------------------------- deciding


def _record(fix: Fix, source: str, status: str, reason: str, selected: bool = True) -> FixRecord:
    # A fix that is off is not asked for its targets: resolving them may import sglang.
    return FixRecord(
        name=fix.name,
        summary=fix.summary,
        upstream_prs=list(fix.upstream_prs),
        targets=list(fix.targets) if selected else [],
        status=status,
        reason=reason,
        source=source,
        selected=selected,
        previews={p: {"what": what, "on": p in fix.previews_on} for p, what in fix.previews.items()},
    )


# The status a fix gets where its detection says it is not to be installed.
NOT_INSTALLED = {Verdict.NOT_NEEDED: NOT_NEEDED, Verdict.NOT_APPLICABLE: NOT_APPLICABLE, Verdict.UNKNOWN: UNKNOWN,
                 Verdict.TARGET_MOVED: SKIPPED}


def safe_detect(fix: Fix) -> Detection:
    """``fix.detect()``; whatever it raises becomes an UNKNOWN (or TARGET_MOVED) detection."""
    try:
        det = fix.detect()
    except TargetMissing as e:
        return e.detection()
    except ImportFailed as e:
        return Detection.unknown(str(e))
    except Exception as e:  # noqa: BLE001
        return Detection.unknown(f"detection failed: {type(e).__name__}: {e}")
    if not isinstance(det, Detection):
        return Detection.unknown(f"detect() returned {det!r}")
    return det


def checked_settings(cfg: _config.Config, fixes) -> _config.Config:
    """``cfg`` checked against the names the loaded ``fixes`` (``load_fixes()``) and their previews have."""
    return cfg.checked_against([f.name for f, _ in fixes], [p for f, _ in fixes for p in f.previews])


def decide(fix: Fix, source: str, cfg: _config.Config, hooks_factory) -> FixRecord:
    """Decide one fix and, when it is needed, install it with ``hooks_factory(name)``. An
    installed fix is ``applied`` (direct patching) or ``pending`` (HookRegistry) until
    :meth:`FixRecord.verify` has checked that its hooks are in effect."""
    # the fix's previews that the settings turn on, for its hooks (off wherever it is not installed)
    fix.previews_on = frozenset(p for p in fix.previews if p.lower() in cfg.previews) if cfg.enabled else frozenset()
    if not cfg.enabled:
        return _record(fix, source, DISABLED, f"{_config.ENABLE}={cfg.raw.get(_config.ENABLE)}", False)
    if fix.opt_in and not getattr(cfg, fix.opt_in, False):
        return _record(fix, source, DISABLED, f"opt-in: {_config.opt_in_variable(fix.opt_in)} is off", False)
    if not cfg.selected(fix.name):
        return _record(fix, source, DISABLED, f"not selected by {_config.FIXES}={cfg.raw.get(_config.FIXES)}", False)
    already = [t for t in fix.targets if fix.name in target_marks(t)]
    if already:  # a fix's hooks go in all together (DirectHooks undoes a partial install)
        rec = _record(fix, source, APPLIED, "already installed in this process")
        rec.installed_targets = already
        return rec
    det = safe_detect(fix)
    if det.verdict is not Verdict.NEEDED:
        return _record(fix, source, NOT_INSTALLED[det.verdict], det.reason)
    hooks = hooks_factory(fix.name)
    try:
        for t in det.targets:
            split_target(t)
        hooks.install(det.plan)
    except TargetMissing as e:
        if isinstance(hooks, DirectHooks):
            hooks.undo()
        return _record(fix, source, SKIPPED, e.detection().reason)
    except Exception as e:  # noqa: BLE001
        if isinstance(hooks, DirectHooks):
            hooks.undo()
        return _record(fix, source, ERROR, f"install failed: {type(e).__name__}: {e}")
    rec = _record(fix, source, PENDING if hooks.via == "HookRegistry" else APPLIED, det.reason)
    rec.via = hooks.via
    rec.installed_targets = list(hooks.installed) or [t for t in det.targets if fix.name in target_marks(t)]
    rec.originals = dict(getattr(hooks, "originals", {}))
    return rec


def broken_records() -> List[FixRecord]:
    """One ``error`` record per built-in fix that is not a fix here (its module cannot be
    imported, defines no ``FIX``, or is missing where another fix wraps it)."""
    return [FixRecord(name=m.rpartition(".")[2], summary="", upstream_prs=[], targets=[], status=ERROR, reason=why)
            for m, why in BROKEN.items()]


def log_record(rec: FixRecord) -> None:
    prs = ", ".join(rec.upstream_prs)
    emit(logging.WARNING if rec.status in PROBLEMS else logging.INFO, "sglang-swa-plugin: fix %s: %s (%s)%s",
         rec.name, rec.status, rec.reason, f" [upstream {prs}]" if prs else "")


# ---------------------------------------------------------------------------- check, tests


@contextlib.contextmanager
def plan_installed(name: str, plan: Sequence[Hook]) -> Iterator[DirectHooks]:
    """``plan`` installed directly under the fix name ``name`` for the block, then undone."""
    hooks = DirectHooks(name)
    try:
        hooks.install(plan)
        yield hooks
    finally:
        hooks.undo()


@contextlib.contextmanager
def temporarily_installed(*fixes: Fix) -> Iterator[List[DirectHooks]]:
    """Install fixes directly for the duration of the block, then undo (``check``, tests):
    each fix's plan as its detection gives it now (a NOT_NEEDED detection's plan too)."""
    done: List[DirectHooks] = []
    try:
        for fix in fixes:
            hooks = DirectHooks(fix.name)
            done.append(hooks)
            hooks.install(fix.detect().plan)
        yield done
    finally:
        for hooks in reversed(done):
            hooks.undo()


def find_fix(name: str) -> Fix:
    for fix, _ in load_fixes():
        if fix.name == name:
            return fix
    raise KeyError(name)
