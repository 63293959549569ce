"""What a fix is: the contract every module in ``sglang_swa_plugin.hooks`` (and every
third-party fix) implements, plus the pluggy hook specification that collects them.

A fix module holds what runs in a server process, nothing else: its record (docstring),
constants, the hook(s), the detection and ``FIX`` (a :class:`Fix` instance). Detection
returns the plan, install uses exactly that plan::

    from sglang_swa_plugin.fix import Fix, Detection, around, argument, hookimpl

    TARGET = "sglang.srt.layers.attention.foo.FooBackend.forward"

    def _hook(original, self, *args, **kwargs):
        batch = argument(original, "forward_batch", args, kwargs)
        ...

    class MyFix(Fix):
        name = "my_fix"
        summary = "one line"
        upstream_prs = ("#12345",)
        targets = (TARGET,)  # every target the fix may hook, in any sglang form
        check_module = "my_package.check_my_fix"  # optional: its CPU scenario

        def detect(self) -> Detection:
            return Detection.needed("why", around(TARGET, _hook))

    FIX = MyFix()

    @hookimpl  # a third-party module; a built-in one (in ``hooks/``) is found by its ``FIX``
    def sglang_swa_plugin_fixes():
        return [FIX]

The fix's CPU reproduction (used by ``sglang-swa-plugin check`` and the tests) lives in a
separate module that a server process never imports, named by ``check_module``: it defines
``scenario()`` (whose docstring's first sentence is shown by ``check``) and ``reproduce() ->
bool``. The built-in ones are ``sglang_swa_plugin.check.<fix name>``. A fix may instead
override :meth:`Fix.reproduce`.

Third-party packages register such a module under the entry-point group
``sglang_swa_plugin.fixes``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
import functools
import inspect
from typing import Any, Callable, Dict, FrozenSet, Mapping, Optional, Sequence, Tuple

import pluggy

PROJECT = "sglang_swa_plugin"
FIXES_ENTRY_POINT_GROUP = "sglang_swa_plugin.fixes"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class FixSpecs:
    """pluggy hook specifications."""

    @hookspec
    def sglang_swa_plugin_fixes(self) -> Sequence["Fix"]:
        """Return the fixes this plugin module provides."""


class Verdict(str, enum.Enum):
    NEEDED = "needed"
    NOT_NEEDED = "not needed"  # the installed sglang already has the fix
    NOT_APPLICABLE = "not applicable"  # the feature the fix is about is absent
    UNKNOWN = "unknown"  # the installed code has a shape the fix does not recognise
    TARGET_MOVED = "target moved"  # something the fix hooks or reads is gone from where it was


@dataclass(frozen=True)
class Hook:
    """One entry of a plan: ``target`` (dotted path) gets ``fn``. ``kind`` "around":
    ``fn(original, *args, **kwargs)`` replaces the target and decides whether and how to call
    ``original``; "replace": the target is replaced by ``fn`` (a function, or a subclass of the
    target class)."""

    target: str
    fn: Callable[..., Any]
    kind: str = "around"


def around(target: str, fn: Callable[..., Any]) -> Hook:
    return Hook(target, fn, "around")


def replace(target: str, obj: Any) -> Hook:
    return Hook(target, obj, "replace")


@dataclass(frozen=True)
class Detection:
    """What the installed sglang needs. ``plan``: the hooks that make it right, in install
    order; ``decide`` installs exactly these where the verdict is NEEDED. A NOT_NEEDED
    detection may carry the plan too (what a forced install puts in: ``check``, tests)."""

    verdict: Verdict
    reason: str
    plan: Tuple[Hook, ...] = ()

    @property
    def targets(self) -> Tuple[str, ...]:
        """The targets the plan hooks."""
        return tuple(dict.fromkeys(h.target for h in self.plan))

    def with_plan(self, *plan: Hook) -> "Detection":
        """This detection carrying ``plan`` where the installed code has the fix's form
        (NEEDED, NOT_NEEDED); a fix whose hooks are the same on every form uses it."""
        if self.verdict in (Verdict.NEEDED, Verdict.NOT_NEEDED):
            return Detection(self.verdict, self.reason, plan)
        return self

    @classmethod
    def needed(cls, reason: str, *plan: Hook) -> "Detection":
        return cls(Verdict.NEEDED, reason, plan)

    @classmethod
    def not_needed(cls, reason: str, *plan: Hook) -> "Detection":
        return cls(Verdict.NOT_NEEDED, reason, plan)

    @classmethod
    def target_moved(cls, reason: str) -> "Detection":
        return cls(Verdict.TARGET_MOVED, reason)

    @classmethod
    def not_applicable(cls, reason: str) -> "Detection":
        return cls(Verdict.NOT_APPLICABLE, reason)

    @classmethod
    def unknown(cls, reason: str) -> "Detection":
        return cls(Verdict.UNKNOWN, reason)


class TargetMissing(LookupError):
    """A hook target named by a fix does not exist in the installed sglang."""

    def __init__(self, target: str, why: str = "not found", moved: bool = True):
        super().__init__(f"{target}: {why}")
        self.target = target
        self.why = why
        self.moved = moved  # False: its module exists but fails to import

    def detection(self) -> "Detection":
        """A target that is gone has moved (TARGET_MOVED); one whose module fails to import
        is UNKNOWN."""
        if self.moved:
            return Detection.target_moved(f"target moved: {self.target}")
        return Detection.unknown(f"{self.target}: {self.why}")


class ScenarioUnavailable(RuntimeError):
    """The fix's CPU reproduction cannot run here (feature absent, missing package...)."""


