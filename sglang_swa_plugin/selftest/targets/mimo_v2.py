"""A tiny MiMo-V2-Flash (``MiMoV2FlashForCausalLM``: sliding/full/sliding/full, window 16, dense
MLPs) whose greedy output is decided by its sliding-window layer with bf16-safe margins, its
float32 reference from transformers' own MiMoV2FlashForCausalLM (transformers >= 5.19; its
sliding-window mask, sinks and partial RoPE), and MTP layers with real weights that predict the
target's token after next, so that speculative decoding (sglang's ``MiMoV2MTP``) accepts.

    python -m sglang_swa_plugin.selftest.targets.mimo_v2 [--seeds 1,2,3]      # checks (CPU)
    python -m sglang_swa_plugin.selftest.targets.mimo_v2 --write-reference FILE --seeds 81,82,83

The every-layer design of ``readout`` (LAYERS): layer 0 (sliding) attends the OLDEST key its
window lets it see (vote A: the window's exact size decides every next token); layer 2
(sliding) the previous token (B); layers 1 and 3 (full) the first token (C, one vote between them); 16
query heads, 8 KV heads on full layers and 16 on sliding ones; every MLP's down projection is
zero.
transformers' MiMo-V2 keeps the keys at distance 0 .. sliding_window - 1 (window keys).

What MiMo-V2 adds, read from transformers 5.19 (models/mimo_v2_flash) and sglang 0.5.23
(models/mimo_v2.py, models/mimo_v2_nextn.py), and how the readout survives it:
- q/k head dim 192 and v head dim 128 (MiMo-V2-Flash's own): readout's 64-dim heads sit in the
  first 64 dims of each q/k head (q times sqrt(192 / 64): the scaling is 1/sqrt(192)) and of
  each v head; the other dims are zero;
- partial RoPE, factor 0.334: int(192 * 0.334) = 64 rotary dims, neox pairs (j, j + 32),
  inverse frequencies theta^(-2j/64): readout's own (readout.qk, neox); the pass-through dims
  are zero;
- RoPE per layer type (transformers' ``rope_parameters``, sglang's ``rope_theta`` and
  ``swa_rope_theta``): both theta 10000 (readout.THETA), as readout's profiles are solved for;
- sliding layers have twice the full layers' KV heads (transformers derives it; sglang reads
  ``swa_num_key_value_heads``): full 8, sliding 16 (16 query heads);
- values are multiplied by ``attention_value_scale`` (0.707, MiMo's): o divides by it;
- sinks on every sliding layer in transformers: -1000 (no weight); sglang's config turns
  them off (``add_swa_attention_sink_bias`` false), the checkpoint carries none;
- dense MLPs only (transformers' ``mlp_layer_types``, sglang's ``moe_layer_freq`` all 0).

The MTP layers (``model.mtp.layers.{0,1,2}.*``, identical; sglang's draft ``MiMoV2MTP`` maps
them onto its one ``mtp_block``, multi-layer EAGLE gives step k the layer k): input
``eh_proj([enorm(embed(token)) | hnorm(hidden)])``, one decoder layer with the sliding layers'
shapes and window (sglang builds it with ``sliding_window_size``: a window layer, layer 0 of
the draft's own SWA pool), then ``final_layernorm`` and the target's lm_head. At position j
the MTP step k reads token t_{j+k+1} and must give t_{j+k+2}, which the target takes from the
classes of t_{j+k+2-W} (oldest key of its window) and t_{j+k} (previous token). In the MTP's
own cache position i holds t_{i+k+1}: t_{j+k+2-W} is again the OLDEST key of a window of W
keys, t_{j+k} the previous position. So eh_proj passes the embedding (the hidden state is not
needed but for C: sglang's multi-layer MTP gives every step the target's hidden state of
position j, whose first-token votes eh_proj passes on), the first half of the KV groups attends
by readout's ramp and writes A, the second half by readout's "recent" profile (delta 1, else 2:
a draft decode step may sit one position further) writes B, and the residual leaving the layer
has the target's final residual's layout, so the target's lm_head gives the target's votes.
"""

