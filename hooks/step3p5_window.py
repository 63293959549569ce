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

from sglang_swa_plugin.fix import Detection, Fix, TargetMissing, around
from sglang_swa_plugin.model_window import MODEL_METHOD as MODEL_METHOD  # the tests read it here
from sglang_swa_plugin.model_window import class_def, layer_window, runner_window, stock_form
from sglang_swa_plugin.probe import module_tree

NAME = "step3p5_window"
MODULE, MTP_MODULE = "sglang.srt.models.step3p5", "sglang.srt.models.step3p5_mtp"
VL_MODULE = "sglang.srt.models.step3p7"  # 0.5.13+: Step3.7, whose language model is Step3p5ForCausalLM
LAYER = f"{MODULE}.Step3p5Attention.__init__"
MODELS = (f"{MODULE}.Step3p5ForCausalLM.__init__", f"{MTP_MODULE}.Step3p5MTP.__init__",
          f"{VL_MODULE}.Step3p7ForConditionalGeneration.__init__")
TARGETS = (LAYER, *MODELS)


def classify() -> Detection:
    tree = module_tree(MODULE)
    if tree is None:
        return Detection.not_applicable("this sglang has no Step3.5 model")
    other = stock_form("Step3.5", tree, "Step3p5DecoderLayer", "sliding_window")
    if other is not None:
        return other
    hooks = [around(LAYER, _layer_window), around(MODELS[0], _runner_window)]
    for module, target in ((MTP_MODULE, MODELS[1]), (VL_MODULE, MODELS[2])):
        tree = module_tree(module)
        if tree is None:
            continue  # this sglang has no such model (Step3.7: 0.5.13+)
        if class_def(tree, target.split(".")[-2]) is None:
            raise TargetMissing(target, f"{module} no longer defines it")
        hooks.append(around(target, _runner_window))
    return Detection.needed("Step3.5's sliding layers get config.sliding_window: one key more than the model", *hooks)


_layer_window = layer_window()  # around Step3p5Attention.__init__
# After a Step3.5 model's ``__init__`` (target, MTP draft, Step3.7's wrapper whose text config
# is Step3.5's): the runner gets its layers' window.
_runner_window = runner_window(lambda config: getattr(getattr(config, "text_config", config), "sliding_window", None))


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
