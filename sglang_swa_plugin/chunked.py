"""Llama 4's chunked ("local") layers as the triton and trtllm_mha fixes see them
(``triton_local_attn``, ``trtllm_local_attn``): the runner's chunk size kept on the backend
when it is built, which layers attend by chunk, and whether a backend module knows them."""

from __future__ import annotations

import ast
from typing import Any, Optional

from . import state

CHUNK = "attention_chunk"  # in the backend's state: the runner's attention_chunk_size


def remember_chunk_hook():
    """A new AROUND hook for a backend's ``__init__`` that keeps its runner's chunk size on the
    backend (one per fix: a hook function carries the mark of the fix that installed it)."""

    def remember_chunk(original, self, model_runner, *args, **kwargs):
        result = original(self, model_runner, *args, **kwargs)
        state.of(self)[CHUNK] = getattr(model_runner, "attention_chunk_size", None)
        return result

    return remember_chunk


def chunk_of(backend: Any, layer: Any) -> Optional[int]:
    """The chunk of a chunked layer (``use_irope``, no window) of a backend built for a chunked
    model; None for every other layer."""
    chunk = state.get(backend, CHUNK)
    if chunk and getattr(layer, "use_irope", False) and getattr(layer, "sliding_window_size", None) in (None, -1):
        return chunk
    return None


def reads_use_irope(tree: Any) -> bool:
    """A backend module's syntax tree reads ``use_irope``: it knows chunked layers (detection)."""
    return any(isinstance(n, ast.Attribute) and n.attr == "use_irope" for n in ast.walk(tree))