from __future__ import annotations

import json
import math
import os

from . import readout
from .readout import CONST, H, HD, THETA, V, greedy, prompts  # greedy, prompts: the scenario's

NH, NKV, NKV_SWA, FF, L = 16, 8, 16, 256, 4
HEAD_DIM, V_HEAD_DIM, ROTARY = 192, 128, 0.334  # MiMo-V2-Flash's head dims and partial RoPE
WINDOW = 16
LAYER_TYPES = ["sliding_attention", "full_attention"] * 2
# (vote, read) per layer (readout.design_layer): sliding, full, sliding, full
LAYERS = (("A", "ramp"), ("C", "first"), ("B", "peak"), ("C", "first"))
V_SCALE = 0.707
SINK = -1000.0
EPS = 1e-5
MTP_LAYERS = 3  # num_nextn_predict_layers (MiMo-V2-Flash's); multi-layer EAGLE runs one per step
SEED = 29

# What the selftest reads of a target (see gptoss): the MTP layers live inside the target's
# checkpoint (no separate EAGLE3 draft): sglang serves them with the target's path as draft path
# (DRAFT_KIND "mtp"); the config class comes with the checkpoint (SERVER_ARGS). OWN_FORWARD:
# where transformers has no MiMoV2FlashForCausalLM (before 5.19), the reference and the checks
# use this module's forward, whose logits equal that class's (tests/test_mimo_v2_target.py).
TITLE, ARCHITECTURE, REFERENCE_CLASS = "MiMo-V2", "MiMoV2FlashForCausalLM", "MiMoV2FlashForCausalLM"
SIZE, LABEL, HAS_DRAFT, HAS_MTP = WINDOW, "window", False, True
DRAFT_KIND, SERVER_ARGS, OWN_FORWARD = "mtp", ("--trust-remote-code",), True
# The float32 greedy tokens of the first two prompts of seed 1 (readout.prompts(2, 60, 1)), 12
# new ones: what the tests pin (a change of the design changes them).
PINNED = [[397, 287, 356, 505, 342, 396, 416, 501, 523, 318, 321, 523],
          [377, 386, 304, 387, 519, 525, 280, 418, 316, 332, 377, 352]]

CONFIG_PY = '''from transformers import PretrainedConfig


class MiMoV2FlashConfig(PretrainedConfig):
    """The keys of config.json as attributes (sglang's MiMoV2 reads them by name)."""

    model_type = "mimo_v2_flash"
'''


def config(window: int = WINDOW):
    """transformers' MiMoV2FlashConfig of the target (the float32 reference)."""
    from transformers import MiMoV2FlashConfig

    rope = {"rope_type": "default", "rope_theta": THETA, "partial_rotary_factor": ROTARY}
    cfg = MiMoV2FlashConfig(
        vocab_size=V, hidden_size=H, intermediate_size=FF, num_hidden_layers=L, num_attention_heads=NH,
        num_key_value_heads=NKV, head_dim=HEAD_DIM, v_head_dim=V_HEAD_DIM, sliding_window=window,
        layer_types=list(LAYER_TYPES), mlp_layer_types=["dense"] * L, attention_value_scale=V_SCALE,
        rope_parameters={"full_attention": dict(rope), "sliding_attention": dict(rope)},
        max_position_embeddings=4096, rms_norm_eps=EPS, tie_word_embeddings=False, initializer_range=0.1,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=FF,
    )
    cfg.architectures = ["MiMoV2FlashForCausalLM"]
    cfg.torch_dtype = "bfloat16"
    return cfg