class Hooks:
    """What ``Fix.install`` receives: installs hooks on dotted targets.

    ``around(target, fn)``: ``fn(original, *args, **kwargs)`` replaces the target
    function or method and decides whether and how to call ``original``.
    ``replace(target, obj)``: the target is replaced by ``obj`` (a function, or a class
    that subclasses the target class).
    Implementations: sglang's HookRegistry (sglang >= 0.5.11), direct patching (older
    sglang), and a temporary installer that undoes itself (``check`` and tests).
    """

    def around(self, target: str, fn: Callable[..., Any]) -> None:  # pragma: no cover
        raise NotImplementedError

    def replace(self, target: str, obj: Any) -> None:  # pragma: no cover
        raise NotImplementedError

    def install(self, plan: Sequence[Hook]) -> None:
        """Every hook of ``plan``, in order."""
        for hook in plan:
            getattr(self, hook.kind)(hook.target, hook.fn)


class Fix:
    """Base class of a fix. Subclasses set the class attributes and implement ``detect``
    (returning the plan); ``reproduce`` is optional (used by ``check``)."""

    name: str = ""
    summary: str = ""
    upstream_prs: Sequence[str] = ()
    # Dotted paths of everything the fix may hook, in every sglang form it knows (a plan
    # hooks some of them: ``Detection.targets``).
    targets: Sequence[str] = ()
    # Leading parameter names each target must have for the fix's hook to be correct
    # (checked by the per-version contract tests where the fix is needed).
    target_params: Mapping[str, Sequence[str]] = {}
    # Name of a boolean Config field that must be on for this fix to be considered at all
    # (e.g. "guard" for the opt-in index guard); None: always considered.
    opt_in: Optional[str] = None
    # Paths of the fix not yet run on a GPU against the model: {name: what it covers}; each is
    # off (the path left as sglang runs it) unless SGLANG_SWA_PLUGIN_PREVIEW names it.
    previews: Mapping[str, str] = {}
    # The previews turned on where the fix was last decided (``core.decide``); its hooks read it.
    previews_on: FrozenSet[str] = frozenset()
    # Names of the fixes whose hooks this fix's hooks wrap where both hook one target: they go
    # in first (core orders the fixes by it; a built-in sharing a target must declare it).
    wraps: Sequence[str] = ()
    # Dotted name of the module with the fix's CPU scenario (``scenario()``, ``reproduce()``);
    # imported only by ``reproduce`` (``check``, tests), never at start-up.
    check_module: Optional[str] = None
    # One line: what ``reproduce`` builds and checks (shown by ``check``); default: the first
    # sentence of the check module's ``scenario()`` docstring.
    scenario_summary: str = ""

    def detect(self) -> Detection:
        """Decide from the installed code's structure or behaviour (never from a
        version string) whether this sglang needs the fix, and with which hooks (the plan)."""
        raise NotImplementedError

    def reproduce(self) -> bool:
        """Run the fix's CPU reproduction on the installed sglang's real classes once
        and return True when the bug shows: ``reproduce()`` of ``check_module``. ``check``
        calls it without and then with the fix installed. Raise ScenarioUnavailable where it
        cannot run."""
        if not self.check_module:
            raise ScenarioUnavailable("no CPU scenario for this fix yet")
        import importlib

        return bool(importlib.import_module(self.check_module).reproduce())

    def has_scenario(self) -> bool:
        return bool(self.check_module) or type(self).reproduce is not Fix.reproduce

    def scenario_description(self) -> str:
        """``scenario_summary``, else the first sentence of the ``scenario()`` docstring of the
        check module (or of the fix's own module), as one plain line ("" where there is no scenario)."""
        if not self.has_scenario():
            return ""
        if self.scenario_summary:
            return self.scenario_summary
        import importlib

        scenario = getattr(importlib.import_module(self.check_module or type(self).__module__), "scenario", None)
        text = " ".join((getattr(scenario, "__doc__", None) or "").replace("``", "").split())
        return re.split(r"(?<=[.?!]) ", text)[0].rstrip(".")

    def __repr__(self) -> str:
        return f"<fix {self.name}>"


