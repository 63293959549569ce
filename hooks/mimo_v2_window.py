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

from typing import Optional

from sglang_swa_plugin.fix import Detection, Fix, around
from sglang_swa_plugin.model_window import MODEL_METHOD as MODEL_METHOD  # the tests read it here
from sglang_swa_plugin.model_window import layer_window, runner_window, stock_form
from sglang_swa_plugin.probe import module_tree

NAME = "mimo_v2_window"
LAYER = "MiMoV2DecoderLayer"
FORMS = (("sglang.srt.models.mimo_v2", "sglang.srt.models.mimo_v2_nextn", "MiMoV2ForCausalLM"),  # 0.5.11+
         ("sglang.srt.models.mimo_v2_flash", "sglang.srt.models.mimo_v2_flash_nextn", "MiMoV2FlashForCausalLM"))
TARGETS = tuple(t for module, nextn, model in FORMS for t in (
    f"{module}.MiMoV2Attention.__init__", f"{module}.{model}.__init__", f"{nextn}.MiMoV2MTP.__init__"))


def _form() -> Optional[tuple]:
    return next((form for form in FORMS if module_tree(form[0]) is not None), None)


def classify() -> Detection:
    form = _form()
    if form is None:
        return Detection.not_applicable("this sglang has no MiMo-V2 model")
    tree = module_tree(form[0])
    other = stock_form("MiMo-V2", tree, LAYER, "sliding_window_size")
    if other is not None:
        return other
    module, nextn, model = form
    hooks = [around(f"{module}.MiMoV2Attention.__init__", _layer_window),
             around(f"{module}.{model}.__init__", _runner_window)]
    if module_tree(nextn) is not None:
        hooks.append(around(f"{nextn}.MiMoV2MTP.__init__", _runner_window))
    return Detection.needed("MiMo-V2's sliding layers get config.sliding_window_size: one key more than the model",
                            *hooks)


_layer_window = layer_window()  # around MiMoV2Attention.__init__
# After a MiMo-V2 model's ``__init__`` (target, MTP draft): the runner gets its layers' window.
_runner_window = runner_window(lambda config: getattr(config, "sliding_window_size", None))


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
