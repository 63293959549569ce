"""Small helpers shared by the fixes' detection code: reading the installed code's
structure and running it on stand-ins, never consulting version strings."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import re
import textwrap
from types import ModuleType
from typing import Any, Iterator, Optional


def optional_module(name: str) -> Optional[ModuleType]:
    """The module, or None when it does not exist in this sglang (feature absent).
    Other import errors propagate: a module that exists but fails is not 'absent'."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            return None
        raise


def target_class(dotted: str) -> type:
    """The class at ``module.Class``; TargetMissing naming it where it is gone."""
    from .fix import TargetMissing

    module, _, name = dotted.rpartition(".")
    mod = optional_module(module)
    cls = getattr(mod, name, None) if mod is not None else None
    if not isinstance(cls, type):
        raise TargetMissing(dotted)
    return cls


def normalized_source(obj: Any) -> str:
    """Source of a function/method/class with comments dropped and all whitespace folded,
    so that formatting changes do not change the verdict."""
    obj = inspect.unwrap(getattr(obj, "__func__", obj))
    src = textwrap.dedent(inspect.getsource(obj))
    src = re.sub(r"#[^\n]*", "", src)
    return re.sub(r"\s+", " ", src)


def compact(text: str) -> str:
    """Whitespace-free form, for matching code across line breaks and parentheses."""
    return re.sub(r"\s+", "", text)


def own_function(cls: type, name: str) -> Optional[Any]:
    """The plain function ``name`` as defined on ``cls`` or its bases (staticmethod and
    classmethod unwrapped), or None."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            raw = klass.__dict__[name]
            return getattr(raw, "__func__", raw)
    return None


@contextlib.contextmanager
def swapped(obj: Any, name: str, value: Any) -> Iterator[None]:
    """Temporarily set ``obj.name = value`` (e.g. a kernel recorder during a probe)."""
    missing = object()
    old = obj.__dict__.get(name, missing) if hasattr(obj, "__dict__") else getattr(obj, name, missing)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(obj, name)
        else:
            setattr(obj, name, old)
