"""CPU scenario of ``step3p5_window``: sglang's real Step3.5 target and MTP draft models (the
selftest's tiny Step3.5 config: 4 layers, its MTP checkpoint's 45, window 16, tensor parallelism of
one process) and
the number of keys a query far past the window attends, three ways: the model's
(transformers' sliding-window mask, the one its Step3p7 text model builds), each sliding
layer's (sglang's rule ``q - k <= sliding_window_size`` on the RadixAttention it built) and the
model runner's (the model's ``get_attention_sliding_window_size``, else the config's window).
Right: all three agree on every sliding layer of both models, full layers have no window.
``python -m sglang_swa_plugin.check.step3p5_window`` prints one JSON line."""

from __future__ import annotations

from . import Outcome, print_outcome
from .model_window import build, one_process, window_outcome

MODULE = "sglang.srt.models.step3p5"


def config(depth=None, **changes):
    """sglang's Step3p5Config of the selftest's tiny Step3.5 (what its ModelConfig loads from
    the checkpoint's config.json; ``depth``: the decoder layers it declares, the MTP
    checkpoint's DRAFT_DEPTH), with ``changes`` (the draft's architecture)."""
    from sglang.srt.configs.step3p5 import Step3p5Config

    from sglang_swa_plugin.selftest.targets import step3p5

    cfg = Step3p5Config(**{**step3p5.sglang_config(depth=depth or step3p5.L), **changes})
    cfg.encoder_only = False  # what sglang's ModelConfig sets
    return cfg


def scenario() -> Outcome:
    """Keys attended by a query past the window in a real Step3.5 target and MTP draft: the
    model's (transformers' mask), each layer's RadixAttention's and the model runner's window.
    ``seen``: per layer, the three counts (target layers 0-3 and the MTP's layer)."""
    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.probe import optional_module
    from sglang_swa_plugin.selftest.targets import step3p5

    module, mtp = optional_module(MODULE), optional_module("sglang.srt.models.step3p5_mtp")
    if module is None:
        raise ScenarioUnavailable("this sglang has no Step3.5 model")
    cfg = config()
    one_process(cfg)
    seen = {}
    models = {"target": build(module.Step3p5ForCausalLM, cfg, seen, MODULE)}
    if mtp is not None:
        draft = config(step3p5.DRAFT_DEPTH, architectures=["Step3p5MTP"])
        models["mtp"] = build(mtp.Step3p5MTP, draft, seen, MODULE)
    return window_outcome(models, cfg.sliding_window, seen=seen, layers=step3p5.L, sliding=lambda name, i: name == "mtp"
                          or step3p5.LAYER_TYPES[i] == "sliding_attention")


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
