"""A tiny Gemma 4 (``Gemma4ForCausalLM``, text only: sliding/sliding/sliding/full, window 16)
whose greedy output is decided by its sliding-window layers with bf16-safe margins, and its
float32 reference from transformers' own Gemma4ForCausalLM (its sliding-window mask).

    python -m sglang_swa_plugin.selftest.targets.gemma4 [--seeds 1,2,3]   # checks of the target (CPU)

The every-layer design of ``readout`` (LAYERS): layer 0 (sliding) attends the OLDEST key its
window lets it see (vote A: the window's exact size decides every next token); layers 1
and 2 (sliding) the previous token (B, one vote between them); layer 3 (full, RoPE theta 1e6)
the first token (C); 8 query heads, 8 KV heads; every MLP's down projection is zero. transformers' Gemma 4 keeps the keys
at distance 0 .. sliding_window - 1 (window keys); sglang 0.5.11 passes sliding_window - 1 to the
model runner (exclusive convention) and sliding_window itself to each layer's RadixAttention.

What Gemma 4 adds, read from both implementations (transformers 5.x models/gemma4, sglang
0.5.11 models/gemma4_causal.py), and how the readout survives it:
- every RMSNorm is ``x / rms * w`` (no 1 + w): weights 1 where the value passes through;
- the embedding is multiplied by sqrt(hidden) = 16: the stored embedding is readout's / 16
  (exact in bf16), so the residual stream is readout's;
- q_norm / k_norm (per head, before RoPE) and v_norm (no weight), attention scaling 1: q and k
  read one constant coordinate, so after the norms they are the fixed vectors q / rms(q) *
  q_norm and k / rms(k) * k_norm whatever the residual holds; k_norm = rms(k) and q_norm =
  rms(q) / 8 make q.R(d)k the readout's score (readout.qk, neox pairs, divided by sqrt(64));
  v is the token's +-1 code, which v_norm leaves as it is;
- post_attention_layernorm normalises the attention output (the code on 64 of H
  coordinates), weight sqrt(64 / H) writes the code itself;
- final logit softcapping 30 (Gemma 4's value): monotone, so it keeps every choice; the
  winning logits (13 at most) stay where tanh is near-linear, and the margins the check prints
  are taken after it;
- RoPE per layer type (rope_parameters): sliding layers theta 10000 (readout.THETA), the full
  layer theta 1e6 (Gemma 4's global theta: its first-token profile is solved for it); one head_dim (64) on both
  layer types (head_dim = global_head_dim = swa_head_dim: one KV pool layout);
- layer_scalar 1; no per-layer embeddings, KV sharing, MoE or k_eq_v.
No EAGLE3 draft: sglang 0.5.11's Gemma4ForCausalLM captures no auxiliary hidden states.
"""

from __future__ import annotations

import os

from . import readout
from .readout import H, HD, THETA, V, greedy, prompts  # noqa: F401 (greedy, prompts: the scenario's)

NH, NKV, FF, L = 8, 8, 256, 4
WINDOW = 16
LAYER_TYPES = ["sliding_attention"] * 3 + ["full_attention"]
# (vote, read) per layer (readout.design_layer): sliding x 3, full
LAYERS = (("A", "ramp"), ("B", "peak"), ("B", "peak"), ("C", "first"))
GLOBAL_THETA = 1e6
SOFTCAP = 30.0

# What the selftest reads of a target (see gptoss): no EAGLE3 draft (above).
TITLE, ARCHITECTURE, REFERENCE_CLASS = "Gemma 4", "Gemma4ForCausalLM", "Gemma4ForCausalLM"
SIZE, LABEL, HAS_DRAFT = WINDOW, "window", False
# The float32 greedy tokens of the first two prompts of seed 1 (readout.prompts(2, 60, 1)), 12
# new ones: what the tests pin (a change of the design changes them).
PINNED = [[1313, 1472, 1308, 1518, 1398, 1330, 1348, 1467, 1357, 1382, 1324, 1395],
          [1269, 1067, 1290, 1274, 1254, 1080, 1272, 1185, 1239, 1170, 1141, 1145]]