def resolve(target: str) -> Any:
    """Resolve a dotted target the way sglang's HookRegistry does, raising
    TargetMissing instead of ImportError/AttributeError."""
    import pkgutil

    try:
        return pkgutil.resolve_name(target)
    except (ImportError, AttributeError, ValueError) as e:
        raise TargetMissing(target, f"{type(e).__name__}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a module that fails to import (e.g. a CUDA-only binary)
        raise TargetMissing(target, f"cannot import: {type(e).__name__}: {e}", moved=False) from None


def split_target(target: str) -> "tuple[Any, str]":
    """(owner object, attribute name) of a dotted target."""
    owner_path, _, attr = target.rpartition(".")
    owner = resolve(owner_path)
    if not hasattr(owner, attr):
        raise TargetMissing(target, f"{owner_path} has no attribute {attr!r}")
    return owner, attr


# ---------------------------------------------------------------- a hooked call's arguments


@functools.lru_cache(maxsize=None)
def _parameters(fn: Callable[..., Any], method: bool) -> "tuple[Dict[str, int], Dict[str, Any]]":
    """(position, default) of each parameter of ``fn``; positions after ``self`` for a method."""
    params = list(inspect.signature(fn).parameters.values())[1 if method else 0:]
    positions = {p.name: i for i, p in enumerate(params) if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)}
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    return positions, defaults


def argument(original: Callable[..., Any], name: str, args: Sequence[Any], kwargs: Mapping[str, Any],
             method: bool = True) -> Any:
    """Argument ``name`` of a hooked method call ``original(self, *args, **kwargs)`` (its
    default where the call leaves it out): the one way a hook reads its call's arguments.
    ``method=False``: a function's call ``original(*args, **kwargs)``."""
    positions, defaults = _parameters(original, method)
    i = positions.get(name)
    if i is not None and i < len(args):
        return args[i]
    return kwargs.get(name, defaults.get(name))


def arguments(original: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], *names: str) -> tuple:
    """``argument`` of each of ``names``, the signature looked up once (a per-step hook's reads)."""
    positions, defaults = _parameters(original, True)
    n = len(args)
    return tuple(args[i] if (i := positions.get(name)) is not None and i < n else kwargs.get(name, defaults.get(name))
                 for name in names)


def has_parameter(original: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(original).parameters


def with_argument(original: Callable[..., Any], name: str, value: Any, args: Sequence[Any],
                  kwargs: Mapping[str, Any], method: bool = True) -> "tuple[tuple, dict]":
    """``(args, kwargs)`` of the same call (as ``argument`` reads it) with ``name`` set to ``value``."""
    i = _parameters(original, method)[0].get(name)
    if i is not None and i < len(args):
        return (*args[:i], value, *args[i + 1:]), dict(kwargs)
    return tuple(args), {**kwargs, name: value}
