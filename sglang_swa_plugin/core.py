"""The plugin's core: collect fixes (pluggy), decide per fix, install, report."""

from __future__ import annotations

import contextlib
import importlib
import logging
from dataclasses import asdict, dataclass, field
from importlib.metadata import entry_points
from typing import Dict, Iterator, List, Optional, Sequence

import pluggy

from . import config as _config
from .fix import (
    FIXES_ENTRY_POINT_GROUP,
    PROJECT,
    Detection,
    Fix,
    FixSpecs,
    TargetMissing,
    Verdict,
    split_target,
)
from .patching import DirectHooks, hook_registry, mark, permanent_hooks, target_marked_by

# Under sglang's logger hierarchy, so sglang's logging configuration applies.
logger = logging.getLogger("sglang.srt.plugins.swa_plugin")

# Final statuses, one per fix.
APPLIED = "applied"
NOT_NEEDED = "not needed"
NOT_APPLICABLE = "not applicable"
DISABLED = "disabled"
SKIPPED = "skipped"
UNKNOWN = "unknown"
ERROR = "error"
PROBLEMS = (SKIPPED, UNKNOWN, ERROR)  # a selected fix that is needed/undecided but not installed

STRICT_GATE_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.__init__"


class StrictModeError(RuntimeError):
    """Raised at model-runner construction when strict mode finds a problem."""


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

    def in_effect(self) -> bool:
        """True when every installed target really carries this fix's hook now."""
        if self.status != APPLIED:
            return False
        return all(target_marked_by(t) == self.name for t in self.installed_targets)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["in_effect"] = self.in_effect()
        return d


# ---------------------------------------------------------------------------- fixes

BUILTIN_MODULES = (
    "sglang_swa_plugin.hooks.trtllm_swa_pool",
    "sglang_swa_plugin.hooks.fa3_spec_translate",
    "sglang_swa_plugin.hooks.frozen_kv_views",
    "sglang_swa_plugin.hooks.trtllm_extend_routing",
    "sglang_swa_plugin.hooks.trtllm_xqa_spec_decode",
    "sglang_swa_plugin.hooks.swa_index_guard",
)