def sglang_config(window: int = WINDOW) -> dict:
    """config.json of the served checkpoint: the keys sglang's MiMoV2FlashForCausalLM and
    MiMoV2MTP read (``hybrid_layer_pattern``, ``sliding_window_size``, ``swa_*``,
    ``layernorm_epsilon``, ``partial_rotary_factor``, ``attention_value_scale``,
    ``moe_layer_freq``, ``num_nextn_predict_layers`` ...), the key set of the MiMo-V2 config the
    GPU harness has served since sglang 0.5.11 plus the value scale. The config class comes with
    the checkpoint (``auto_map``, --trust-remote-code, as MiMo-V2-Flash's): a plain
    PretrainedConfig keeps every key as it is on every transformers sglang 0.5.11-0.5.23 pins
    (5.12.1 has no mimo_v2_flash class; 5.19's native one reads other names)."""
    return dict(
        architectures=["MiMoV2FlashForCausalLM"], model_type="mimo_v2_flash",
        auto_map={"AutoConfig": "configuration_mimo_v2_flash.MiMoV2FlashConfig"},
        vocab_size=V, hidden_size=H, intermediate_size=FF, num_hidden_layers=L,
        hybrid_layer_pattern=[1 if t == "sliding_attention" else 0 for t in LAYER_TYPES], sliding_window_size=window,
        num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HEAD_DIM, v_head_dim=V_HEAD_DIM,
        swa_num_attention_heads=NH, swa_num_key_value_heads=NKV_SWA, swa_head_dim=HEAD_DIM,
        swa_v_head_dim=V_HEAD_DIM, attention_value_scale=V_SCALE, attention_bias=False,
        add_swa_attention_sink_bias=False, add_full_attention_sink_bias=False,
        rope_theta=THETA, swa_rope_theta=THETA, rope_scaling=None, partial_rotary_factor=ROTARY,
        layernorm_epsilon=EPS, hidden_act="silu", max_position_embeddings=4096,
        moe_layer_freq=[0] * L, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=FF,
        n_group=1, topk_group=1, norm_topk_prob=True, topk_method="greedy", num_nextn_predict_layers=MTP_LAYERS,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="bfloat16",
    )


def _attention(w: dict, nkv: int, nh: int = None) -> dict:
    """readout's q, k, v, o (64-dim heads) laid out in MiMo-V2's heads: q/k in the first 64 of
    HEAD_DIM dims (q times sqrt(HEAD_DIM / 64) against the 1/sqrt(HEAD_DIM) scaling), v in the
    first 64 of V_HEAD_DIM, o reading them and dividing by the value scale."""
    import torch

    nh = nh or NH
    q, k = torch.zeros(nh * HEAD_DIM, H), torch.zeros(nkv * HEAD_DIM, H)
    v, o = torch.zeros(nkv * V_HEAD_DIM, H), torch.zeros(H, nh * V_HEAD_DIM)
    for h in range(nh):
        q[h * HEAD_DIM:h * HEAD_DIM + HD] = w["q"][h * HD:(h + 1) * HD] * math.sqrt(HEAD_DIM / HD)
        o[:, h * V_HEAD_DIM:h * V_HEAD_DIM + HD] = w["o"][:, h * HD:(h + 1) * HD] / V_SCALE
    for g in range(nkv):
        k[g * HEAD_DIM:g * HEAD_DIM + HD] = w["k"][g * HD:(g + 1) * HD]
        v[g * V_HEAD_DIM:g * V_HEAD_DIM + HD] = w["v"][g * HD:(g + 1) * HD]
    return {"q": q, "k": k, "v": v, "o": o}


