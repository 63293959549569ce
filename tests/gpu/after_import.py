"""Shared by the test-side ``sitecustomize.py`` files of tests/gpu (triton_window_probe,
spec_recorder, e2e_server.GEMMA4_EAGLE_SHIM), never installed: patch a module right after its
code ran, when the server imports it, and chain to the next ``sitecustomize`` on the path.

    sys.path.insert(0, <this folder>)
    from after_import import patch_after_import, run_next_sitecustomize
    patch_after_import({"sglang.srt.foo": patch})   # patch(module) after foo's code ran
    run_next_sitecustomize(__file__)                 # this file shadows any other sitecustomize
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from typing import Callable, Dict


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, patches: Dict[str, Callable]):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_then_patch
        return spec


def patch_after_import(patches: Dict[str, Callable]) -> None:
    """``{module name: patch}``: when a module is imported, ``patch(module)`` runs right after
    the module's own code (sglang's classes stay sglang's; only what the patch sets changes)."""
    sys.meta_path.insert(0, _AfterImport(dict(patches)))


def run_next_sitecustomize(this_file: str) -> None:
    """Run the ``sitecustomize`` that ``this_file`` (a sitecustomize.py) shadows, if any: the
    first one on ``sys.path`` outside this file's folder."""
    here = os.path.dirname(os.path.abspath(this_file))
    nxt = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != here])
    if nxt is not None and nxt.loader is not None:
        nxt.loader.exec_module(importlib.util.module_from_spec(nxt))
