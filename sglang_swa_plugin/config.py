"""Environment settings, read once per process. The only parser of the plugin's settings:
the runtime (``register()``), the start-up hook, ``doctor`` and ``check`` all read them here.

SGLANG_SWA_PLUGIN        on (default) | 0/false/off/no: install nothing (the start-up hook
                         stays inert too)
SGLANG_SWA_PLUGIN_FIXES  all (default) | comma list of fix names (any case); "-name" excludes
                         one; "all,-name" is every fix but one
SGLANG_SWA_PLUGIN_STRICT off (default) | 1: a selected fix that is needed but cannot be
                         installed, or a bad setting, stops the server start
SGLANG_SWA_PLUGIN_GUARD  off (default) | 1: install the SWA index guard
SGLANG_SWA_PLUGIN_PREVIEW none (default) | comma list of preview names (any case): paths of a
                         fix not yet run on a GPU against the model, off unless named here
                         (``Fix.previews`` lists each fix's)

Booleans accept 1/true/on/yes and 0/false/off/no (any case). A bad value never lowers
protection: the variable falls back to its default (plugin on, all fixes, guard off) and is
reported in one line naming it, its value and the valid values. A malformed
SGLANG_SWA_PLUGIN_STRICT counts as on (it most likely meant on).

Read elsewhere, and documented here so that this list is complete:
SGLANG_PLUGINS           sglang's own allow-list of plugin names (>= 0.5.11); unset, or
                         naming swa_plugin, lets sglang load the plugin. ``doctor`` and
                         ``check`` read it to tell whether the plugin will load.
TRITON_INTERPRET         Triton's own (1: Triton kernels run on the CPU, as in the tests);
                         ``triton_rail`` then lays out its rails with the Triton kernels on
                         CPU tensors too, as on a GPU.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

ENABLE = "SGLANG_SWA_PLUGIN"
FIXES = "SGLANG_SWA_PLUGIN_FIXES"
STRICT = "SGLANG_SWA_PLUGIN_STRICT"
GUARD = "SGLANG_SWA_PLUGIN_GUARD"
PREVIEW = "SGLANG_SWA_PLUGIN_PREVIEW"
ALL_VARS = (ENABLE, FIXES, STRICT, GUARD, PREVIEW)
SGLANG_PLUGINS = "SGLANG_PLUGINS"  # sglang's allow-list of plugins

_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}
BOOL_VALUES = "1/true/on/yes or 0/false/off/no"


@dataclass(frozen=True)
class BadSetting:
    """One variable with a value the plugin does not accept, and what it used instead."""

    var: str
    value: str
    problem: str  # e.g. "is not a boolean"
    valid: str
    used: str  # what the plugin uses instead, e.g. "the default (off)"

    def message(self, strict: bool) -> str:
        msg = f"{self.var}={self.value!r} {self.problem}; valid values: {self.valid}; using {self.used}"
        if strict:
            msg += f"; strict mode ({STRICT}) stops start-up"
        return msg


@dataclass(frozen=True)
class Config:
    enabled: bool = True
    strict: bool = False
    guard: bool = False
    include: Optional[FrozenSet[str]] = None  # None: all fixes (names in lower case)
    exclude: FrozenSet[str] = frozenset()
    previews: FrozenSet[str] = frozenset()  # preview names turned on (lower case)
    raw: Mapping[str, Optional[str]] = field(default_factory=dict)
    bad: Tuple[BadSetting, ...] = ()

    @property
    def errors(self) -> Tuple[str, ...]:
        """One message per bad variable."""
        return tuple(b.message(self.strict) for b in self.bad)

    def selected(self, name: str) -> bool:
        name = name.lower()
        if name in self.exclude:
            return False
        return self.include is None or name in self.include

    def unknown_fix_names(self, known: Sequence[str]) -> List[str]:
        named = set(self.include or ()) | set(self.exclude)
        return sorted(named - {k.lower() for k in known})

    def checked_against(self, known: Sequence[str], previews: Sequence[str] = ()) -> "Config":
        """This configuration checked against the fixes and the previews that exist: where
        SGLANG_SWA_PLUGIN_FIXES names a fix that does not, it falls back to all fixes; where
        SGLANG_SWA_PLUGIN_PREVIEW names a preview that does not, to no previews. With the
        plugin off nothing is selected, so nothing is checked."""
        if not self.enabled:
            return self
        cfg = self._fall_back(FIXES, "fix(es)", self.unknown_fix_names(known), FIX_NAMES_VALID + ": " + ", ".join(known),
                              "the default (all fixes)", include=None, exclude=frozenset())
        return cfg._fall_back(PREVIEW, "preview(s)", sorted(self.previews - {p.lower() for p in previews}),
                              "a comma list of: " + (", ".join(previews) or "(no fix has a preview)"),
                              "the default (no previews)", previews=frozenset())

    def _fall_back(self, var: str, what: str, unknown: List[str], valid: str, used: str, **default) -> "Config":
        """Where ``var`` names ``unknown`` ones: ``default`` in their place, and the bad setting reported."""
        if not unknown:
            return self
        bad = BadSetting(var, self.raw.get(var) or "", f"names unknown {what} {', '.join(repr(u) for u in unknown)}",
                         valid, used)
        return dataclasses.replace(self, **default, bad=self.bad + (bad,))

    def as_dict(self) -> Dict[str, object]:
        return {
            "enabled": self.enabled,
            "strict": self.strict,
            "guard": self.guard,
            "fixes": "all" if self.include is None else sorted(self.include),
            "excluded": sorted(self.exclude),
            "previews": sorted(self.previews),
            "env": dict(self.raw),
            "errors": list(self.errors),
        }


def _bool(env: Mapping[str, str], var: str, default: bool, bad: List[BadSetting], if_bad: Optional[bool] = None) -> bool:
    """The variable's boolean value; unset or blank: ``default``; anything else: ``if_bad``
    (None: ``default``), reported in ``bad``."""
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return default
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    if if_bad is None:
        used, why = default, f"the default ({'on' if default else 'off'})"
    else:
        word = "on" if if_bad else "off"
        used, why = if_bad, f"{word} (a malformed {var} counts as {word})"
    bad.append(BadSetting(var, raw, "is not a boolean", BOOL_VALUES, why))
    return used


FIX_NAMES_VALID = "all, or a comma list of fix names (any case; '-name' excludes one, 'all,-name' is every fix but one)"


def _fix_names(raw: Optional[str]) -> "tuple[Optional[FrozenSet[str]], FrozenSet[str]]":
    """(include, exclude): include None means every fix ("all", or only exclusions)."""
    items = [x.strip().lower() for x in (raw or "").split(",")]
    exclude = {x[1:].strip() for x in items if x.startswith("-")}
    named = {x for x in items if x and not x.startswith("-")}
    if not named or "all" in named:
        return None, frozenset(exclude)
    return frozenset(named), frozenset(exclude)


def parse(env: Optional[Mapping[str, str]] = None) -> Config:
    env = os.environ if env is None else env
    bad: List[BadSetting] = []
    enabled = _bool(env, ENABLE, True, bad)
    strict = _bool(env, STRICT, False, bad, if_bad=True)
    guard = _bool(env, GUARD, False, bad)
    include, exclude = _fix_names(env.get(FIXES))
    previews = frozenset(x.strip().lower() for x in (env.get(PREVIEW) or "").split(",") if x.strip())
    return Config(
        enabled=enabled,
        strict=strict,
        guard=guard,
        include=include,
        exclude=exclude,
        previews=previews,
        raw={v: env.get(v) for v in ALL_VARS},
        bad=tuple(bad),
    )


_CACHED: Optional[Config] = None


def get() -> Config:
    """The process's configuration, read from the environment on first use."""
    global _CACHED
    if _CACHED is None:
        _CACHED = parse()
    return _CACHED


def opt_in_variable(opt_in: str) -> str:
    """The environment variable that turns an opt-in fix on (``Fix.opt_in`` names it)."""
    return {"guard": GUARD}.get(opt_in, opt_in)
