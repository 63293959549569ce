"""The model-window rule that ``mimo_v2_window`` and ``step3p5_window`` correct: sglang reads a
sliding layer's ``sliding_window_size`` as the distance to its oldest key (``q - k <= size``),
so a model whose layers attend ``window`` keys must build them with ``window - 1`` and give
the model runner the same (through ``get_attention_sliding_window_size``, which it asks
before the config). Detection reads the model's source tree; the hooks go around the
attention layer's and the models' ``__init__``."""

from __future__ import annotations

import ast
import functools
from typing import Any, Callable, Optional

from .fix import Detection, argument, with_argument

MODEL_METHOD = "get_attention_sliding_window_size"


def class_def(tree: Optional[ast.Module], name: str) -> Optional[ast.ClassDef]:
    """The module-level class ``name`` of ``tree``."""
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None) if tree else None


def layer_windows(tree: ast.Module, layer: str) -> list:
    """The windows the decoder class ``layer`` gives its attention other than -1: the values of
    its ``sliding_window_size=`` keywords, through ``self.<name>``'s assignments where it passes
    an attribute of its own (empty: no such class or keyword)."""
    node = class_def(tree, layer)
    if node is None:
        return []
    values = []
    for k in ast.walk(node):
        if not (isinstance(k, ast.keyword) and k.arg == "sliding_window_size"):
            continue
        value = k.value
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "self":
            values += [n.value for n in ast.walk(node) if isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == value.attr and isinstance(t.value, ast.Name)
                and t.value.id == "self" for t in n.targets)]
        else:
            values.append(value)
    return [v for v in values if not (isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub))]


def stock_form(model: str, tree: ast.Module, layer: str, attribute: str) -> Optional[Detection]:
    """The detection of ``model``'s module (``tree``) where it is not the stock form, in which
    the decoder class ``layer`` gives its attention ``config.<attribute>`` as is and no class
    defines ``MODEL_METHOD``; None for the stock form (the fix is needed)."""
    if any(isinstance(n, ast.FunctionDef) and n.name == MODEL_METHOD for n in ast.walk(tree)):
        return Detection.not_needed(f"{model} defines {MODEL_METHOD}")
    windows = layer_windows(tree, layer)
    if len(windows) != 1:
        return Detection.unknown(f"{layer} no longer passes one sliding window")
    window = windows[0]
    if isinstance(window, ast.BinOp) and isinstance(window.op, ast.Sub):
        return Detection.not_needed(f"{layer} passes a window minus one")
    if not (isinstance(window, ast.Attribute) and window.attr == attribute and isinstance(window.value, ast.Name)):
        return Detection.unknown(f"{layer}'s window is not config.{attribute}")
    return None


def layer_window():
    """A new hook (one per fix: the plugin marks each hook with its fix's name) around an
    attention layer's ``__init__``: a window ``size`` (> 0) is built as ``size - 1``, the rule of
    sglang's RadixAttention for ``size`` keys."""

    def hook(original, self, *args, **kwargs):
        size = argument(original, "sliding_window_size", args, kwargs)
        if isinstance(size, int) and size > 0:
            args, kwargs = with_argument(original, "sliding_window_size", size - 1, args, kwargs)
        return original(self, *args, **kwargs)

    return hook


def runner_window(window_of: Callable[[Any], Any]):
    """A new hook (one per fix) after a model's ``__init__`` that gives the runner the window of
    its layers: ``window_of(config) - 1`` where that is a window (> 0) and the model has no such
    method."""

    def hook(original, self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        window = window_of(argument(original, "config", args, kwargs))
        if isinstance(window, int) and window > 0 and not hasattr(self, MODEL_METHOD):
            setattr(self, MODEL_METHOD, functools.partial(int, window - 1))
        return result

    return hook
