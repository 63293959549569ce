"""Environment toggles, read once per process.

SGLANG_SWA_PLUGIN        on (default) | 0/false/off/no: install nothing
SGLANG_SWA_PLUGIN_FIXES  all (default) | comma list of fix names; "-name" excludes
SGLANG_SWA_PLUGIN_STRICT off (default) | 1: a selected fix that is needed but cannot be
                         installed stops the server start
SGLANG_SWA_PLUGIN_GUARD  off (default) | 1: install the SWA index guard
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence

ENABLE = "SGLANG_SWA_PLUGIN"
FIXES = "SGLANG_SWA_PLUGIN_FIXES"
STRICT = "SGLANG_SWA_PLUGIN_STRICT"
GUARD = "SGLANG_SWA_PLUGIN_GUARD"
ALL_VARS = (ENABLE, FIXES, STRICT, GUARD)

_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}
BOOL_VALUES = "1/true/on/yes or 0/false/off/no"


@dataclass(frozen=True)
class Config:
    enabled: bool = True
    strict: bool = False
    guard: bool = False
    include: Optional[FrozenSet[str]] = None  # None: all fixes
    exclude: FrozenSet[str] = frozenset()
    raw: Mapping[str, Optional[str]] = field(default_factory=dict)
    errors: Sequence[str] = ()  # one message per bad variable

    def selected(self, name: str) -> bool:
        if name in self.exclude:
            return False
        return self.include is None or name in self.include

    def unknown_fix_names(self, known: Sequence[str]) -> List[str]:
        named = set(self.include or ()) | set(self.exclude)
        return sorted(named - set(known))

    def checked_against(self, known: Sequence[str]) -> "Config":
        """This configuration, with an error when SGLANG_SWA_PLUGIN_FIXES names a fix
        that is not among ``known``."""
        unknown = self.unknown_fix_names(known)
        if not unknown:
            return self
        err = (f"{FIXES} names unknown fix(es) {', '.join(unknown)}; valid names: "
               + ", ".join(known) + " (prefix a name with '-' to exclude it)")
        return dataclasses.replace(self, errors=tuple(self.errors) + (err,))

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


def _bool(env: Mapping[str, str], var: str, default: bool, errors: List[str]) -> bool:
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return default
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    errors.append(f"{var}={raw!r} is not a boolean; valid values: {BOOL_VALUES}")
    return default


def parse(env: Optional[Mapping[str, str]] = None) -> Config:
    env = os.environ if env is None else env
    errors: List[str] = []
    enabled = _bool(env, ENABLE, True, errors)
    strict_raw_ok = len(errors)
    strict = _bool(env, STRICT, False, errors)
    if len(errors) > strict_raw_ok:
        # A malformed strict value most likely meant "strict": be safe and stop.
        strict = True
    guard = _bool(env, GUARD, False, errors)

    include: Optional[set] = None
    exclude: set = set()
    raw_fixes = env.get(FIXES)
    if raw_fixes is not None and raw_fixes.strip() not in ("", "all"):
        for item in (x.strip() for x in raw_fixes.split(",")):
            if not item:
                continue
            if item.startswith("-"):
                exclude.add(item[1:].strip())
            else:
                include = include or set()
                include.add(item)
    return Config(
        enabled=enabled,
        strict=strict,
        guard=guard,
        include=frozenset(include) if include is not None else None,
        exclude=frozenset(exclude),
        raw={v: env.get(v) for v in ALL_VARS},
        errors=tuple(errors),
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
