"""CPU scenario of ``gemma4_window``: a real ``Gemma4Attention`` of each layer type (sglang's own
class, a tiny ``Gemma4TextConfig`` with window 16, tensor parallelism of one process) and
the number of keys a query far past the window attends, three ways: the model's (transformers'
own sliding-window mask for that config), the attention layer's (sglang's rule ``q - k <=
sliding_window_size`` on the ``RadixAttention`` the layer built) and the model runner's
(``get_attention_sliding_window_size``, which sizes the SWA pool and triton's rail). Right:
all three agree on every sliding layer, and full layers have no window.
``python -m sglang_swa_plugin.check.gemma4_window`` prints one JSON line."""

from __future__ import annotations

from . import Outcome, print_outcome
from .model_window import QUERY, model_keys, sglang_keys
from .testbed import tensor_parallel_of_one

MODULE = "sglang.srt.models.gemma4_causal"
WINDOW = 16
HEAD_DIM, MAX_POSITIONS = 16, 128
LAYER_TYPES = ("sliding_attention", "full_attention")


def _layer(g4, layer_id: int, config, seen: dict):
    """``Gemma4Attention(layer_id, config, ...)``. Where sglang's rotary embedding cannot be
    built (its CPU fallback imports vLLM's custom ops), the rope factory is recorded instead:
    the window is set apart from it (``seen["rope"]`` says which)."""
    import torch

    from sglang_swa_plugin.probe import swapped

    args = (layer_id, config, HEAD_DIM, MAX_POSITIONS)  # not read from config: per-layer there in newer transformers
    try:
        layer = g4.Gemma4Attention(*args)
        seen.setdefault("rope", "sglang's")
        return layer
    except ModuleNotFoundError as e:
        if "vllm" not in str(e):
            raise
    with swapped(g4, "get_rope", lambda *a, **k: torch.nn.Identity()):
        seen["rope"] = "recorded (no vLLM custom ops on this machine)"
        return g4.Gemma4Attention(*args)


def scenario() -> Outcome:
    """Keys attended by a query past the window on each layer type of a real Gemma4Attention:
    the model's (transformers' mask), the layer's RadixAttention's and the model runner's
    window. ``seen``: per layer type, the three counts."""
    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.probe import optional_module

    g4 = optional_module(MODULE)
    if g4 is None or not hasattr(g4, "Gemma4Attention"):
        raise ScenarioUnavailable(f"this sglang has no {MODULE}.Gemma4Attention")
    from transformers import Gemma4TextConfig

    tensor_parallel_of_one()
    config = Gemma4TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=len(LAYER_TYPES),
                              num_attention_heads=2, num_key_value_heads=1, head_dim=HEAD_DIM, sliding_window=WINDOW,
                              layer_types=list(LAYER_TYPES), max_position_embeddings=MAX_POSITIONS)
    runner_window = g4.get_attention_sliding_window_size(config)
    seen, bug = {}, False
    for layer_id, layer_type in enumerate(LAYER_TYPES):
        layer = _layer(g4, layer_id, config, seen)
        sliding = layer_type == "sliding_attention"
        got = {"model": model_keys(config.sliding_window) if sliding else QUERY + 1,
               "layer": sglang_keys(layer.attn.sliding_window_size),
               "runner": sglang_keys(runner_window) if sliding else QUERY + 1,
               "sliding_window_size": layer.attn.sliding_window_size}
        bug |= not got["model"] == got["layer"] == got["runner"]
        seen[layer_type] = got
    return Outcome(bug, seen)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
