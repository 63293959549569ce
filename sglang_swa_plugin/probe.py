"""Small helpers shared by the fixes' detection code: reading the installed code's
structure and running it on stand-ins, never consulting version strings. Every look-up
that more than one fix (or the check side) needs is here, once."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import operator
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


def target_class(dotted: str) -> type:
    """The class at ``module.Class``; TargetMissing naming it where it is gone."""
    from .fix import TargetMissing

    module, _, name = dotted.rpartition(".")
    mod = optional_module(module)
    cls = getattr(mod, name, None) if mod is not None else None
    if not isinstance(cls, type):
        raise TargetMissing(dotted)
    return cls


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


def _code_objects(code: Any) -> Iterator[Any]:
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_positions"):
            yield from _code_objects(const)


def function_source(fn: Any) -> str:
    """Dedented source of a plain function (see ``function_tree``)."""
    return function_tree(fn)[1]


_LINE = operator.itemgetter(2)
_END_LINE = operator.itemgetter(1)
# A line at or left of a def's indentation that surely starts a block of its own (never the
# continuation of an expression: ``def``/``class`` cannot stand inside one, and a ``@``
# continuing a matrix product would start an instruction on that line).
_NEXT_BLOCK = re.compile(r"[ \t]*(?:@|def\s|class\s|async\s+def\s)")


def _block(lines: "list", first: int, end: int) -> int:
    """Index past the last line of the block that starts at ``lines[first]``, given that
    ``lines[:end]`` belong to it: lines that carry no instruction of their own but belong to
    the block (a closing bracket on a line of its own, a trailing bare string or comment),
    i.e. everything indented deeper than its first line, up to the next line that is not."""
    indent = len(lines[first]) - len(lines[first].lstrip())
    last = end
    while end < len(lines):
        text = lines[end].strip()
        if text and not text.startswith("#") and len(lines[end]) - len(lines[end].lstrip()) <= indent:
            break
        end += 1
        if text:
            last = end
    return last


def _dedent(block: "list") -> str:
    """``textwrap.dedent("".join(block))`` for a block whose first line is the least indented
    (a def and its body), by string operations (``textwrap`` runs three regular expressions
    over the text): where no line is whitespace-only but for its newline, and every other
    line starts with the first one's indentation, that indentation is what ``textwrap``
    removes, from every line that starts with it. ``textwrap.dedent`` otherwise."""
    first, text = block[0], "".join(block)
    margin = first[: len(first) - len(first.lstrip(" \t"))]
    if " \n" in text or "\t\n" in text or text.endswith((" ", "\t")):  # whitespace-only lines, maybe
        return textwrap.dedent(text)
    if not margin:
        return text
    text = "\n" + text
    if text.count("\n" + margin) + block.count("\n") != len(block):
        return textwrap.dedent(text[1:])
    return text.replace("\n" + margin, "\n")[1:]


@functools.lru_cache(maxsize=256)
def _span(fn: Any) -> "tuple[Optional[str], Optional[Exception]]":
    import linecache

    code = getattr(fn, "__code__", None)
    if code is None or not hasattr(code, "co_positions"):
        return None, ValueError("no code positions")
    try:
        lines = linecache.getlines(code.co_filename)  # each file read once per process
        first = code.co_firstlineno - 1
        # The last line an instruction starts on (``co_lines``: one entry per run of
        # instructions, few next to ``co_positions``' one per code unit), then the block
        # scan from there. The function may still go on past the line where that scan stops
        # only as a continuation of an expression (a bracket, a triple-quoted string, a
        # backslash); the scan's result is kept where that is excluded: the scan stopped at
        # the end of the file or at a line that starts a block of its own, and the lines
        # from the last instruction on open no string and continue no line. Otherwise the
        # instructions' end positions decide (exact, and costlier).
        start = max(max(filter(None, map(_LINE, c.co_lines())), default=0) for c in _code_objects(code))
        if lines and first < start <= len(lines):
            last = _block(lines, first, start)
            stop = last
            while stop < len(lines) and (not lines[stop].strip() or lines[stop].lstrip().startswith("#")):
                stop += 1
            tail = lines[start - 1:stop]
            if (stop == len(lines) or _NEXT_BLOCK.match(lines[stop])) and not any(
                    '"""' in t or "'''" in t or t.rstrip().endswith("\\") for t in tail):
                return _dedent(lines[first:last]), None
        end = max(max(filter(None, map(_END_LINE, c.co_positions())), default=0) for c in _code_objects(code))
        if not lines or end <= first or end > len(lines):
            raise ValueError("code positions outside the file")
        return _dedent(lines[first:_block(lines, first, end)]), None
    except (ValueError, TypeError) as e:
        return None, e


