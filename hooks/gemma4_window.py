"""Gemma 4: sliding layers attend the window the model defines, not one key more.
Bug
    ``Gemma4Attention`` hands ``config.sliding_window`` (HF's count, the current token
    included) to ``RadixAttention`` as ``sliding_window_size``, which sglang reads as the
    distance to the oldest key (``q - k <= size``): every sliding layer attends one key more
    than the model, on every backend, while the model runner, the SWA pool and triton's rail
    use ``config.sliding_window - 1`` (as Gemma 2/3 do). Fix: after ``__init__``, a sliding
    layer's window (and its RadixAttention's) is ``config.sliding_window - 1``.
Upstream PRs
    #26147 (merged; in 0.5.14).
Affected versions
    0.5.11-0.5.13 (0.5.10 has no Gemma 4).
    Status by release: not applicable 0.5.10; applied 0.5.11-0.5.13; not needed 0.5.14+.
Detection
    Structural, from the source file (not imported to decide): ``Gemma4Attention.__init__``
    sets ``self.sliding_window = config.sliding_window if ...`` and passes it to
    ``RadixAttention``: needed; ``get_attention_sliding_window_size(config)`` there: not
    needed; anything else: unknown.
Delete when
    0.5.14 is the oldest supported release.
"""

from __future__ import annotations

import ast

from sglang_swa_plugin.fix import Detection, Fix, TargetMissing, argument, around
from sglang_swa_plugin.probe import is_attribute, module_tree

NAME = "gemma4_window"
MODULE = "sglang.srt.models.gemma4_causal"
CLASS = "Gemma4Attention"
TARGET = f"{MODULE}.{CLASS}.__init__"


def _config_window(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "sliding_window" and isinstance(node.value, ast.Name)


def _init_tree():
    """``Gemma4Attention.__init__``'s syntax tree, read from the module's file; None where
    this sglang has no Gemma 4 (no such module); TargetMissing where the module has no such
    class or method."""
    module = module_tree(MODULE)
    if module is None:
        return None
    cls = next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == CLASS), None)
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None) if cls else None
    if init is None:
        raise TargetMissing(TARGET)
    return init


def classify() -> Detection:
    init = _init_tree()
    if init is None:
        return Detection.not_applicable("this sglang has no Gemma4Attention")
    values = [n.value for n in ast.walk(init) if isinstance(n, ast.Assign)
              and any(is_attribute(t, "sliding_window", "self") for t in n.targets)]
    passed = any(isinstance(n, ast.keyword) and n.arg == "sliding_window_size"
                 and is_attribute(n.value, "sliding_window", "self") for n in ast.walk(init))
    if len(values) != 1 or not passed:
        return Detection.unknown("Gemma4Attention no longer hands self.sliding_window to RadixAttention")
    value = values[0]
    if any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "get_attention_sliding_window_size"
           for n in ast.walk(value)):
        return Detection.not_needed("Gemma4Attention's window is get_attention_sliding_window_size(config)")
    if isinstance(value, ast.IfExp) and _config_window(value.body):
        return Detection.needed("Gemma 4's sliding layers get config.sliding_window: one key more than the model",
                                around(TARGET, _model_window))
    return Detection.unknown("Gemma4Attention's window is neither config.sliding_window nor its helper")


def _model_window(original, self, *args, **kwargs):
    """After ``Gemma4Attention.__init__``: a sliding layer that kept ``config.sliding_window``
    gets ``config.sliding_window - 1`` (sglang's rule, as the model runner's)."""
    result = original(self, *args, **kwargs)
    window = getattr(argument(original, "config", args, kwargs), "sliding_window", None)
    attn = getattr(self, "attn", None)
    if window and getattr(self, "sliding_window", None) == window and getattr(attn, "sliding_window_size", None) == window:
        self.sliding_window = attn.sliding_window_size = window - 1
    return result


class Gemma4WindowFix(Fix):
    name = NAME
    summary = "Gemma 4 sliding layers attend the model's window (config.sliding_window - 1 in sglang's terms)"
    upstream_prs = ("#26147",)
    targets = (TARGET,)
    target_params = {TARGET: ("self", "layer_id", "config")}
    check_module = "sglang_swa_plugin.check.gemma4_window"

    def detect(self) -> Detection:
        return classify()


FIX = Gemma4WindowFix()
