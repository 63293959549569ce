"""Installing hooks: through sglang's HookRegistry where it exists (sglang >= 0.5.11),
by direct patching where it does not, or temporarily (``check``, tests).

Every wrapper we create carries ``__sglang_swa_plugin__`` (the fix name), so that a
target is never wrapped twice by us and ``status()`` can tell what is really in effect.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any, Callable, List, Optional, Tuple

from .fix import Hooks, TargetMissing, split_target

MARK = "__sglang_swa_plugin__"


def mark(obj: Any, fix_name: str) -> Any:
    try:
        setattr(obj, MARK, fix_name)
    except (AttributeError, TypeError):
        pass
    return obj


def hook_registry():
    """sglang's HookRegistry and HookType, or (None, None) where sglang has none."""
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except Exception:
        return None, None
    return HookRegistry, HookType


def _raw(owner: Any, attr: str) -> Any:
    """The attribute as stored (keeps staticmethod/classmethod wrappers)."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in klass.__dict__:
                return klass.__dict__[attr]
    return getattr(owner, attr)


def marked_by(obj: Any) -> Optional[str]:
    """Name of the fix whose wrapper ``obj`` is (looking through wrapper chains)."""
    seen = 0
    while obj is not None and seen < 16:
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        name = getattr(obj, MARK, None) if not isinstance(obj, type) else obj.__dict__.get(MARK)
        if name:
            return name
        # HookRegistry's wrappers keep our hook in their closure.
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            n = getattr(v, MARK, None) if not isinstance(v, type) else v.__dict__.get(MARK)
            if n and callable(v):
                return n
        obj = getattr(obj, "__wrapped__", None)
        seen += 1
    return None


def target_marked_by(target: str) -> Optional[str]:
    try:
        owner, attr = split_target(target)
    except TargetMissing:
        return None
    return marked_by(_raw(owner, attr))


def _around_wrapper(original: Callable, fn: Callable, fix_name: str) -> Callable:
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return fn(original, *args, **kwargs)

    wrapper.__wrapped__ = original
    return mark(wrapper, fix_name)


class DirectHooks(Hooks):
    """Patch targets now, the way HookRegistry does (module attribute plus every
    ``from X import Y`` copy in sys.modules), remembering how to undo it."""

    via = "direct"

    def __init__(self, fix_name: str):
        self.fix_name = fix_name
        self._undo: List[Tuple[Any, str, Any, bool]] = []
        self.installed: List[str] = []

    def _set(self, target: str, make: Callable[[Any], Any]) -> None:
        owner, attr = split_target(target)
        raw = _raw(owner, attr)
        own = isinstance(owner, type) and attr in owner.__dict__ or not isinstance(owner, type)
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        original = raw.__func__ if kind else getattr(owner, attr)
        new = make(original)
        setattr(owner, attr, kind(new) if kind else new)
        self._undo.append((owner, attr, raw, own))
        # Rebind stale module-level copies (from X import Y), as HookRegistry does.
        if isinstance(original, (type, types.FunctionType)):
            for mod in list(sys.modules.values()):
                if not isinstance(mod, types.ModuleType) or mod is owner:
                    continue
                try:
                    items = list(vars(mod).items())
                except TypeError:
                    continue
                for name, value in items:
                    if value is original:
                        setattr(mod, name, new)
                        self._undo.append((mod, name, original, True))
        self.installed.append(target)

    def around(self, target: str, fn: Callable[..., Any]) -> None:
        self._set(target, lambda original: _around_wrapper(original, fn, self.fix_name))

    def replace(self, target: str, obj: Any) -> None:
        self._set(target, lambda original: mark(obj, self.fix_name))

    def undo(self) -> None:
        for owner, attr, value, own in reversed(self._undo):
            if own:
                setattr(owner, attr, value)
            else:
                delattr(owner, attr)  # it was inherited: drop our override
        self._undo.clear()
        self.installed.clear()


class RegistryHooks(Hooks):
    """Register on sglang's HookRegistry; ``load_plugins()`` applies them right after
    every plugin's ``register()`` ran (or we call ``apply_hooks()`` ourselves when we
    were not loaded by sglang)."""

    via = "HookRegistry"

    def __init__(self, fix_name: str):
        self.fix_name = fix_name
        self.registry, self.hook_type = hook_registry()
        self.installed: List[str] = []

    def _register(self, target: str, hook: Any, kind: Any) -> None:
        split_target(target)  # raises TargetMissing now rather than failing silently later
        mark(hook, self.fix_name)
        existing = [h for _, h, _ in self.registry._hooks.get(target, ())]
        if any(getattr(h, MARK, None) == self.fix_name for h in existing):
            return  # already registered by an earlier register() in this process
        if target in self.registry._patched:
            raise TargetMissing(target, "already patched by HookRegistry before this fix registered")
        self.registry.register(target, hook, kind)
        self.installed.append(target)

    def around(self, target: str, fn: Callable[..., Any]) -> None:
        self._register(target, fn, self.hook_type.AROUND)

    def replace(self, target: str, obj: Any) -> None:
        self._register(target, obj, self.hook_type.REPLACE)


def permanent_hooks(fix_name: str) -> Hooks:
    registry, _ = hook_registry()
    return RegistryHooks(fix_name) if registry is not None else DirectHooks(fix_name)
