"""Small helpers shared by the fixes' detection code: reading the installed code's
structure and running it on stand-ins, never consulting version strings. Every look-up
that more than one fix (or the check side) needs is here, once."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import re
import textwrap
from types import ModuleType
from typing import Any, Iterator, Optional


class ImportFailed(ImportError):
    """A module exists but fails to import (e.g. a CUDA-only binary on a CPU machine)."""


def optional_module(name: str) -> Optional[ModuleType]:
    """The module, or None when it does not exist in this sglang (feature absent).
    A module that exists but fails to import is not 'absent': ImportFailed names it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            return None
        raise ImportFailed(f"cannot import {name}: {type(e).__name__}: {e}") from e
    except Exception as e:  # noqa: BLE001
        raise ImportFailed(f"cannot import {name}: {type(e).__name__}: {e}") from e


@functools.lru_cache(maxsize=None)
def module_tree(name: str) -> Optional[Any]:
    """The syntax tree of module ``name``'s source file, read without importing it (a model
    module imports CUDA-only code); None where this sglang has no such module."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as f:
        return ast.parse(f.read())


def target_class(dotted: str) -> type:
    """The class at ``module.Class``; TargetMissing naming it where it is gone."""
    from .fix import TargetMissing

    module, _, name = dotted.rpartition(".")
    mod = optional_module(module)
    cls = getattr(mod, name, None) if mod is not None else None
    if not isinstance(cls, type):
        raise TargetMissing(dotted)
    return cls


def optional_class(dotted: str) -> Optional[type]:
    """The class at ``module.Class``; None where this sglang has no such module (the feature is
    absent: not applicable); TargetMissing naming it where the module is there without it."""
    if optional_module(dotted.rpartition(".")[0]) is None:
        return None
    return target_class(dotted)


@functools.lru_cache(maxsize=None)
def swa_pool_class() -> type:
    """The ``SWAKVPool`` class the trtllm_mha backend checks against (its module's binding
    where it has one, else sglang's memory-pool module)."""
    mod = optional_module("sglang.srt.layers.attention.trtllm_mha_backend")
    cls = getattr(mod, "SWAKVPool", None) if mod is not None else None
    if cls is None:
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool as cls
    return cls


@functools.lru_cache(maxsize=None)
def swa_allocator_class() -> type:
    """``SWATokenToKVPoolAllocator`` (moved to ``mem_cache.allocator.swa`` in 0.5.13)."""
    from .fix import TargetMissing

    for name in ("sglang.srt.mem_cache.allocator.swa", "sglang.srt.mem_cache.swa_memory_pool"):
        mod = optional_module(name)
        if mod is not None and hasattr(mod, "SWATokenToKVPoolAllocator"):
            return mod.SWATokenToKVPoolAllocator
    raise TargetMissing("SWATokenToKVPoolAllocator")


@functools.lru_cache(maxsize=256)
def _source(fn: Any) -> str:
    """``inspect.getsource`` of a plain function, dedented, read once per function."""
    return textwrap.dedent(inspect.getsource(fn))


def function_text(fn: Any) -> str:
    """The dedented text of a function (wrappers looked through): what a fix should search
    with ``in`` or a regular expression."""
    return _source(inspect.unwrap(getattr(fn, "__func__", fn)))


function_source = function_text


@functools.lru_cache(maxsize=256)
def _function_tree(fn: Any) -> "tuple[Any, str]":
    import ast

    src = _source(fn)
    return ast.parse(src).body[0], src


def function_tree(fn: Any) -> "tuple[Any, str]":
    """Syntax tree and dedented source of a plain function (wrappers looked through), parsed
    once per function."""
    return _function_tree(inspect.unwrap(getattr(fn, "__func__", fn)))


@functools.lru_cache(maxsize=64)
def nodes(tree: Any) -> "list":
    """``ast.walk(tree)`` as a list, computed once per (cached) tree."""
    import ast

    return list(ast.walk(tree))


def callee(call: Any) -> Optional[str]:
    """The called name of an ``ast.Call`` (``f(...)`` or ``x.f(...)``)."""
    f = call.func
    return getattr(f, "attr", None) or getattr(f, "id", None)


def is_attribute(node: Any, name: str, owner: str) -> bool:
    """``node`` is ``owner.name`` or ``<...>.owner.name``."""
    import ast

    value = getattr(node, "value", None)
    return (isinstance(node, ast.Attribute) and node.attr == name
            and ((isinstance(value, ast.Name) and value.id == owner)
                 or (isinstance(value, ast.Attribute) and value.attr == owner)))


def calls(node: Any, names: "frozenset") -> bool:
    """``node`` contains a call of one of ``names``."""
    import ast

    return any(isinstance(n, ast.Call) and callee(n) in names for n in ast.walk(node))


def if_branches(fn: Any, test_call: str, mentioning: "tuple[str, ...]" = ()) -> "list":
    """The ``if``/``elif`` statements of ``fn`` (nested ones too) whose test calls a name
    starting with ``test_call``, in text order. With ``mentioning``, only those whose text
    holds one of those strings."""
    import ast

    tree, src = function_tree(fn)
    lines = src.splitlines()
    found = []
    for node in nodes(tree):
        if not isinstance(node, ast.If) or not any(
                isinstance(c, ast.Call) and (callee(c) or "").startswith(test_call) for c in ast.walk(node.test)):
            continue
        text = "\n".join(lines[node.lineno - 1:node.end_lineno])
        if not mentioning or any(m in text for m in mentioning):
            found.append(node)
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def normalized_source(obj: Any) -> str:
    """Source of a function/method/class with comments dropped and all whitespace folded,
    so that formatting changes do not change the verdict."""
    obj = inspect.unwrap(getattr(obj, "__func__", obj))
    src = function_text(obj) if inspect.isfunction(obj) else textwrap.dedent(inspect.getsource(obj))
    return _normalized(src)


@functools.lru_cache(maxsize=256)
def _normalized(src: str) -> str:
    return _SPACE.sub(" ", _COMMENT.sub("", src))


_COMMENT, _SPACE = re.compile(r"#[^\n]*"), re.compile(r"\s+")


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