def config(window: int = WINDOW):
    """transformers' Gemma4TextConfig of the target; swa_* and v_head_dim are what sglang's
    config loader derives for the multimodal Gemma 4 config only (its hybrid SWA pool reads
    them), so the text-only config carries them itself."""
    from transformers import Gemma4TextConfig

    cfg = Gemma4TextConfig(
        vocab_size=V, vocab_size_per_layer_input=V, hidden_size=H, intermediate_size=FF, num_hidden_layers=L,
        num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD, global_head_dim=HD,
        num_global_key_value_heads=NKV, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
        enable_moe_block=False, attention_k_eq_v=False, use_double_wide_mlp=False,
        final_logit_softcapping=SOFTCAP, sliding_window=window, max_position_embeddings=4096,
        tie_word_embeddings=False, initializer_range=0.1, layer_types=list(LAYER_TYPES),
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": THETA},
                         "full_attention": {"rope_type": "default", "rope_theta": GLOBAL_THETA}},
    )
    cfg.swa_head_dim = cfg.swa_v_head_dim = cfg.v_head_dim = HD
    cfg.swa_num_key_value_heads = NKV
    cfg.architectures = ["Gemma4ForCausalLM"]
    cfg.torch_dtype = "bfloat16"
    return cfg


def weights(seed: int = 28) -> dict:
    """Float32 state dict of transformers' Gemma4ForCausalLM (the served weights before bf16)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    voc = readout.vocab(g, LAYERS)
    sd = {"model.embed_tokens.weight": voc["emb"] / 16, "lm_head.weight": voc["head"], "model.norm.weight": torch.ones(H)}
    for i in range(L):
        p = f"model.layers.{i}."
        theta = GLOBAL_THETA if LAYER_TYPES[i] == "full_attention" else THETA
        w = readout.design_layer(i, LAYERS, NH, NKV, neox=True, theta=theta)
        rms = (readout.units(i, LAYERS) / H) ** 0.5
        # readout's q and k (head 0, one column, without design_layer's residual-rms factor)
        rq, rk = (float((w[n][0:HD, readout.CONST] / rms).pow(2).mean().sqrt()) for n in "qk")
        q_norm, k_norm = torch.full((HD,), rq / HD ** 0.5), torch.full((HD,), rk)  # q_norm(q).k_norm(k) = q.k / 8
        sd.update({p + f"self_attn.{n}_proj.weight": w[n] for n in "qkvo"})
        sd.update({p + "self_attn.q_norm.weight": q_norm, p + "self_attn.k_norm.weight": k_norm,
                   p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.full((H,), (64 / H) ** 0.5),
                   p + "pre_feedforward_layernorm.weight": torch.ones(H),
                   p + "post_feedforward_layernorm.weight": torch.ones(H), p + "layer_scalar": torch.ones(1),
                   p + "mlp.gate_proj.weight": torch.randn(FF, H, generator=g) * 0.1,
                   p + "mlp.up_proj.weight": torch.randn(FF, H, generator=g) * 0.1,
                   p + "mlp.down_proj.weight": torch.zeros(H, FF)})
    return sd


def _model(window: int, sd: dict):
    import torch

    readout.hide_broken_torchvision()
    from transformers import Gemma4ForCausalLM

    cfg = config(window)
    cfg._attn_implementation = "eager"
    model = Gemma4ForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    return model.to(torch.float32)


def save(root: str, seed: int = 28) -> tuple:
    """Writes (target dir, None: no draft), bf16 as served: config.json + model.safetensors
    under transformers' names, which sglang's Gemma4ForCausalLM.load_weights maps (q/k/v_proj
    into qkv_proj, gate/up_proj into gate_up_proj, the rest by name)."""
    import torch

    target = os.path.join(root, "gemma4_target")
    _model(WINDOW, weights(seed)).to(torch.bfloat16).save_pretrained(target, safe_serialization=True)
    return target, None


def hf_model(window: int = WINDOW, dtype=None, seed: int = 28):
    """transformers' Gemma4ForCausalLM with the served (bf16-rounded) weights, float32 by
    default, eager attention (its sliding-window mask)."""
    import torch

    model = _model(window, {k: v.to(torch.bfloat16).float() for k, v in weights(seed).items()})
    return model.to(dtype or torch.float32)


def main(**defaults) -> None:
    """The target's checks (readout.main; ``defaults``: of --seeds and --threads)."""
    readout.main(hf_model, WINDOW, "window", **defaults)


if __name__ == "__main__":
    main()
