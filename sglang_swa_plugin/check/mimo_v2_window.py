"""CPU scenario of ``mimo_v2_window``: sglang's real MiMo-V2 target and MTP draft models (the
selftest's tiny MiMo-V2 config, window 16, tensor parallelism of one process) and the number of
keys a query far past the window attends, three ways: the model's (transformers' own
sliding-window mask), each sliding layer's (sglang's rule ``q - k <= sliding_window_size`` on
the RadixAttention it built) and the model runner's (its window rule for this model: the
model's ``get_attention_sliding_window_size``, else the config's window; it sizes triton's
rail). Right: all three agree on every sliding layer of both models, full layers have no window.
``python -m sglang_swa_plugin.check.mimo_v2_window`` prints one JSON line."""

from __future__ import annotations

from . import Outcome, print_outcome
from .model_window import build, one_process, window_outcome


def scenario() -> Outcome:
    """Keys attended by a query past the window in a real MiMo-V2 target and MTP draft: the
    model's (transformers' mask), each layer's RadixAttention's and the model runner's window.
    ``seen``: per layer, the three counts."""
    from transformers import PretrainedConfig

    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.hooks.mimo_v2_window import FORMS
    from sglang_swa_plugin.probe import optional_module
    from sglang_swa_plugin.selftest.targets import mimo_v2

    form = next(((optional_module(m), optional_module(n), c) for m, n, c in FORMS if optional_module(m) is not None), None)
    if form is None:
        raise ScenarioUnavailable("this sglang has no MiMo-V2 model")
    module, nextn, model_class = form
    config = PretrainedConfig(**mimo_v2.sglang_config())
    config.encoder_only = False
    one_process(config)
    rope, seen = module.MiMoV2Attention.__module__, {}
    models = {"target": build(getattr(module, model_class), config, seen, rope)}
    if nextn is not None:
        draft = PretrainedConfig(**{**mimo_v2.sglang_config(), "architectures": ["MiMoV2MTP"],
                                    "num_nextn_predict_layers": 1})
        draft.encoder_only = False
        models["mtp"] = build(nextn.MiMoV2MTP, draft, seen, rope)
    return window_outcome(models, config.sliding_window_size, seen=seen, sliding=lambda name, i: name == "mtp"
                          or mimo_v2.LAYER_TYPES[i] == "sliding_attention")


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
