"""CPU scenario of ``mimo_v2_window``: sglang's real MiMo-V2 target and MTP draft models (the
selftest's tiny MiMo-V2 config, window 16, tensor parallelism of one process) and the number of
keys a query far past the window attends, three ways: the model's (transformers' own
sliding-window mask), each sliding layer's (sglang's rule ``q - k <= sliding_window_size`` on
the RadixAttention it built) and the model runner's (its window rule for this model: the
model's ``get_attention_sliding_window_size``, else the config's window; it sizes triton's
rail). Right: all three agree on every sliding layer of both models, full layers have no window.
``python -m sglang_swa_plugin.check.mimo_v2_window`` prints one JSON line."""

from __future__ import annotations

from types import SimpleNamespace

from . import Outcome, print_outcome
from .gemma4_window import QUERY, _model_keys, _sglang_keys
from .testbed import tensor_parallel_of_one


def _runner_window(model, window: int):
    """The runner's window for ``model``: sglang's own rule where it is a function (0.5.16+:
    ``resolve_sliding_window_size``), else the same rule as the runner's method states it."""
    from sglang_swa_plugin.probe import optional_module

    rule = getattr(optional_module("sglang.srt.model_executor.model_runner_components.load_model_utils"),
                   "resolve_sliding_window_size", None)
    if rule is not None:
        return rule(model, SimpleNamespace(is_hybrid_swa=True, sliding_window_size=window, attention_chunk_size=None))
    return model.get_attention_sliding_window_size() if hasattr(model, "get_attention_sliding_window_size") else window


def _dp_attention_of_one(config) -> None:
    """Releases whose model layers read the attention data-parallel sizes at build time
    (0.5.11+ where not yet set): sglang's own initialisation for one CPU process without DP
    attention, once. The process's published server args, on the CPU (another scenario may
    have published them without a device)."""
    import copy

    import torch

    from sglang_swa_plugin.probe import optional_module

    dp = optional_module("sglang.srt.layers.dp_attention")
    if dp is None or getattr(dp, "_ATTN_DP_SIZE", 0) is not None or not hasattr(dp, "initialize_dp_attention"):
        return
    from sglang.srt.server_args import get_global_server_args

    args = copy.copy(get_global_server_args())  # no __post_init__: the same fields
    args.device = "cpu"
    dp.initialize_dp_attention(args, SimpleNamespace(hf_config=config, hidden_size=config.hidden_size,
                                                     dtype=torch.bfloat16))


def _build(cls, config, seen: dict):
    """``cls(config)``; where sglang's rotary embedding cannot be built on this machine (its CPU
    fallback imports vLLM's custom ops) the rope factory is recorded instead (``seen["rope"]``)."""
    import sys

    import torch

    from sglang_swa_plugin.probe import swapped

    try:
        model = cls(config)
        seen.setdefault("rope", "sglang's")
        return model
    except ModuleNotFoundError as e:
        if "vllm" not in str(e):
            raise
    module = sys.modules[cls.__module__]
    base = sys.modules[module.MiMoV2Attention.__module__]
    with swapped(base, "get_rope", lambda *a, **k: torch.nn.Identity()):
        seen["rope"] = "recorded (no vLLM custom ops on this machine)"
        return cls(config)


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
    tensor_parallel_of_one()
    config = PretrainedConfig(**mimo_v2.sglang_config())
    config.encoder_only = False
    _dp_attention_of_one(config)
    window = config.sliding_window_size
    seen, bug = {}, False
    models = {"target": _build(getattr(module, model_class), config, seen)}
    if nextn is not None:
        draft = PretrainedConfig(**{**mimo_v2.sglang_config(), "architectures": ["MiMoV2MTP"],
                                    "num_nextn_predict_layers": 1})
        draft.encoder_only = False
        models["mtp"] = _build(nextn.MiMoV2MTP, draft, seen)
    model_keys = _model_keys(SimpleNamespace(sliding_window=window), "sliding_attention")
    for name, model in models.items():
        runner = _runner_window(model, window)
        layers = [model.model.mtp_block] if name == "mtp" else list(model.model.layers)
        for i, layer in enumerate(layers):
            size = layer.self_attn.attn.sliding_window_size
            sliding = name == "mtp" or mimo_v2.LAYER_TYPES[i] == "sliding_attention"
            got = {"model": model_keys if sliding else QUERY + 1, "layer": _sglang_keys(size),
                   "runner": _sglang_keys(runner) if sliding else QUERY + 1, "sliding_window_size": size}
            bug |= not got["model"] == got["layer"] == got["runner"]
            seen[f"{name}_{i}"] = got
    return Outcome(bug, seen)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
