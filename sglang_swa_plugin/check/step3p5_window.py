"""CPU scenario of ``step3p5_window``: sglang's real Step3.5 target and MTP draft models (the
selftest's tiny Step3.5 config: 45 layers, window 16, tensor parallelism of one process) and
the number of keys a query far past the window attends, three ways: the model's
(transformers' sliding-window mask, the one its Step3p7 text model builds), each sliding
layer's (sglang's rule ``q - k <= sliding_window_size`` on the RadixAttention it built) and the
model runner's (the model's ``get_attention_sliding_window_size``, else the config's window).
Right: all three agree on every sliding layer of both models, full layers have no window.
``python -m sglang_swa_plugin.check.step3p5_window`` prints one JSON line."""

from __future__ import annotations

from types import SimpleNamespace

from . import Outcome, print_outcome
from .gemma4_window import QUERY, _model_keys, _sglang_keys
from .mimo_v2_window import _dp_attention_of_one, _runner_window
from .testbed import tensor_parallel_of_one


def config(**changes):
    """sglang's Step3p5Config of the selftest's tiny Step3.5 (what its ModelConfig loads from
    the checkpoint's config.json), with ``changes`` (the draft's architecture)."""
    from sglang.srt.configs.step3p5 import Step3p5Config

    from sglang_swa_plugin.selftest.targets import step3p5

    cfg = Step3p5Config(**{**step3p5.sglang_config(), **changes})
    cfg.encoder_only = False  # what sglang's ModelConfig sets
    return cfg


def build(cls, cfg, seen: dict):
    """``cls(cfg)``, with sglang's rotary embedding where it builds on this machine; where its CPU
    fallback imports vLLM's custom ops, step3p5's rope factory is recorded instead
    (``seen["rope"]``): the window is set apart from it."""
    import sys

    import torch

    from sglang_swa_plugin.probe import swapped

    try:
        model = cls(cfg)
        seen.setdefault("rope", "sglang's")
        return model
    except ModuleNotFoundError as e:
        if "vllm" not in str(e):
            raise
    with swapped(sys.modules["sglang.srt.models.step3p5"], "get_rope", lambda *a, **k: torch.nn.Identity()):
        seen["rope"] = "recorded (no vLLM custom ops on this machine)"
        return cls(cfg)


def scenario() -> Outcome:
    """Keys attended by a query past the window in a real Step3.5 target and MTP draft: the
    model's (transformers' mask), each layer's RadixAttention's and the model runner's window.
    ``seen``: per layer, the three counts (target layers 0-3 and the MTP's layer)."""
    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.probe import optional_module
    from sglang_swa_plugin.selftest.targets import step3p5

    module, mtp = optional_module("sglang.srt.models.step3p5"), optional_module("sglang.srt.models.step3p5_mtp")
    if module is None:
        raise ScenarioUnavailable("this sglang has no Step3.5 model")
    tensor_parallel_of_one()
    cfg = config()
    _dp_attention_of_one(cfg)
    window = cfg.sliding_window
    seen, bug = {}, False
    models = {"target": build(module.Step3p5ForCausalLM, cfg, seen)}
    if mtp is not None:
        models["mtp"] = build(mtp.Step3p5MTP, config(architectures=["Step3p5MTP"]), seen)
    model_keys = _model_keys(SimpleNamespace(sliding_window=window), "sliding_attention")
    for name, model in models.items():
        runner = _runner_window(model, window)
        layers = [model.model.mtp_block] if name == "mtp" else list(model.model.layers)[:4]
        for i, layer in enumerate(layers):
            size = layer.self_attn.attn.sliding_window_size
            sliding = step3p5.ALL_TYPES[step3p5.L + i if name == "mtp" else i] == "sliding_attention"
            got = {"model": model_keys if sliding else QUERY + 1, "layer": _sglang_keys(size),
                   "runner": _sglang_keys(runner) if sliding else QUERY + 1, "sliding_window_size": size}
            bug |= not got["model"] == got["layer"] == got["runner"]
            seen[f"{name}_{i}"] = got
    return Outcome(bug, seen)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