def _span_text(fn: Any) -> str:
    """The lines of ``fn``'s file that its block spans (decorators included), cut once per
    function (shared by ``function_text``, ``function_tree`` and ``normalized_source``)."""
    src, err = _span(fn)
    if err is not None:
        raise err
    return src


def function_text(fn: Any) -> str:
    """The text of a function, cheaply and unparsed (wrappers looked through): what a fix
    should search with ``in`` or a regular expression, and the pre-filter before a parse
    (a name absent here is absent from the function). Falls back to ``inspect.getsource``
    where the code's positions are not available."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    try:
        return _span_text(fn)
    except (ValueError, TypeError):
        return textwrap.dedent(inspect.getsource(fn))


@functools.lru_cache(maxsize=256)
def _function_tree(fn: Any) -> "tuple[Any, str]":
    import ast

    try:
        src = _span_text(fn)
        tree = ast.parse(src).body
        if len(tree) != 1 or not isinstance(tree[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise ValueError("not a function's text")
        return tree[0], src
    except (ValueError, SyntaxError, TypeError):
        src = textwrap.dedent(inspect.getsource(fn))
        return ast.parse(src).body[0], src


def function_tree(fn: Any) -> "tuple[Any, str]":
    """Syntax tree and dedented source of a plain function (wrappers looked through), parsed
    once per function. The text is cut from the file by the line span the function's code
    objects cover (instruction end positions included): no tokenizing of the rest of the
    module as ``inspect.getsource`` does (10-20 ms for sglang's long backend files). Falls
    back to ``inspect.getsource`` where that span is not available or not one function."""
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


def calls(node: Any, names: "frozenset") -> bool:
    """``node`` contains a call of one of ``names``."""
    import ast

    return any(isinstance(n, ast.Call) and callee(n) in names for n in ast.walk(node))


_IF = re.compile(r"^(\s*)(el)?if\b")


def _header_end(lines: "list", i: int) -> int:
    """The line where the ``if`` header starting at ``lines[i]`` ends: at the ':' where its
    brackets close."""
    j, depth = i, 0
    while j < len(lines):
        code = lines[j].split("#", 1)[0]
        depth += sum(map(code.count, "([{")) - sum(map(code.count, ")]}"))
        if depth <= 0 and code.rstrip().endswith(":"):
            break
        j += 1
    return j


def if_branches(fn: Any, test_call: str, mentioning: "tuple[str, ...]" = ()) -> "list":
    """The ``if``/``elif`` statements of ``fn`` (nested ones too) whose test calls a name
    starting with ``test_call``, as syntax trees in text order (``elif`` as ``if``; ``orelse``
    not kept). With ``mentioning``, a statement whose text holds none of those strings is
    left out unparsed (it cannot call a name that contains one of them).
    Only those statements are parsed, each cut from the function's text by indentation
    (parsing a long backend method costs milliseconds per fix and process); where a cut does
    not parse, the whole function is parsed instead, with the same result. The headers are
    found from the lines that name ``test_call``, walking back to the ``if``/``elif`` line
    whose header holds them."""
    import ast

    def wanted(node):
        return isinstance(node, ast.If) and any(
            isinstance(c, ast.Call) and (callee(c) or "").startswith(test_call) for c in ast.walk(node.test))

    text = function_text(fn)
    if test_call not in text:
        return []
    lines, heads = text.splitlines(), {}
    for k, line in enumerate(lines):
        if test_call not in line:
            continue
        for i in range(k, -1, -1):  # the if/elif lines whose header reaches line k
            if _IF.match(lines[i]):
                j = heads[i] if i in heads else _header_end(lines, i)
                if j < k:
                    break
                heads[i] = j
    found = []
    for i in sorted(heads):
        indent, k = len(_IF.match(lines[i]).group(1)), heads[i] + 1
        while k < len(lines) and (not lines[k].strip() or len(lines[k]) - len(lines[k].lstrip()) > indent):
            k += 1
        cut = [line + "\n" for line in lines[i:k]]
        if mentioning and not any(m in line for line in cut for m in mentioning):
            continue
        cut = _dedent(cut)
        try:
            stmt = ast.parse(cut[2:] if cut.startswith("elif") else cut).body
        except SyntaxError:
            stmt = None
        if not stmt or not isinstance(stmt[0], ast.If):
            return [n for n in nodes(function_tree(fn)[0]) if wanted(n)]
        found.append(stmt[0])
    return [n for n in found if wanted(n)]


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
