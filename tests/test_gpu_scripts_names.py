"""The GPU-only scripts (benchmarks, server scenarios, GPU tests) cannot run here, so a name they
use that nothing defines would first fail on the GPU, after the payload's transfer (a bench row
named an undefined ``chunk`` after a refactor; it showed only there). Each function's global
names, read from the compiler's symbol table, must be a module-level name, an import or a
builtin."""

from __future__ import annotations

import builtins
import symtable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPTS = sorted([*HERE.glob("benchmarks/*.py"), *HERE.glob("gpu/*.py"), *HERE.glob("gpu/*/*.py")])


def undefined_globals(source: str, filename: str) -> "list[str]":
    """``function: name`` for each global name a function (or class body) reads that the module
    never binds, imports or declares, and that is not a builtin."""
    top = symtable.symtable(source, filename, "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    known = bound | set(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__", "__builtins__"}
    out = []

    def walk(table, where):
        for child in table.get_children():
            name = f"{where}{child.get_name()}"
            for sym in child.get_symbols():
                if sym.is_global() and sym.is_referenced() and sym.get_name() not in known:
                    out.append(f"{name}: {sym.get_name()}")
            walk(child, name + ".")

    walk(top, "")
    return out


def test_the_check_finds_an_undefined_name():
    """The check itself: a function reading a name nothing binds is reported, one that reads a
    module-level name, an import or a builtin is not."""
    source = "import os\nCHUNK = 4\ndef f():\n    return chunk + CHUNK + len(os.sep)\n"
    assert undefined_globals(source, "x.py") == ["f: chunk"]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(HERE)))
def test_gpu_script_names_are_defined(path):
    assert SCRIPTS, "no GPU scripts found"
    assert undefined_globals(path.read_text(), str(path)) == []
