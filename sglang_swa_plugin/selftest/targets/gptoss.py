"""A tiny GPT-OSS (sliding/full/sliding/full, window 16, attention sinks, 4 experts) whose greedy
output is decided by its sliding-window layer with bf16-safe margins, and its float32 reference
from transformers' own GptOssForCausalLM (its sliding-window mask and sinks).

    python -m sglang_swa_plugin.selftest.targets.gptoss [--seeds 1,2,3]   # checks of the target (CPU)

With an EAGLE3 draft with real weights (readout.design_draft). The every-layer design of
``readout`` (LAYERS): layer 0 (sliding) attends the OLDEST key its window lets it see (vote A:
a window of 15 or 17 instead of 16 changes most requests) and, on half of its heads, the key
the next position's oldest read will be (the draft's lookahead); layer 2 (sliding) the previous
token (B); layers 1 and 3 (full) the first token (C, one vote between them). 8 query heads, 8 KV
heads, each head writing its own slice of the code. Every expert's down projection and every
bias is zero; the sinks are -1000 (no weight next to scores of this size). transformers'
GPT-OSS keeps the keys at distance 0 .. window - 1 (window keys).
"""

from __future__ import annotations

import os

from . import readout
from .readout import H, HD, THETA, V, greedy, prompts  # noqa: F401 (greedy, prompts: the scenario's)

NH, NKV, FF, L, E = 8, 8, 256, 4, 4
WINDOW = 16
SINK = -1000.0
# (vote, read) per layer (readout.design_layer): sliding, full, sliding, full
LAYERS = (("A", f"ramp/look{WINDOW - 2}"), ("C", "first"), ("B", "peak"), ("C", "first"))

# What the selftest reads of a target: its name, the model class sglang serves and the
# transformers class of the reference, the size whose exact value decides the tokens, and
# whether it has an EAGLE3 draft.
TITLE, ARCHITECTURE, REFERENCE_CLASS = "GPT-OSS", "GptOssForCausalLM", "GptOssForCausalLM"
SIZE, LABEL, HAS_DRAFT = WINDOW, "window", True
# The float32 greedy tokens of the first two prompts of seed 1 (readout.prompts(2, 60, 1)), 12
# new ones: what the tests pin (a change of the design changes them).
PINNED = [[1647, 1692, 1796, 1632, 1713, 1627, 1626, 1704, 1686, 1665, 1700, 1754],
          [1626, 1660, 1691, 1567, 1628, 1679, 1658, 1727, 1758, 1625, 1646, 1621]]


def config(window: int = WINDOW):
    from transformers import GptOssConfig

    cfg = GptOssConfig(
        vocab_size=V, hidden_size=H, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=NH,
        num_key_value_heads=NKV, head_dim=HD, num_local_experts=E, num_experts_per_tok=2, sliding_window=window,
        max_position_embeddings=4096, layer_types=["sliding_attention", "full_attention"] * 2,
        tie_word_embeddings=False, swiglu_limit=7.0, hidden_act="silu", initializer_range=0.1,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
    )
    cfg.architectures = ["GptOssForCausalLM"]
    cfg.torch_dtype = "bfloat16"
    return cfg


def weights(seed: int = 27, draft: bool = False, layers=LAYERS) -> dict:
    """Float32 state dict of transformers' GptOssForCausalLM (the served weights before bf16);
    ``draft``: also its EAGLE3 draft's weights (readout.design_draft), as (target, draft).
    ``layers``: another (vote, read) per layer, or None: the two-vote design this target had
    before (layer 0 the oldest key, layer 1 the previous token, layers 2-3 nothing), which the
    checks' tests keep as a target blind to some checks."""
    import torch

    readout.hide_broken_torchvision()
    from transformers import GptOssForCausalLM

    torch.manual_seed(seed)
    sd = {k: v.float().clone() for k, v in GptOssForCausalLM(config()).state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    voc = readout.vocab(g, layers)
    sd.update({"model.embed_tokens.weight": voc["emb"], "lm_head.weight": voc["head"], "model.norm.weight": torch.ones(H)})
    for i in range(L):
        p = f"model.layers.{i}."
        if layers is None:
            w = (readout.deciding_layer(i, "ramp" if i == 0 else "peak", 0 if i == 0 else 1, NH, NKV, neox=True)
                 if i < 2 else {n: torch.zeros_like(sd[p + f"self_attn.{n}_proj.weight"]) for n in "qkvo"})
        else:
            w = readout.design_layer(i, layers, NH, NKV, neox=True)
        for n in "qkvo":
            sd[p + f"self_attn.{n}_proj.weight"] = w[n]
            sd[p + f"self_attn.{n}_proj.bias"].zero_()
        sd[p + "self_attn.sinks"].fill_(SINK)
        sd[p + "mlp.experts.down_proj"].zero_()
        sd[p + "mlp.experts.down_proj_bias"].zero_()
        sd[p + "input_layernorm.weight"].fill_(1)
        sd[p + "post_attention_layernorm.weight"].fill_(1)
    return (sd, readout.design_draft(voc, g, FF)) if draft else sd


def save(root: str, seed: int = 27) -> tuple:
    """Writes (target dir, EAGLE3 draft dir), bf16 as served."""
    import torch

    readout.hide_broken_torchvision()
    from transformers import GptOssForCausalLM

    target = os.path.join(root, "gptoss_target")
    sd, draft = weights(seed, draft=True)
    model = GptOssForCausalLM(config())
    model.load_state_dict(sd)
    model.to(torch.bfloat16).save_pretrained(target, safe_serialization=True)
    return target, readout.save_draft(root, "gptoss", draft, FF, readout.DRAFT_HEADS, readout.DRAFT_HEADS)


def hf_model(window: int = WINDOW, dtype=None, seed: int = 27, layers=LAYERS):
    """transformers' GptOssForCausalLM with the served (bf16-rounded) weights, float32 by
    default, eager attention (its sliding-window mask and sinks); ``layers``: as ``weights``."""
    import torch

    readout.hide_broken_torchvision()
    from transformers import GptOssForCausalLM

    cfg = config(window)
    cfg._attn_implementation = "eager"
    model = GptOssForCausalLM(cfg).eval()
    model.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in weights(seed, layers=layers).items()})
    return model.to(dtype or torch.float32)


def main(**defaults) -> None:
    """The target's checks (readout.main; ``defaults``: of --seeds and --threads)."""
    readout.main(hf_model, WINDOW, "window", **defaults)


if __name__ == "__main__":
    main()
