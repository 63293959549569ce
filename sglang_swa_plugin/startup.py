"""What ``register()`` does in a process: decide and install every fix, have the hooks
applied, verify that they are in effect, then log one line per fix (and, in strict mode,
arm the start-up check). Never raises into sglang."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from . import config as _config
from .core import APPLIED, PROBLEMS, FixRecord, broken_records, checked_settings, decide, load_fixes, log_record
from .log import emit, hook_configure_logger, logger
from .patching import hook_registry, mark, permanent_hooks

STRICT_GATE_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.__init__"
STRICT_GATE = "strict_gate"


class StrictModeError(RuntimeError):
    """Raised at model-runner construction when strict mode finds a problem."""


@dataclass
class State:
    """What ``register()`` did in this process."""

    registered: bool = False
    loaded_via: Optional[str] = None
    config: Optional[_config.Config] = None
    records: Dict[str, FixRecord] = field(default_factory=dict)
    strict_problems: List[str] = field(default_factory=list)
    finished: bool = False


STATE = State()


def _strict_gate(original, *args, **kwargs):
    problems = list(STATE.strict_problems)
    problems += [
        f"fix {r.name}: hook not in effect on {', '.join(r.installed_targets)}"
        for r in STATE.records.values()
        if r.status == APPLIED and not r.in_effect()
    ]
    if problems:
        raise StrictModeError(
            f"sglang-swa-plugin strict mode ({_config.STRICT}=1) stops start-up: " + "; ".join(problems)
        )
    return original(*args, **kwargs)


mark(_strict_gate, STRICT_GATE)


def register(loaded_via: str = "entry point") -> None:
    """Idempotent; never raises."""
    try:
        _register(loaded_via)
    except Exception:  # noqa: BLE001 - never break a server start from here
        logger.exception("sglang-swa-plugin: unexpected error while registering; nothing more is installed")


def _register(loaded_via: str) -> None:
    if STATE.registered:
        return
    STATE.registered = True
    STATE.loaded_via = loaded_via
    cfg = _config.get()
    fixes = load_fixes()
    if cfg.enabled:
        cfg = checked_settings(cfg, fixes)
    STATE.config = cfg
    for err in cfg.errors:
        emit(logging.ERROR, "sglang-swa-plugin: %s", err)
    for fix, source in fixes:
        rec = decide(fix, source, cfg, permanent_hooks)
        STATE.records[rec.name] = rec
    for rec in broken_records() if cfg.enabled else ():
        STATE.records[rec.name] = rec
    hook_configure_logger()
    if not cfg.enabled:  # imports nothing of sglang, installs nothing
        return _finish()
    gate = _install_strict_gate() if cfg.strict else None
    registry, _ = hook_registry()
    if registry is None:
        return _finish(gate)
    if _inside_load_plugins():
        _after_apply_hooks(registry, lambda: _finish(gate))  # load_plugins() applies them next
    else:
        registry.apply_hooks()  # nobody else will apply them in this process
        _finish(gate)


def _install_strict_gate() -> Optional[FixRecord]:
    """The start-up check, as a record of its own so that it is verified like a fix."""
    rec = FixRecord(STRICT_GATE, "", [], [STRICT_GATE_TARGET], APPLIED, "")
    try:
        hooks = permanent_hooks(STRICT_GATE)
        hooks.around(STRICT_GATE_TARGET, _strict_gate)
        rec.installed_targets, rec.originals = list(hooks.installed), dict(hooks.originals)
    except Exception as e:  # noqa: BLE001
        rec.status, rec.reason = "error", f"{type(e).__name__}: {e}"
    return rec


def _after_apply_hooks(registry, then) -> None:
    """Run ``then()`` once, right after sglang's ``HookRegistry.apply_hooks()`` (which
    ``load_plugins()`` calls after every plugin's ``register()``); then step aside."""
    raw = registry.__dict__.get("apply_hooks")
    if not isinstance(raw, classmethod):  # not sglang's loader as we know it: verify now
        return then()

    def apply_then_verify(cls, *args, **kwargs):
        try:
            return raw.__func__(cls, *args, **kwargs)
        finally:
            if registry.__dict__.get("apply_hooks") is ours:
                registry.apply_hooks = raw
            then()

    ours = classmethod(mark(apply_then_verify, "verify"))
    registry.apply_hooks = ours


def _finish(gate: Optional[FixRecord] = None) -> None:
    try:
        if STATE.finished:
            return
        STATE.finished = True
        for rec in STATE.records.values():
            rec.verify()
            log_record(rec)
        cfg = STATE.config
        if cfg is not None and cfg.strict and cfg.enabled:
            _arm_strict(cfg, gate)
    except Exception:  # noqa: BLE001
        logger.exception("sglang-swa-plugin: unexpected error while verifying the hooks")


def _arm_strict(cfg: _config.Config, gate: Optional[FixRecord]) -> None:
    STATE.strict_problems = [f"invalid setting: {e}" for e in cfg.errors]
    STATE.strict_problems += [f"fix {r.name}: {r.status} ({r.reason})"
                              for r in STATE.records.values() if r.selected and r.status in PROBLEMS]
    if gate is not None:
        gate.verify()
    if gate is None or gate.status != APPLIED:
        emit(logging.ERROR, "sglang-swa-plugin: strict mode could not install its start-up check on %s (%s)",
             STRICT_GATE_TARGET, gate.reason if gate else "not installed")


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
