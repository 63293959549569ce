"""A tiny Llama 4 whose greedy output is decided by its chunked layers with bf16-safe margins,
its float32 reference from transformers' own Llama 4 (its chunked attention mask), and an
EAGLE3 draft with real weights that the target accepts.

    python -m sglang_swa_plugin.selftest.targets.llama4 [--seeds 1,2,3]   # checks of the target (CPU)

Target (``Llama4ForConditionalGeneration``, text only; layers 0-2 chunked with RoPE, layer 3
global NoPE, as sglang's Llama 4 fixes it), the every-layer design of ``readout`` (LAYERS):
layer 0 attends the OLDEST key its chunk allows (its chunk's first token: vote A) and copies
that token's id bits; layer 3 (global, no RoPE: it can only read by content) attends the key
whose id bits are those (the same token: vote C, a component of its own, which a global layer
reading another request's keys changes); layers 1 and 2 the previous token (B, one vote between them). 8
query heads, 8 KV heads. A chunk size changed by one changes most requests.

Draft (``LlamaForCausalLMEagle3``, one layer, Llama's neox RoPE; readout.design_draft): its
first step takes A, and C with it, from the target's layer 0 (the chunk start: the next
position's too, but at a chunk boundary); its attention (over its own cache, which holds the
next token's embedding at each position) has two heads attending the most recent key other
than itself (delta 1, else 2: sglang's draft extend puts token t_{j+1} at position j, its
multi-step draft decode puts t_k at position k, so the first decode step finds its
predecessor 2 back) for B's class, and the others attending delta 0 to carry the hidden state
on; its next steps give B and guess A's and C's component 0.
"""

from __future__ import annotations

import json
import os

from . import readout
from .readout import H, HD, THETA, V, greedy, prompts  # noqa: F401 (greedy, prompts: the scenario's)

NH, NKV, FF, L = 8, 8, 512, 4
CHUNK = 32
# (vote, read) per layer (readout.design_layer): chunked x 3 with RoPE, global NoPE
LAYERS = (("A", "ramp"), ("B", "peak"), ("B", "peak"), ("C", "lookup"))

# What the selftest reads of a target (see gptoss): sglang serves the multimodal class (text
# only), the reference is transformers' text model.
TITLE, ARCHITECTURE, REFERENCE_CLASS = "Llama 4", "Llama4ForConditionalGeneration", "Llama4ForCausalLM"
SIZE, LABEL, HAS_DRAFT = CHUNK, "chunk", True
# The float32 greedy tokens of the first two prompts of seed 1 (readout.prompts(2, 60, 1)), 12
# new ones: what the tests pin (a change of the design changes them).
PINNED = [[154, 42, 250, 58, 202, 1412, 1412, 1332, 1332, 1476, 1476, 1428],
          [123, 155, 139, 267, 187, 931, 931, 883, 883, 963, 963, 787]]
# trtllm_mha's pages (sglang's choice: 64) do not tile the chunk of 32; the plugin's
# trtllm_local_attn runs a chunked layer from its chunk's first page, so it covers pages that
# tile the chunk, as every page size tiles Llama 4's own 8192. Its rows run pages of 32.
BACKEND_SERVER_ARGS = {"trtllm_mha": ("--page-size", "32")}


def weights(seed: int = 26) -> dict:
    """Float32 tensors: target state dict (HF Llama4ForCausalLM names), draft weights
    (sglang EAGLE3 names), classes, class scales, permutation."""
    import torch

    g = torch.Generator().manual_seed(seed)
    voc = readout.vocab(g, LAYERS)
    sd = {"model.embed_tokens.weight": voc["emb"], "lm_head.weight": voc["head"], "model.norm.weight": torch.ones(H)}
    for i in range(L):
        p = f"model.layers.{i}."
        w = readout.design_layer(i, LAYERS, NH, NKV, neox=False)
        sd.update({p + f"self_attn.{n}_proj.weight": w[n] for n in "qkvo"})
        sd.update({p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.ones(H),
                   p + "feed_forward.gate_proj.weight": torch.randn(FF, H, generator=g) * 0.1,
                   p + "feed_forward.up_proj.weight": torch.randn(FF, H, generator=g) * 0.1,
                   p + "feed_forward.down_proj.weight": torch.zeros(H, FF)})
    draft = readout.design_draft(voc, g, FF)
    return {"target": sd, "draft": draft, **voc}


def text_config(chunk: int = CHUNK) -> dict:
    return dict(
        model_type="llama4_text", vocab_size=V, hidden_size=H, intermediate_size=FF, intermediate_size_mlp=FF,
        num_hidden_layers=L, num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD,
        max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=THETA,
        rope_parameters={"rope_theta": THETA, "rope_type": "default"}, rope_scaling=None,
        attention_chunk_size=chunk, no_rope_layers=[int((i + 1) % 4 != 0) for i in range(L)],
        no_rope_layer_interval=4, interleave_moe_layer_step=0, moe_layers=[], num_local_experts=0,
        num_experts_per_tok=1, use_qk_norm=False, attn_temperature_tuning=False, floor_scale=8192,
        attn_scale=0.1, attention_bias=False, hidden_act="silu", tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="bfloat16")


def save(root: str, chunk: int = CHUNK, seed: int = 26) -> tuple:
    """Writes (target dir, draft dir): the target as ``Llama4ForConditionalGeneration`` (text
    weights under ``language_model.``, no vision weights; multimodal stays off), the draft as
    ``LlamaForCausalLMEagle3``; bf16 as served."""
    import torch
    from safetensors.torch import save_file

    w = weights(seed)
    target = os.path.join(root, f"llama4_target_c{chunk}")
    os.makedirs(target, exist_ok=True)
    vision = dict(model_type="llama4_vision_model", hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=128, image_size=336, patch_size=14, num_channels=3, vision_output_dim=64,
                  projector_input_dim=64, projector_output_dim=64, pixel_shuffle_ratio=0.5, rope_theta=10000)
    cfg = dict(architectures=["Llama4ForConditionalGeneration"], model_type="llama4", text_config=text_config(chunk),
               vision_config=vision, image_token_index=V - 1, boi_token_index=V - 2, eoi_token_index=V - 3,
               tie_word_embeddings=False, torch_dtype="bfloat16")
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(target, "generation_config.json"), "w") as f:
        json.dump({}, f)
    bf = lambda t: t.to(torch.bfloat16).contiguous()
    save_file({"language_model." + k: bf(v) for k, v in w["target"].items()}, os.path.join(target, "model.safetensors"))
    draft = readout.save_draft(root, "llama4", w["draft"], FF, readout.DRAFT_HEADS, readout.DRAFT_HEADS)
    return target, draft


def hf_model(chunk: int = CHUNK, dtype=None, seed: int = 26):
    """transformers' own Llama4ForCausalLM with the served (bf16-rounded) weights, in ``dtype``
    (float32 by default), eager attention (its chunked causal mask)."""
    import torch

    readout.hide_broken_torchvision()
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    cfg = Llama4TextConfig(**{k: v for k, v in text_config(chunk).items() if k not in ("model_type", "torch_dtype")})
    cfg._attn_implementation = "eager"
    model = Llama4ForCausalLM(cfg).eval()
    sd = {k: v.to(torch.bfloat16).float() for k, v in weights(seed)["target"].items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return model.to(dtype or torch.float32)


def main(**defaults) -> None:
    """The target's checks (readout.main; ``defaults``: of --seeds and --threads)."""
    readout.main(hf_model, CHUNK, "chunk", **defaults)


if __name__ == "__main__":
    main()
