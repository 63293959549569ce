"""The selftest's tiny targets: generated weights whose sliding-window (GPT-OSS, Gemma 4) or
chunked (Llama 4) layers decide the greedy tokens with bf16-safe margins, so that a window one
key too wide or too narrow changes most outputs, and whose float32 reference is transformers'
own model class on the CPU. ``readout`` holds the shared design; each target module carries
``TITLE``, ``ARCHITECTURE`` (the class sglang serves), ``REFERENCE_CLASS`` (transformers'),
``SIZE`` and ``LABEL`` (the window or chunk that decides the tokens), ``HAS_DRAFT`` (an EAGLE3
draft with real weights), ``save(root) -> (target dir, draft dir or None)`` and
``hf_model(size, dtype=None)``; optionally ``DRAFT_KIND`` ("mtp": MTP layers in the target's
own checkpoint, served as its draft; default "eagle3" where HAS_DRAFT), ``SERVER_ARGS`` (what
sglang needs to load it), ``BACKEND_SERVER_ARGS`` (``{backend: args}``: what one backend's rows
need, e.g. a page size that tiles the target's chunk), ``MODES`` (the keys of ``rows.MODES`` it
runs; default: every mode of its draft's kind) and ``OWN_FORWARD`` with ``reference_source()`` (a float32 forward of
its own where the installed transformers lacks the class).

Importing a target module is cheap (torch, transformers and scipy are imported by its
functions)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Optional

NAMES = ("gptoss", "llama4", "gemma4", "mimo_v2", "step3p5")


def load(name: str) -> ModuleType:
    """The target module ``name`` (one of NAMES)."""
    if name not in NAMES:
        raise ValueError(f"unknown target {name!r}: one of {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")


def sglang_serves(architecture: str) -> bool:
    """Whether the installed sglang defines the model class ``architecture`` (a ``class X(``
    in one of its model modules), read from its files without importing sglang's models."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return False
    models = os.path.join(list(spec.submodule_search_locations)[0], "srt", "models")
    needle = f"class {architecture}("
    for name in sorted(os.listdir(models)) if os.path.isdir(models) else ():
        if name.endswith(".py"):
            with open(os.path.join(models, name), encoding="utf-8", errors="replace") as f:
                if needle in f.read():
                    return True
    return False


def draft_kind(target: ModuleType) -> Optional[str]:
    """"eagle3", "mtp" or None: the target's draft (rows.MODES picks the speculative rows by it)."""
    return getattr(target, "DRAFT_KIND", "eagle3" if target.HAS_DRAFT else None)


def unavailable(target: ModuleType) -> Optional[str]:
    """Why ``target`` cannot be tested here (None: it can): sglang has no such model, or the
    installed transformers has no class for its float32 reference (and the target has no
    forward of its own)."""
    if not sglang_serves(target.ARCHITECTURE):
        return f"the installed sglang has no {target.ARCHITECTURE}"
    if getattr(target, "OWN_FORWARD", False):
        return None
    from . import readout

    readout.hide_broken_torchvision()
    try:
        import transformers

        getattr(transformers, target.REFERENCE_CLASS)
    except Exception as e:  # noqa: BLE001 - absent or not importable: no reference
        return f"transformers has no {target.REFERENCE_CLASS} for the reference ({type(e).__name__})"
    return None
