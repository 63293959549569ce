"""Installing hooks: through sglang's HookRegistry where it exists (sglang >= 0.5.11),
by direct patching where it does not, or temporarily (``check``, tests).

Every wrapper we create carries ``__sglang_swa_plugin__`` (the fix name), so that a
target is never wrapped twice by us and ``status()`` can tell what is really in effect.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from .fix import Hooks, TargetMissing, split_target

MARK = "__sglang_swa_plugin__"
# our one AROUND hook per target on sglang's HookRegistry -> its links [(fix name, fn)], in registration order
CHAINS: Dict[Callable[..., Any], List[Tuple[str, Callable[..., Any]]]] = {}


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


def stored_attribute(owner: Any, attr: str) -> Any:
    """The attribute as stored (keeps staticmethod/classmethod wrappers)."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in klass.__dict__:
                return klass.__dict__[attr]
    return getattr(owner, attr)


def _own_mark(obj: Any) -> Optional[str]:
    return getattr(obj, MARK, None) if not isinstance(obj, type) else obj.__dict__.get(MARK)


def level_marks(obj: Any) -> List[str]:
    """Fixes whose wrapper ``obj`` itself is (its own mark, or, for HookRegistry's wrappers,
    our hook kept in its closure)."""
    out = [name] if (name := _own_mark(obj)) else []
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if callable(v):
            out += hook_names(v)
    return out


def hook_names(hook: Any) -> List[str]:
    """The fixes a hook we registered carries, outermost first (a chain: several)."""
    if isinstance(hook, type):
        return [name] if (name := _own_mark(hook)) else []
    links = _links(hook)
    if links is not None:
        return [name for name, _ in reversed(links)]
    return [name] if (name := getattr(hook, MARK, None)) else []


def _links(hook: Any) -> Optional[List[Tuple[str, Callable[..., Any]]]]:
    """The links of ``hook`` where it is one of our chains, else None."""
    return CHAINS.get(hook) if isinstance(hook, types.FunctionType) else None


def marks(obj: Any) -> List[str]:
    """Names of the fixes whose wrappers are along ``obj``'s wrapper chain, outermost first."""
    out: List[str] = []
    seen = 0
    while obj is not None and seen < 16:
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        out += level_marks(obj)
        obj = getattr(obj, "__wrapped__", None)
        seen += 1
    return list(dict.fromkeys(out))


def without_wrappers_of(fn: Any, fix_name: str) -> Any:
    """``fn`` with the outer wrappers that ``fix_name`` installed peeled off: the code under
    our hook, which detection must judge."""
    while getattr(fn, "__wrapped__", None) is not None and fix_name in level_marks(fn):
        fn = fn.__wrapped__
    return fn


def marked_by(obj: Any) -> Optional[str]:
    """Name of the (outermost) fix whose wrapper ``obj`` is (looking through wrapper chains)."""
    found = marks(obj)
    return found[0] if found else None


def target_marks(target: str) -> List[str]:
    """Our fixes whose wrappers the target carries now ([] where it cannot be resolved)."""
    try:
        owner, attr = split_target(target)
    except TargetMissing:
        return []
    return marks(stored_attribute(owner, attr))


def target_marked_by(target: str) -> Optional[str]:
    found = target_marks(target)
    return found[0] if found else None


def original_at(target: str) -> Any:
    """What the target holds before we hook it (the function behind a static/class method)."""
    owner, attr = split_target(target)
    raw = stored_attribute(owner, attr)
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw


