"""Environment toggles, read once per process.

SGLANG_SWA_PLUGIN        on (default) | 0/false/off/no: install nothing
SGLANG_SWA_PLUGIN_FIXES  all (default) | comma list of fix names (any case); "-name" excludes
SGLANG_SWA_PLUGIN_STRICT off (default) | 1: a selected fix that is needed but cannot be
                         installed, or a bad setting, stops the server start
SGLANG_SWA_PLUGIN_GUARD  off (default) | 1: install the SWA index guard

A bad value never lowers protection: the variable falls back to its default (plugin on,
all fixes, guard off) and is reported in one line naming it, its value and the valid
values. A malformed SGLANG_SWA_PLUGIN_STRICT counts as on (it most likely meant on).
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
ALL_VARS = (ENABLE, FIXES, STRICT, GUARD)

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

    def checked_against(self, known: Sequence[str]) -> "Config":
        """This configuration checked against the fixes that exist: where
        SGLANG_SWA_PLUGIN_FIXES names one that does not, it falls back to all fixes."""
        unknown = self.unknown_fix_names(known)
        if not unknown:
            return self
        bad = BadSetting(
            FIXES, self.raw.get(FIXES) or "", f"names unknown fix(es) {', '.join(repr(u) for u in unknown)}",
            "all, or a comma list of " + ", ".join(known) + " (any case; '-name' excludes one)",
            "the default (all fixes)",
        )
        return dataclasses.replace(self, include=None, exclude=frozenset(), bad=self.bad + (bad,))

    def as_dict(self) -> Dict[str, object]:
        return {
            "enabled": self.enabled,
            "strict": self.strict,
            "guard": self.guard,
            "fixes": "all" if self.include is None else sorted(self.include),
            "excluded": sorted(self.exclude),
            "env": dict(self.raw),
            "errors": list(self.errors),
        }


def _bool(env: Mapping[str, str], var: str, default: bool, bad: List[BadSetting], if_bad: Optional[bool] = None) -> bool:
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return default
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    used = default if if_bad is None else if_bad
    what = "the default" if used == default else "on, the safe reading"
    bad.append(BadSetting(var, raw, "is not a boolean", BOOL_VALUES, f"{what} ({'on' if used else 'off'})"))
    return used


def _fix_names(raw: Optional[str]) -> "tuple[Optional[FrozenSet[str]], FrozenSet[str]]":
    if raw is None or raw.strip().lower() in ("", "all"):
        return None, frozenset()
    include: Optional[set] = None
    exclude: set = set()
    for item in (x.strip().lower() for x in raw.split(",")):
        if not item:
            continue
        if item.startswith("-"):
            exclude.add(item[1:].strip())
        else:
            include = include or set()
            include.add(item)
    return (frozenset(include) if include is not None else None), frozenset(exclude)


def parse(env: Optional[Mapping[str, str]] = None) -> Config:
    env = os.environ if env is None else env
    bad: List[BadSetting] = []
    enabled = _bool(env, ENABLE, True, bad)
    strict = _bool(env, STRICT, False, bad, if_bad=True)
    guard = _bool(env, GUARD, False, bad)
    include, exclude = _fix_names(env.get(FIXES))
    return Config(
        enabled=enabled,
        strict=strict,
        guard=guard,
        include=include,
        exclude=exclude,
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
