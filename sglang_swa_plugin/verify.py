"""Is a hook really in effect? sglang's ``HookRegistry.apply_hooks`` logs and swallows a
failure to apply a hook, and a module may keep a stale ``from X import f`` copy: a fix is
reported ``applied`` only once each of its targets carries its wrapper, in the owner and in
every loaded module that held the original."""

from __future__ import annotations

import sys
import types
from typing import Any, Dict, Iterable, List, Mapping

from .fix import TargetMissing, split_target
from .patching import marks, module_bindings, stored_attribute


def _stale_copies(originals: Mapping[str, Any]) -> Dict[str, List[str]]:
    """Per target whose owner is a module: the ``module.name`` bindings that still hold the
    original function or class (one pass over ``sys.modules``)."""
    wanted: Dict[int, str] = {}
    for target, original in originals.items():
        owner_path = target.rpartition(".")[0]
        if owner_path in sys.modules and isinstance(original, (types.FunctionType, type)):
            wanted[id(original)] = target
    out: Dict[str, List[str]] = {}
    if not wanted:
        return out
    for modname, _, name, value in module_bindings():
        target = wanted.get(id(value))
        if target is not None and value is originals[target]:
            out.setdefault(target, []).append(f"{modname}.{name}")
    return out


def not_in_effect(name: str, targets: Iterable[str], originals: Mapping[str, Any]) -> List[str]:
    """Why the hook ``name`` is not in effect on ``targets`` ([] when it is everywhere)."""
    targets = list(targets)
    problems: List[str] = []
    for target in targets:
        try:
            owner, attr = split_target(target)
        except TargetMissing as e:
            problems.append(str(e))
            continue
        if name not in marks(stored_attribute(owner, attr)):
            problems.append(f"{target} does not carry the hook")
    for target, where in _stale_copies({t: o for t, o in originals.items() if t in targets}).items():
        problems.append(f"{', '.join(where)} still hold(s) the unhooked {target.rpartition('.')[2]}")
    return problems