def load_fixes() -> "List[tuple[Fix, str]]":
    """Built-in fixes plus third-party fixes from the ``sglang_swa_plugin.fixes``
    entry-point group, as (fix, source). A broken third-party module is reported
    and skipped; it never stops the others."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(FixSpecs)
    sources: Dict[int, str] = {}
    for modname in BUILTIN_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name == modname:
                continue  # not written yet in this build
            raise
        pm.register(mod, name=modname)
        sources[id(mod)] = "builtin"
    for ep in entry_points(group=FIXES_ENTRY_POINT_GROUP):
        try:
            mod = ep.load()
            if pm.is_registered(mod):
                continue
            pm.register(mod, name=f"entry point {ep.name}")
            sources[id(mod)] = f"entry point {ep.name} ({ep.value})"
        except Exception as e:  # noqa: BLE001 - a broken third party must not break us
            logger.warning("sglang-swa-plugin: could not load third-party fix %s (%s): %s", ep.name, ep.value, e)
    out: List[tuple] = []
    names = set()
    for impl in pm.hook.sglang_swa_plugin_fixes.get_hookimpls():
        try:
            fixes = impl.function() or ()
        except Exception as e:  # noqa: BLE001
            logger.warning("sglang-swa-plugin: %s failed to list its fixes: %s", impl.plugin_name, e)
            continue
        for fix in fixes:
            if not fix.name or fix.name in names:
                logger.warning("sglang-swa-plugin: ignoring fix with empty or duplicate name %r from %s", fix.name, impl.plugin_name)
                continue
            names.add(fix.name)
            out.append((fix, sources.get(id(impl.plugin), "builtin")))
    # Built-in fixes first, in BUILTIN_MODULES order; pluggy calls last-registered first.
    order = {m: i for i, m in enumerate(BUILTIN_MODULES)}
    out.sort(key=lambda fs: (fs[1] != "builtin", order.get(type(fs[0]).__module__, 99), fs[0].name))
    return out


# ---------------------------------------------------------------------------- deciding


def _record(fix: Fix, source: str, status: str, reason: str, selected: bool = True) -> FixRecord:
    return FixRecord(
        name=fix.name,
        summary=fix.summary,
        upstream_prs=list(fix.upstream_prs),
        targets=list(fix.targets),
        status=status,
        reason=reason,
        source=source,
        selected=selected,
    )


def safe_detect(fix: Fix) -> Detection:
    try:
        det = fix.detect()
    except TargetMissing as e:
        return Detection(Verdict.UNKNOWN, f"target moved: {e.target}")
    except Exception as e:  # noqa: BLE001
        return Detection.unknown(f"detection failed: {type(e).__name__}: {e}")
    if not isinstance(det, Detection):
        return Detection.unknown(f"detect() returned {det!r}")
    return det


def decide(fix: Fix, source: str, cfg: _config.Config, hooks_factory) -> FixRecord:
    """Decide one fix and, when it is needed, install it with ``hooks_factory(name)``."""
    if cfg.errors:
        return _record(fix, source, DISABLED, "invalid configuration: " + "; ".join(cfg.errors))
    if not cfg.enabled:
        return _record(fix, source, DISABLED, f"{_config.ENABLE}={cfg.raw.get(_config.ENABLE)}", False)
    if fix.opt_in and not getattr(cfg, fix.opt_in, False):
        return _record(fix, source, DISABLED, f"opt-in: {_config.opt_in_variable(fix.opt_in)} is off", False)
    if not cfg.selected(fix.name):
        return _record(fix, source, DISABLED, f"not selected by {_config.FIXES}={cfg.raw.get(_config.FIXES)}", False)
    already = [t for t in fix.targets if target_marked_by(t) == fix.name]
    if already and len(already) == len(fix.targets):
        rec = _record(fix, source, APPLIED, "already installed in this process")
        rec.installed_targets = already
        return rec
    det = safe_detect(fix)
    if det.verdict is Verdict.NOT_NEEDED:
        return _record(fix, source, NOT_NEEDED, det.reason)
    if det.verdict is Verdict.NOT_APPLICABLE:
        return _record(fix, source, NOT_APPLICABLE, det.reason)
    if det.verdict is Verdict.UNKNOWN:
        status = SKIPPED if det.reason.startswith("target moved") else UNKNOWN
        return _record(fix, source, status, det.reason)
    hooks = hooks_factory(fix.name)
    try:
        for t in fix.targets:
            split_target(t)
        fix.install(hooks)
    except TargetMissing as e:
        if isinstance(hooks, DirectHooks):
            hooks.undo()
        return _record(fix, source, SKIPPED, f"target moved: {e.target}")
    except Exception as e:  # noqa: BLE001
        if isinstance(hooks, DirectHooks):
            hooks.undo()
        return _record(fix, source, ERROR, f"install failed: {type(e).__name__}: {e}")
    rec = _record(fix, source, APPLIED, det.reason)
    rec.via = hooks.via
    rec.installed_targets = list(hooks.installed) or [t for t in fix.targets if target_marked_by(t) == fix.name]
    return rec


def _ensure_visible() -> None:
    """sglang's plugin loader runs before sglang configures logging (first thing in the
    scheduler process): with no handler anywhere, INFO lines would be dropped. Then give our
    logger its own stderr handler in sglang's format."""
    if logger.hasHandlers():
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def log_record(rec: FixRecord) -> None:
    prs = ", ".join(rec.upstream_prs)
    msg = "sglang-swa-plugin: fix %s: %s (%s)%s"
    args = (rec.name, rec.status, rec.reason, f" [upstream {prs}]" if prs else "")
    if rec.status in PROBLEMS:
        logger.warning(msg, *args)
    else:
        logger.info(msg, *args)


