"""What a fix is: the contract every module in ``sglang_swa_plugin.hooks`` (and every
third-party fix) implements, plus the pluggy hook specification that collects them.

A fix module holds what runs in a server process, nothing else: its record (docstring),
constants, the hook(s), the detection and ``FIX`` (a :class:`Fix` instance) with a pluggy
hook implementation::

    from sglang_swa_plugin.fix import Fix, Detection, hookimpl

    TARGET = "sglang.srt.layers.attention.foo.FooBackend.forward"

    def _hook(original, self, *args, **kwargs): ...

    def classify() -> Detection:
        return Detection.needed("why")

    class MyFix(Fix):
        name = "my_fix"
        summary = "one line"
        upstream_prs = ("#12345",)
        targets = (TARGET,)
        check_module = "my_package.check_my_fix"  # optional: its CPU scenario

        def detect(self): return classify()
        def install(self, hooks): hooks.around(TARGET, _hook)

    FIX = MyFix()

    @hookimpl
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
from types import ModuleType
from typing import Any, Callable, Mapping, Optional, Sequence

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


@dataclass(frozen=True)
class Detection:
    verdict: Verdict
    reason: str

    @classmethod
    def needed(cls, reason: str) -> "Detection":
        return cls(Verdict.NEEDED, reason)

    @classmethod
    def not_needed(cls, reason: str) -> "Detection":
        return cls(Verdict.NOT_NEEDED, reason)

    @classmethod
    def not_applicable(cls, reason: str) -> "Detection":
        return cls(Verdict.NOT_APPLICABLE, reason)

    @classmethod
    def unknown(cls, reason: str) -> "Detection":
        return cls(Verdict.UNKNOWN, reason)


class TargetMissing(LookupError):
    """A hook target named by a fix does not exist in the installed sglang."""

    def __init__(self, target: str, why: str = "not found"):
        super().__init__(f"{target}: {why}")
        self.target = target
        self.why = why

    def reason(self) -> str:
        """The status reason: a target that is gone has moved; one whose module fails to
        import says so."""
        if self.why.startswith("cannot import"):
            return f"{self.target}: {self.why}"
        return f"target moved: {self.target}"


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


class Fix:
    """Base class of a fix. Subclasses set the class attributes and implement
    ``detect`` and ``install``; ``reproduce`` is optional (used by ``check``)."""

    name: str = ""
    summary: str = ""
    upstream_prs: Sequence[str] = ()
    # Dotted paths of everything the fix hooks; each must exist when the fix is needed.
    targets: Sequence[str] = ()
    # Leading parameter names each target must have for the fix's hook to be correct
    # (checked by the per-version contract tests where the fix is needed).
    target_params: Mapping[str, Sequence[str]] = {}
    # Name of a boolean Config field that must be on for this fix to be considered at all
    # (e.g. "guard" for the opt-in index guard); None: always considered.
    opt_in: Optional[str] = None
    # Dotted name of the module with the fix's CPU scenario (``scenario()``, ``reproduce()``);
    # imported only by ``reproduce`` (``check``, tests), never at start-up.
    check_module: Optional[str] = None
    # One line: what ``reproduce`` builds and checks (shown by ``check``); default: the first
    # sentence of the check module's ``scenario()`` docstring.
    scenario_summary: str = ""

    def detect(self) -> Detection:
        """Decide from the installed code's structure or behaviour (never from a
        version string) whether this sglang needs the fix."""
        raise NotImplementedError

    def install(self, hooks: Hooks) -> None:
        """Install the fix through ``hooks``. Called only when ``detect`` said NEEDED."""
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


_NOT_IMPORTED = object()


def _resolve_imported(target: str) -> Any:
    """``pkgutil.resolve_name(target)`` without its import attempts, where they cannot change
    the answer: every dotted prefix up to the longest one that is an imported module is in
    ``sys.modules`` and that longest one is a plain module (no ``__path__``). resolve_name
    would import those (found in ``sys.modules``), fail to import ``<prefix>.<next name>``
    (not a package; ~0.1 ms per failed import) and look the rest up as attributes, as here.
    Else ``_NOT_IMPORTED`` (the caller asks resolve_name)."""
    import sys

    parts = target.split(".")
    if not all(p.isidentifier() for p in parts):  # resolve_name's own format check, its ":" form
        return _NOT_IMPORTED
    for i in range(len(parts) - 1, 0, -1):
        mod = sys.modules.get(".".join(parts[:i]))
        if mod is None:
            continue
        if (not isinstance(mod, ModuleType) or hasattr(mod, "__path__")
                or getattr(getattr(mod, "__spec__", None), "_initializing", False)
                or any(not isinstance(sys.modules.get(".".join(parts[:j])), ModuleType) for j in range(1, i))):
            return _NOT_IMPORTED
        obj = mod
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    return _NOT_IMPORTED


def resolve(target: str) -> Any:
    """Resolve a dotted target the way sglang's HookRegistry does, raising
    TargetMissing instead of ImportError/AttributeError."""
    import pkgutil

    try:
        found = _resolve_imported(target)
        return found if found is not _NOT_IMPORTED else pkgutil.resolve_name(target)
    except (ImportError, AttributeError, ValueError) as e:
        raise TargetMissing(target, f"{type(e).__name__}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a module that fails to import (e.g. a CUDA-only binary)
        raise TargetMissing(target, f"cannot import: {type(e).__name__}: {e}") from None


def split_target(target: str) -> "tuple[Any, str]":
    """(owner object, attribute name) of a dotted target."""
    owner_path, _, attr = target.rpartition(".")
    owner = resolve(owner_path)
    if not hasattr(owner, attr):
        raise TargetMissing(target, f"{owner_path} has no attribute {attr!r}")
    return owner, attr


def unwrap_function(obj: Any) -> Optional[Callable[..., Any]]:
    """The plain function behind a staticmethod/classmethod/function, else None."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    return obj if callable(obj) else None