def _mtp_attention() -> dict:
    """The two-vote design's MTP attention (4 heads, 2 KV groups; other targets reuse it) ...
    The MTP layer's attention (readout's 64-dim heads, NKV_SWA groups): its input is the
    embedding (residual rms readout.RMS[0]); group 0 (heads 0, 1) attends the oldest key of the
    window and writes PA, group 1 (heads 2, 3) the previous position ("recent") and writes PB."""
    a = readout.deciding_layer(0, "ramp", 0, 4, 2, neox=True)
    b = readout.deciding_layer(1, "recent", 0, 4, 2, neox=True)
    f = readout.RMS[0] / readout.RMS[1]  # b was made for a residual of rms RMS[1]
    hq, gk = 2 * HD, HD  # head 2 and KV group 1 take b's head 0 and group 0
    a["q"][hq:hq + HD] = b["q"][0:HD] * f
    a["k"][gk:gk + HD] = b["k"][0:HD] * f
    a["v"][gk:gk + HD] = b["v"][0:HD]
    a["o"][:, hq:hq + HD] = b["o"][:, 0:HD] * f
    return a


def _mtp_design_attention() -> dict:
    """The MTP layer's attention (readout's 64-dim heads, NH heads, NKV_SWA groups): its input
    is the embedding and the target's first-token votes (``units`` of the target's layer 2);
    groups (and heads) of the first half attend the oldest key of the window and write layer 0's
    area (A), the second half the previous position ("recent") and write layer 2's (B)."""
    import torch

    half_h, half_g = NH // 2, NKV_SWA // 2
    a = readout.design_layer(0, (("A", "ramp"),), half_h, half_g, neox=True)
    b = readout.design_layer(2, (LAYERS[0], LAYERS[1], ("B", "recent")), half_h, half_g, neox=True)
    f = (readout.units(2, LAYERS) / readout.units(0, LAYERS)) ** 0.5  # a was made for the embedding alone
    return {"q": torch.cat([a["q"] * f, b["q"]]), "k": torch.cat([a["k"] * f, b["k"]]),
            "v": torch.cat([a["v"], b["v"]]), "o": torch.cat([a["o"] * f, b["o"]], 1)}