def module_bindings() -> Iterator[Tuple[str, types.ModuleType, str, Any]]:
    """(module name, module, attribute name, value) of every loaded module's globals."""
    for modname, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for name, value in items:
            yield modname, mod, name, value


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
        self.originals: Dict[str, Any] = {}

    def _set(self, target: str, make: Callable[[Any], Any]) -> None:
        owner, attr = split_target(target)
        raw = stored_attribute(owner, attr)
        if self.fix_name in marks(raw):
            return  # in effect already (a second wrapper would apply the fix twice)
        own = isinstance(owner, type) and attr in owner.__dict__ or not isinstance(owner, type)
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        original = raw.__func__ if kind else getattr(owner, attr)
        new = make(original)
        self.originals.setdefault(target, original)
        setattr(owner, attr, kind(new) if kind else new)
        self._undo.append((owner, attr, raw, own))
        # Rebind stale module-level copies (from X import Y), as HookRegistry does. Only a
        # module-level function or class has such copies; a method lives on its class alone,
        # and scanning every loaded module's globals per target costs tens of milliseconds.
        if isinstance(owner, types.ModuleType) and isinstance(original, (type, types.FunctionType)):
            for _, mod, name, value in module_bindings():
                if value is original and mod is not owner:
                    setattr(mod, name, new)
                    self._undo.append((mod, name, original, True))
        self.installed.append(target)

    def around(self, target: str, fn: Callable[..., Any]) -> None:
        def make(original):
            if isinstance(original, type):  # as HookRegistry: wrapping a class breaks isinstance
                raise TypeError(f"{target} is a class: only replace() can hook it")
            return _around_wrapper(original, fn, self.fix_name)

        self._set(target, make)

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
        self.originals.clear()


def _chain(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Our one AROUND hook of a target on sglang's HookRegistry: every fix's ``fn`` on it
    (``CHAINS[chain]``: ``[(fix name, fn)]``, more appended while HookRegistry has not applied it),
    nested as HookRegistry nests hooks, the first registered innermost. One registration per
    target: sglang warns at every start about a target with several AROUND hooks."""
    links = [(name, fn)]
    nested: List[Any] = [None, None]  # (original, the links nested around it): built on the first call

    def chain(original, *args, **kwargs):
        if nested[0] is not original:  # HookRegistry hands every call the same original
            call = original
            for _, link in links:
                call = functools.partial(link, call)
            nested[:] = [original, call]
        return nested[1](*args, **kwargs)

    CHAINS[chain] = links
    return mark(chain, name)


class RegistryHooks(Hooks):
    """Register on sglang's HookRegistry; ``load_plugins()`` applies them right after
    every plugin's ``register()`` ran (or we call ``apply_hooks()`` ourselves when we
    were not loaded by sglang). A target several fixes hook around gets one registration,
    their chain."""

    via = "HookRegistry"

    def __init__(self, fix_name: str):
        self.fix_name = fix_name
        self.registry, self.hook_type = hook_registry()
        self.installed: List[str] = []
        self.originals: Dict[str, Any] = {}

    def _register(self, target: str, hook: Any, kind: Any) -> None:
        split_target(target)  # raises TargetMissing now rather than failing silently later
        mark(hook, self.fix_name)
        existing = [h for _, h, _ in self.registry._hooks.get(target, ())]
        if any(self.fix_name in hook_names(h) for h in existing):
            return  # already registered by an earlier register() in this process
        if target in self.registry._patched:
            raise TargetMissing(target, "already patched by HookRegistry before this fix registered")
        self.originals[target] = original_at(target)
        links = next((found for h in existing if (found := _links(h)) is not None), None)
        if kind is self.hook_type.AROUND and links is not None:
            links.append((self.fix_name, hook))
        else:
            self.registry.register(target, _chain(self.fix_name, hook) if kind is self.hook_type.AROUND else hook, kind)
        self.installed.append(target)

    def around(self, target: str, fn: Callable[..., Any]) -> None:
        self._register(target, fn, self.hook_type.AROUND)

    def replace(self, target: str, obj: Any) -> None:
        self._register(target, obj, self.hook_type.REPLACE)


def permanent_hooks(fix_name: str) -> Hooks:
    registry, _ = hook_registry()
    return RegistryHooks(fix_name) if registry is not None else DirectHooks(fix_name)
