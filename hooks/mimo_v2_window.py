"""MiMo-V2: sliding layers attend the window the model defines, not one key more.
Bug
    MiMo-V2's decoder and MTP layers hand ``config.sliding_window_size`` to ``RadixAttention``,
    which sglang reads as the distance to the oldest key (``q - k <= size``), and the runner
    takes the same value for its window: every sliding layer attends one key more than the
    model (transformers' MiMoV2FlashForCausalLM: keys at distance 0 .. window - 1), on every
    backend. Fix: a MiMoV2Attention built with a window gets ``size - 1``, and the target and
    MTP models give the runner ``config.sliding_window_size - 1`` (as GPT-OSS's own method).
Upstream PRs
    None known.
Affected versions
    0.5.10-0.5.23 (models/mimo_v2_flash.py in 0.5.10, models/mimo_v2.py from 0.5.11).
    Status by release: applied 0.5.10+.
Detection
    Structural, from the source files (not imported to decide): ``MiMoV2DecoderLayer`` passes
    ``sliding_window_size=config.sliding_window_size`` and no class of the module defines
    ``get_attention_sliding_window_size``: needed; a window minus one or such a method: not
    needed; anything else: unknown.
Delete when
    sglang's MiMo-V2 layers attend ``config.sliding_window_size`` keys.
"""

from __future__ import annotations

import ast
import functools
from typing import Optional

from sglang_swa_plugin.fix import Detection, Fix, argument, around, hookimpl, with_argument
from sglang_swa_plugin.probe import module_tree

NAME = "mimo_v2_window"
FORMS = (("sglang.srt.models.mimo_v2", "sglang.srt.models.mimo_v2_nextn", "MiMoV2ForCausalLM"),  # 0.5.11+
         ("sglang.srt.models.mimo_v2_flash", "sglang.srt.models.mimo_v2_flash_nextn", "MiMoV2FlashForCausalLM"))
TARGETS = tuple(t for module, nextn, model in FORMS
                for t in (f"{module}.MiMoV2Attention.__init__", f"{module}.{model}.__init__", f"{nextn}.MiMoV2MTP.__init__"))
MODEL_METHOD = "get_attention_sliding_window_size"


def _form() -> Optional[tuple]:
    return next((form for form in FORMS if module_tree(form[0]) is not None), None)


def _window_keywords(tree, cls: str) -> list:
    """The values ``cls.__init__`` passes as ``sliding_window_size=`` other than -1."""
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
    return [k.value for k in ast.walk(node) if isinstance(k, ast.keyword) and k.arg == "sliding_window_size"
            and not (isinstance(k.value, ast.UnaryOp) and isinstance(k.value.op, ast.USub))] if node else []


def _config_window(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "sliding_window_size" and isinstance(node.value, ast.Name)


def classify() -> Detection:
    form = _form()
    if form is None:
        return Detection.not_applicable("this sglang has no MiMo-V2 model")
    tree = module_tree(form[0])
    if any(isinstance(n, ast.FunctionDef) and n.name == MODEL_METHOD for n in ast.walk(tree)):
        return Detection.not_needed(f"MiMo-V2 defines {MODEL_METHOD}")
    values = _window_keywords(tree, "MiMoV2DecoderLayer")
    if len(values) != 1:
        return Detection.unknown("MiMoV2DecoderLayer no longer passes one sliding_window_size")
    if isinstance(values[0], ast.BinOp) and isinstance(values[0].op, ast.Sub):
        return Detection.not_needed("MiMoV2DecoderLayer passes a window minus one")
    if _config_window(values[0]):
        module, nextn, model = form
        hooks = [around(f"{module}.MiMoV2Attention.__init__", _layer_window),
                 around(f"{module}.{model}.__init__", _runner_window)]
        if module_tree(nextn) is not None:
            hooks.append(around(f"{nextn}.MiMoV2MTP.__init__", _runner_window))
        return Detection.needed("MiMo-V2's sliding layers get config.sliding_window_size: one key more than the model",
                                *hooks)
    return Detection.unknown("MiMoV2DecoderLayer's window is not config.sliding_window_size")


def _layer_window(original, self, *args, **kwargs):
    """Around ``MiMoV2Attention.__init__``: a window ``size`` (> 0) is built as ``size - 1``, the
    rule of sglang's RadixAttention for ``size`` keys."""
    size = argument(original, "sliding_window_size", args, kwargs)
    if isinstance(size, int) and size > 0:
        args, kwargs = with_argument(original, "sliding_window_size", size - 1, args, kwargs)
    return original(self, *args, **kwargs)


def _runner_window(original, self, *args, **kwargs):
    """After a MiMo-V2 model's ``__init__``: the model gives the runner (which asks
    ``get_attention_sliding_window_size`` before the config) the window of its layers."""
    result = original(self, *args, **kwargs)
    window = getattr(argument(original, "config", args, kwargs), "sliding_window_size", None)
    if isinstance(window, int) and window > 0 and not hasattr(self, MODEL_METHOD):
        self.get_attention_sliding_window_size = functools.partial(int, window - 1)
    return result


class MiMoV2WindowFix(Fix):
    name = NAME
    summary = "MiMo-V2 sliding layers attend the model's window (config.sliding_window_size - 1 in sglang's terms)"
    upstream_prs = ()
    targets = TARGETS
    target_params = {t: (("self", "hidden_size") if "Attention" in t else ("self", "config")) for t in TARGETS}
    check_module = "sglang_swa_plugin.check.mimo_v2_window"

    def detect(self) -> Detection:
        return classify()


FIX = MiMoV2WindowFix()


@hookimpl
def sglang_swa_plugin_fixes():
    return [FIX]