def weights(seed: int = SEED, draft: bool = False) -> dict:
    """Float32 state dict of transformers' MiMoV2FlashForCausalLM (the served weights before
    bf16); ``draft``: also the MTP layers' weights under sglang's checkpoint names
    (``model.mtp.layers.{m}.*``), as (target, mtp)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    voc = readout.vocab(g, LAYERS)
    sd = {"model.embed_tokens.weight": voc["emb"], "lm_head.weight": voc["head"], "model.norm.weight": torch.ones(H)}
    for i, kind in enumerate(LAYER_TYPES):
        p = f"model.layers.{i}."
        nkv = NKV_SWA if kind == "sliding_attention" else NKV
        w = _attention(readout.design_layer(i, LAYERS, NH, nkv, neox=True), nkv)
        sd.update({p + f"self_attn.{n}_proj.weight": w[n] for n in "qkvo"})
        if kind == "sliding_attention":
            sd[p + "self_attn.sinks"] = torch.full((NH,), SINK)
        sd.update({p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.ones(H),
                   p + "mlp.gate_proj.weight": torch.randn(FF, H, generator=g) * 0.1,
                   p + "mlp.up_proj.weight": torch.randn(FF, H, generator=g) * 0.1,
                   p + "mlp.down_proj.weight": torch.zeros(H, FF)})
    if not draft:
        return sd
    att = _attention(_mtp_design_attention(), NKV_SWA)
    eh = torch.zeros(H, 2 * H)
    eh[0:CONST + 8, 0:CONST + 8] = torch.eye(CONST + 8) * (readout.units(0, LAYERS) / H) ** 0.5  # the embedding
    for i, (_, read) in enumerate(LAYERS):  # the target's first-token votes, from its hidden state
        if read == "first":
            c = readout.area(i)
            eh[c, H + c.start:H + c.stop] = torch.eye(HD) * (readout.units(L, LAYERS) / H) ** 0.5
    one = {"enorm.weight": torch.ones(H), "hnorm.weight": torch.ones(H), "eh_proj.weight": eh,
           "final_layernorm.weight": torch.ones(H), "input_layernorm.weight": torch.ones(H),
           "post_attention_layernorm.weight": torch.ones(H),
           **{f"self_attn.{n}_proj.weight": att[n] for n in "qkvo"},
           "mlp.gate_proj.weight": torch.randn(FF, H, generator=g) * 0.1,
           "mlp.up_proj.weight": torch.randn(FF, H, generator=g) * 0.1, "mlp.down_proj.weight": torch.zeros(H, FF)}
    mtp = {f"model.mtp.layers.{m}.{n}": t.clone() for m in range(MTP_LAYERS) for n, t in one.items()}
    return sd, mtp


def served(sd: dict) -> dict:
    """The checkpoint's tensors (bf16) of a float32 state dict: transformers' names, which
    sglang's MiMoV2 loader maps (q/k/v_proj into qkv_proj, gate/up_proj into gate_up_proj), less
    the sinks (sglang's config has none: -1000 weighs nothing)."""
    import torch

    return {k: v.to(torch.bfloat16).contiguous() for k, v in sd.items() if not k.endswith("self_attn.sinks")}


def save(root: str, seed: int = SEED) -> tuple:
    """Writes the checkpoint (bf16, target and MTP layers in one, as MiMo-V2-Flash ships) and
    returns (target dir, the same dir: the draft path of sglang's MTP)."""
    from safetensors.torch import save_file

    target = os.path.join(root, "mimo_v2_target")
    os.makedirs(target, exist_ok=True)
    sd, mtp = weights(seed, draft=True)
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(sglang_config(), f, indent=1)
    with open(os.path.join(target, "configuration_mimo_v2_flash.py"), "w") as f:
        f.write(CONFIG_PY)
    with open(os.path.join(target, "generation_config.json"), "w") as f:
        json.dump({}, f)
    save_file(served({**sd, **mtp}), os.path.join(target, "model.safetensors"))
    return target, target


def hf_model(window: int = WINDOW, dtype=None, seed: int = SEED):
    """transformers' MiMoV2FlashForCausalLM with the served (bf16-rounded) weights, float32 by
    default, eager attention (its sliding-window mask and sinks); where transformers has no such
    class, this module's forward of the same weights in ``dtype`` (reference_source says which)."""
    import torch

    if not has_reference_class():
        sd = {k: v.to(torch.bfloat16).float().to(dtype or torch.float32) for k, v in weights(seed).items()}
        return readout.OwnForward(forward32, sd, window, LAYER_TYPES)
    from transformers import MiMoV2FlashForCausalLM

    cfg = config(window)
    cfg._attn_implementation = "eager"
    model = MiMoV2FlashForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict(
        {k: v.to(torch.bfloat16).float() for k, v in weights(seed).items()}, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return model.to(dtype or torch.float32)


# -- a float32 forward of its own: the reference where transformers has no MiMo-V2, and sglang's
# -- MTP forward (models/mimo_v2_nextn.py) on the CPU -----------------------------------------


def _rms(x, w):
    return x * (x.pow(2).mean(-1, keepdim=True) + EPS).rsqrt() * w


def _layer(sd: dict, p: str, x, window, nkv: int, sink: bool, kv_hook=None, cache=None):
    """One MiMo-V2 decoder layer in x's dtype (x: [B, T, H], the positions after ``cache``'s,
    0 .. T-1 without one): RMSNorm, q/k/v, partial neox RoPE on the first 64 dims, v times the
    value scale, GQA with a causal mask of ``window`` keys (None: all), the optional sink, o;
    then the dense MLP. ``kv_hook(out)``: applied to the key and the value projections
    (readout.kv_perturbed); ``cache``: the layer's keys and values so far (readout.extend)."""
    import torch

    b, t, _ = x.shape
    start = readout.past_len(cache)
    hook = kv_hook or (lambda out: out)
    a = _rms(x, sd[p + "input_layernorm.weight"])
    q = (a @ sd[p + "self_attn.q_proj.weight"].T).view(b, t, NH, HEAD_DIM).transpose(1, 2)
    k = hook(a @ sd[p + "self_attn.k_proj.weight"].T).view(b, t, nkv, HEAD_DIM).transpose(1, 2)
    v = hook(a @ sd[p + "self_attn.v_proj.weight"].T).view(b, t, nkv, V_HEAD_DIM).transpose(1, 2) * V_SCALE
    rot = int(HEAD_DIM * ROTARY)
    inv = 1.0 / THETA ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)
    ang = torch.arange(start, start + t, dtype=torch.float32)[:, None] * inv
    cos, sin = (torch.cat([f(ang)] * 2, -1).to(x.dtype) for f in (torch.cos, torch.sin))

    def rope(z):
        r, rest = z[..., :rot], z[..., rot:]
        half = torch.cat([-r[..., rot // 2:], r[..., :rot // 2]], -1)
        return torch.cat([r * cos + half * sin, rest], -1)

    q, k = rope(q), rope(k)
    k, v = readout.extend(cache, k, v)
    k, v = k.repeat_interleave(NH // nkv, 1), v.repeat_interleave(NH // nkv, 1)
    s = q @ k.transpose(2, 3) / math.sqrt(HEAD_DIM)
    s = s.masked_fill(~readout.window_mask(start, t, window), float("-inf"))
    if sink:
        s = torch.cat([s, sd[p + "self_attn.sinks"].view(1, NH, 1, 1).expand(b, NH, t, 1)], -1)
    prob = s.softmax(-1)[..., :start + t]
    x = x + (prob @ v).transpose(1, 2).reshape(b, t, NH * V_HEAD_DIM) @ sd[p + "self_attn.o_proj.weight"].T
    m = _rms(x, sd[p + "post_attention_layernorm.weight"])
    act = torch.nn.functional.silu(m @ sd[p + "mlp.gate_proj.weight"].T) * (m @ sd[p + "mlp.up_proj.weight"].T)
    return x + act @ sd[p + "mlp.down_proj.weight"].T


def forward32(sd: dict, ids, window: int = WINDOW, kv_hook=None, cache=None) -> tuple:
    """The target's float32 forward of token ids [B, T] (transformers' MiMoV2Flash computation):
    (logits, hidden states before the final norm: what sglang hands its MTP). ``kv_hook(layer,
    out)``: applied to every layer's key and value projections (readout.kv_perturbed);
    ``cache``: readout.OwnForward's, the ids following the cached ones."""
    import torch

    x = sd["model.embed_tokens.weight"][torch.as_tensor(ids)]
    for i, kind in enumerate(LAYER_TYPES):
        swa = kind == "sliding_attention"
        hook = (lambda out, i=i: kv_hook(i, out)) if kv_hook else None
        x = _layer(sd, f"model.layers.{i}.", x, window if swa else None, NKV_SWA if swa else NKV, sink=swa,
                   kv_hook=hook, cache=readout.layer_cache(cache, i))
    return _rms(x, sd["model.norm.weight"]) @ sd["lm_head.weight"].T, x


def mtp_forward32(sd: dict, mtp: dict, ids, hidden, step: int = 0, window: int = WINDOW):
    """sglang's MiMoV2MTP forward (models/mimo_v2_nextn.py) in float32, as its multi-layer EAGLE
    draft extend runs step ``step`` (MTP layer ``step``): position j holds token
    ids[j + step + 1] and the target's hidden state of position j (before its final norm);
    ``eh_proj(cat(enorm(embed), hnorm(hidden)))``, the decoder layer (sliding window
    ``window``, the sliding layers' heads, no sink), ``final_layernorm``, the target's lm_head
    (sglang shares the target's embedding and head with the draft). Returns the logits of
    positions 0 .. T - step - 2, each predicting ids[j + step + 2]."""
    import torch

    p = f"model.mtp.layers.{step}."
    ids = torch.as_tensor(ids)
    e = sd["model.embed_tokens.weight"][ids[:, step + 1:]]
    h = hidden[:, :e.shape[1]]
    x = torch.cat([_rms(e, mtp[p + "enorm.weight"]), _rms(h, mtp[p + "hnorm.weight"])], -1)
    x = x @ mtp[p + "eh_proj.weight"].T
    x = _layer(mtp, p, x, window, NKV_SWA, sink=False)
    return _rms(x, mtp[p + "final_layernorm.weight"]) @ sd["lm_head.weight"].T


def has_reference_class() -> bool:
    readout.hide_broken_torchvision()
    try:
        import transformers

        getattr(transformers, REFERENCE_CLASS)
        return True
    except Exception:  # noqa: BLE001 - absent or not importable
        return False


def reference_source() -> str:
    """What the float32 reference is computed with here."""
    if has_reference_class():
        return f"transformers' {REFERENCE_CLASS}"
    import transformers

    return (f"this target's own float32 forward (transformers {transformers.__version__} has no {REFERENCE_CLASS}; "
            "the forward's logits equal that class's in the plugin's tests)")


def reference(seeds, n: int = 32, length: int = 130, max_new: int = 64, window: int = WINDOW,
              seed: int = SEED, emulate=None) -> dict:
    """The float32 greedy outputs per prompt seed ({seed: [n outputs of max_new ids]}):
    transformers' MiMoV2FlashForCausalLM where it exists, else (or with ``emulate``) this
    module's forward32 of the same bf16-rounded weights."""
    import torch

    if emulate is None:
        emulate = not has_reference_class()
    if emulate:
        model = readout.OwnForward(forward32, {k: v.to(torch.bfloat16).float() for k, v in weights(seed).items()}, window,
                                   LAYER_TYPES)
    else:
        model = hf_model(window, seed=seed)
    return {s: greedy(model, prompts(n, length, s), max_new)[0] for s in seeds}


def mtp_agreement(seeds, n: int = 8, length: int = 130, max_new: int = 64, window: int = WINDOW,
                  seed: int = SEED, outputs=None) -> dict:
    """readout.mtp_agreement of this target."""
    import sys

    return readout.mtp_agreement(sys.modules[__name__], seeds, n, length, max_new, window, seed, outputs)


def main(seeds: str = "1,2,3", threads: int = 6) -> None:
    """The target's checks (readout.check) and the MTP's agreement, or (--write-reference) the
    float32 reference as JSON for a harness whose transformers has no MiMo-V2."""
    import argparse

    import torch

    ap = argparse.ArgumentParser(description="the MiMo-V2 target's checks against float32 output")
    ap.add_argument("--seeds", default=seeds, help=f"comma list of prompt seeds (default: {seeds})")
    ap.add_argument("--threads", type=int, default=threads, help=f"torch CPU threads (default: {threads})")
    ap.add_argument("--write-reference", metavar="FILE", help="write the float32 greedy outputs as JSON and stop")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--length", type=int, default=130)
    ap.add_argument("--max-new", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    sl = [int(x) for x in a.seeds.split(",")]
    if a.write_reference:
        out = reference(sl, a.n, a.length, a.max_new)
        with open(a.write_reference, "w") as f:
            json.dump({"target": "mimo_v2", "window": WINDOW, "weights_seed": SEED, "n": a.n, "length": a.length,
                       "max_new": a.max_new, "source": REFERENCE_CLASS if has_reference_class() else "forward32",
                       "outputs": {str(s): o for s, o in out.items()}}, f)
        print(f"wrote {a.write_reference}: seeds {sl}", flush=True)
        return
    readout.check(hf_model, WINDOW, "window", sl, n=a.n, length=a.length, max_new=a.max_new,
                  show=lambda line: print(line, flush=True))
    print(f"mtp agreement: {json.dumps(mtp_agreement(sl, n=a.n, length=a.length, max_new=a.max_new))}", flush=True)


if __name__ == "__main__":
    main()
