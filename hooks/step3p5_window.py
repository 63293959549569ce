"""Step3.5: sliding layers attend the window the model defines, not one key more.
Bug
    Step3.5's decoder and MTP layers hand ``config.sliding_window`` to ``RadixAttention``, which
    sglang reads as the distance to the oldest key (``q - k <= size``), and the runner takes the
    same value for its window: every sliding layer attends one key more than the model
    (transformers' Step3p7 text model, Step3.5's architecture: keys at distance 0 .. window - 1),
    on every backend. Fix: a Step3p5Attention built with a window gets ``size - 1``, and the
    target, MTP and Step3.7 models give the runner ``sliding_window - 1``.
Upstream PRs
    None known.
Affected versions
    0.5.10-0.5.23 (models/step3p5.py, models/step3p5_mtp.py; models/step3p7.py where present).
    Status by release: applied 0.5.10+.
Detection
    Structural, from the source file (not imported to decide): ``Step3p5DecoderLayer`` passes
    a window it sets from ``config.sliding_window`` and no class of the module defines
    ``get_attention_sliding_window_size``: needed; a window minus one or such a method: not
    needed; anything else: unknown.
Delete when
    sglang's Step3.5 layers attend ``config.sliding_window`` keys.
"""

from __future__ import annotations

import ast
import functools
from typing import Optional

from sglang_swa_plugin.fix import Detection, Fix, TargetMissing, argument, around, hookimpl, with_argument
from sglang_swa_plugin.probe import module_tree

NAME = "step3p5_window"
MODULE, MTP_MODULE = "sglang.srt.models.step3p5", "sglang.srt.models.step3p5_mtp"
VL_MODULE = "sglang.srt.models.step3p7"  # 0.5.13+: Step3.7, whose language model is Step3p5ForCausalLM
LAYER = f"{MODULE}.Step3p5Attention.__init__"
MODELS = (f"{MODULE}.Step3p5ForCausalLM.__init__", f"{MTP_MODULE}.Step3p5MTP.__init__",
          f"{VL_MODULE}.Step3p7ForConditionalGeneration.__init__")
TARGETS = (LAYER, *MODELS)
MODEL_METHOD = "get_attention_sliding_window_size"


def _class(tree, name: str) -> Optional[ast.ClassDef]:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None) if tree else None


def layer_windows(tree) -> list:
    """The windows ``Step3p5DecoderLayer`` gives its attention other than -1: the value of
    ``sliding_window_size=``, through ``self.<name>``'s assignments where it passes an attribute
    of its own (None: no such layer or keyword)."""
    layer = _class(tree, "Step3p5DecoderLayer")
    if layer is None:
        return []
    passed = [k.value for k in ast.walk(layer) if isinstance(k, ast.keyword) and k.arg == "sliding_window_size"]
    values = []
    for value in passed:
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "self":
            values += [n.value for n in ast.walk(layer) if isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == value.attr and isinstance(t.value, ast.Name)
                and t.value.id == "self" for t in n.targets)]
        else:
            values.append(value)
    return [v for v in values if not (isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub))]


def _config_window(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "sliding_window" and isinstance(node.value, ast.Name)


def classify() -> Detection:
    tree = module_tree(MODULE)
    if tree is None:
        return Detection.not_applicable("this sglang has no Step3.5 model")
    if any(isinstance(n, ast.FunctionDef) and n.name == MODEL_METHOD for n in ast.walk(tree)):
        return Detection.not_needed(f"Step3.5 defines {MODEL_METHOD}")
    values = layer_windows(tree)
    if len(values) != 1:
        return Detection.unknown("Step3p5DecoderLayer no longer sets one sliding window")
    if isinstance(values[0], ast.BinOp) and isinstance(values[0].op, ast.Sub):
        return Detection.not_needed("Step3p5DecoderLayer passes a window minus one")
    if not _config_window(values[0]):
        return Detection.unknown("Step3p5DecoderLayer's window is not config.sliding_window")
    hooks = [around(LAYER, _layer_window), around(MODELS[0], _runner_window)]
    for module, target in ((MTP_MODULE, MODELS[1]), (VL_MODULE, MODELS[2])):
        tree = module_tree(module)
        if tree is None:
            continue  # this sglang has no such model (Step3.7: 0.5.13+)
        if _class(tree, target.split(".")[-2]) is None:
            raise TargetMissing(target, f"{module} no longer defines it")
        hooks.append(around(target, _runner_window))
    return Detection.needed("Step3.5's sliding layers get config.sliding_window: one key more than the model", *hooks)


def _layer_window(original, self, *args, **kwargs):
    """Around ``Step3p5Attention.__init__``: a window ``size`` (> 0) is built as ``size - 1``,
    the rule of sglang's RadixAttention for ``size`` keys."""
    size = argument(original, "sliding_window_size", args, kwargs)
    if isinstance(size, int) and size > 0:
        args, kwargs = with_argument(original, "sliding_window_size", size - 1, args, kwargs)
    return original(self, *args, **kwargs)


def _runner_window(original, self, *args, **kwargs):
    """After a Step3.5 model's ``__init__`` (target, MTP draft, Step3.7's wrapper whose text
    config is Step3.5's): the model gives the runner (which asks
    ``get_attention_sliding_window_size`` before the config) the window of its layers."""
    result = original(self, *args, **kwargs)
    config = argument(original, "config", args, kwargs)
    window = getattr(getattr(config, "text_config", config), "sliding_window", None)
    if isinstance(window, int) and window > 0 and not hasattr(self, MODEL_METHOD):
        self.get_attention_sliding_window_size = functools.partial(int, window - 1)
    return result


class Step3p5WindowFix(Fix):
    name = NAME
    summary = "Step3.5 sliding layers attend the model's window (config.sliding_window - 1 in sglang's terms)"
    upstream_prs = ()
    targets = TARGETS
    target_params = {t: (("self", "hidden_size") if t == LAYER else ("self", "config")) for t in TARGETS}
    check_module = "sglang_swa_plugin.check.step3p5_window"

    def detect(self) -> Detection:
        return classify()


FIX = Step3p5WindowFix()


@hookimpl
def sglang_swa_plugin_fixes():
    return [FIX]
