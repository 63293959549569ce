"""What the scenarios of the model-window fixes (``gemma4_window``, ``mimo_v2_window``,
``step3p5_window``) share: the number of keys a query far past the window (``QUERY``) attends
under transformers' mask (``model_keys``) and under sglang's rule (``sglang_keys``); for the
MTP models, sglang's real target and MTP draft models built on the CPU (tensor parallelism of
one process, no DP attention) and, per layer, those keys three ways: the model's
(transformers' own sliding-window mask), the layer's (sglang's rule ``q - k <=
sliding_window_size`` on the RadixAttention it built) and the model runner's (its window rule
for the model: the model's ``get_attention_sliding_window_size``, else the config's
window). Right: all three agree on every sliding layer, full layers have no window."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Dict, Optional

from . import Outcome
from .testbed import tensor_parallel_of_one

QUERY = 40  # a position far past the window


def model_keys(window: int) -> int:
    """Keys query ``QUERY`` attends under transformers' own sliding-window mask of ``window``."""
    import torch
    from transformers import masking_utils as mu

    mask = mu.and_masks(mu.causal_mask_function, mu.sliding_window_overlay(window))
    q, zero = torch.tensor(QUERY), torch.tensor(0)
    return sum(bool(mask(zero, zero, q, torch.tensor(k))) for k in range(QUERY + 1))


def sglang_keys(window) -> int:
    """Keys query ``QUERY`` attends under sglang's rule ``q - k <= window`` (-1/None: all)."""
    return QUERY + 1 if window is None or window < 0 else sum(QUERY - k <= window for k in range(QUERY + 1))


def runner_window(model, window: int):
    """The runner's window for ``model``: sglang's own rule where it is a function (0.5.16+:
    ``resolve_sliding_window_size``), else the same rule as the runner's method states it."""
    from sglang_swa_plugin.probe import optional_module

    rule = getattr(optional_module("sglang.srt.model_executor.model_runner_components.load_model_utils"),
                   "resolve_sliding_window_size", None)
    if rule is not None:
        return rule(model, SimpleNamespace(is_hybrid_swa=True, sliding_window_size=window, attention_chunk_size=None))
    return model.get_attention_sliding_window_size() if hasattr(model, "get_attention_sliding_window_size") else window


def dp_attention_of_one(config) -> None:
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


def one_process(config) -> None:
    """sglang's parallel state of one CPU process, to build ``config``'s models in."""
    tensor_parallel_of_one()
    dp_attention_of_one(config)


def build(cls, config, seen: dict, rope_module: str):
    """``cls(config)``; where sglang's rotary embedding cannot be built on this machine (its CPU
    fallback imports vLLM's custom ops), the rope factory of ``rope_module`` is recorded instead
    (``seen["rope"]``): the window is set apart from it."""
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
    with swapped(sys.modules[rope_module], "get_rope", lambda *a, **k: torch.nn.Identity()):
        seen["rope"] = "recorded (no vLLM custom ops on this machine)"
        return cls(config)


def window_outcome(models: Dict[str, object], window: int, sliding: Callable[[str, int], bool], seen: dict,
                   layers: Optional[int] = None) -> Outcome:
    """Per layer of ``models`` ({"target": ..., "mtp": ...}: the MTP's one block, the target's
    first ``layers``), the keys attended three ways, in ``seen[f"{model}_{i}"]``; ``sliding(model,
    i)``: whether that layer is a sliding one for the model."""
    bug = False
    sliding_keys = model_keys(window)
    for name, model in models.items():
        runner = runner_window(model, window)
        blocks = [model.model.mtp_block] if name == "mtp" else list(model.model.layers)[:layers]
        for i, layer in enumerate(blocks):
            size = layer.self_attn.attn.sliding_window_size
            on = sliding(name, i)
            got = {"model": sliding_keys if on else QUERY + 1, "layer": sglang_keys(size),
                   "runner": sglang_keys(runner) if on else QUERY + 1, "sliding_window_size": size}
            bug |= not got["model"] == got["layer"] == got["runner"]
            seen[f"{name}_{i}"] = got
    return Outcome(bug, seen)