# ---------------------------------------------------------------------------- state


@dataclass
class _State:
    registered: bool = False
    loaded_via: Optional[str] = None
    config: Optional[_config.Config] = None
    records: Dict[str, FixRecord] = field(default_factory=dict)
    strict_problems: List[str] = field(default_factory=list)


STATE = _State()


def _strict_problems(cfg: _config.Config, records: Sequence[FixRecord]) -> List[str]:
    out = [f"invalid configuration: {e}" for e in cfg.errors]
    out += [f"fix {r.name}: {r.status} ({r.reason})" for r in records if r.selected and r.status in PROBLEMS]
    return out


def _strict_gate(original, *args, **kwargs):
    problems = list(STATE.strict_problems)
    problems += [
        f"fix {r.name}: hook registered but not in effect on {', '.join(r.installed_targets)}"
        for r in STATE.records.values()
        if r.status == APPLIED and not r.in_effect()
    ]
    if problems:
        raise StrictModeError(
            f"sglang-swa-plugin strict mode ({_config.STRICT}=1) stops start-up: " + "; ".join(problems)
        )
    return original(*args, **kwargs)


def _install_strict_gate() -> None:
    mark(_strict_gate, "strict_gate")
    try:
        permanent_hooks("strict_gate").around(STRICT_GATE_TARGET, _strict_gate)
    except Exception as e:  # noqa: BLE001
        logger.error("sglang-swa-plugin: strict mode could not install its start-up check on %s: %s", STRICT_GATE_TARGET, e)


def register(loaded_via: str = "entry point") -> None:
    """Entry point for sglang's plugin loader. Idempotent; never raises."""
    try:
        _register(loaded_via)
    except Exception:  # noqa: BLE001 - never break a server start from here
        logger.exception("sglang-swa-plugin: unexpected error while registering; nothing more is installed")


def _register(loaded_via: str) -> None:
    if STATE.registered:
        return
    STATE.registered = True
    STATE.loaded_via = loaded_via
    _ensure_visible()
    fixes = load_fixes()
    cfg = STATE.config = _config.get().checked_against([f.name for f, _ in fixes])
    for err in cfg.errors:
        logger.error("sglang-swa-plugin: %s; installing nothing", err)
    for fix, source in fixes:
        rec = decide(fix, source, cfg, permanent_hooks)
        STATE.records[rec.name] = rec
        log_record(rec)
    if cfg.strict:
        STATE.strict_problems = _strict_problems(cfg, STATE.records.values())
        _install_strict_gate()
    registry, _ = hook_registry()
    if registry is not None and not _inside_load_plugins():
        registry.apply_hooks()  # nobody else will apply them in this process


def _inside_load_plugins() -> bool:
    try:
        from sglang.srt.plugins.hook_registry import _current_plugin_source
    except Exception:
        return False
    return _current_plugin_source.get() is not None


def status() -> dict:
    """What actually took effect in this process."""
    cfg = STATE.config or _config.get()
    return {
        "registered": STATE.registered,
        "loaded_via": STATE.loaded_via,
        "config": cfg.as_dict(),
        "fixes": {name: rec.as_dict() for name, rec in STATE.records.items()},
    }


@contextlib.contextmanager
def temporarily_installed(*fixes: Fix) -> Iterator[List[DirectHooks]]:
    """Install fixes directly for the duration of the block, then undo (``check``, tests)."""
    done: List[DirectHooks] = []
    try:
        for fix in fixes:
            hooks = DirectHooks(fix.name)
            done.append(hooks)
            fix.install(hooks)
        yield done
    finally:
        for hooks in reversed(done):
            hooks.undo()


def find_fix(name: str) -> Fix:
    for fix, _ in load_fixes():
        if fix.name == name:
            return fix
    raise KeyError(name)
