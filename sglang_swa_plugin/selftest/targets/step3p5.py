"""A tiny Step3.5 (``Step3p5ForCausalLM``: sliding/full/sliding/full, window 16, dense MLPs,
head-wise attention gate, q/k norms) whose greedy output is decided by every one of its layers
with bf16-safe margins, its float32 reference from transformers' Step3p7 text model and the
target's lm_head (transformers >= 5.19 reads a ``step3p5`` checkpoint as ``Step3p7TextConfig``:
Step3.5's architecture there; elsewhere this module's own forward, held to it), and MTP layers
with real weights that predict the target's token after next (sglang's ``Step3p5MTP``,
multi-layer EAGLE, each step fed the previous step's hidden states).

    python -m sglang_swa_plugin.selftest.targets.step3p5 [--seeds 1,2,3]      # checks (CPU)

The every-layer design of ``readout`` (LAYERS, as ``mimo_v2``'s): layer 0 (sliding) attends
the OLDEST key its window lets it see (vote A: the window's exact size decides every
next token); layer 2 (sliding) the previous token (B); layers 1 and 3 (full) the first token
(C, one vote between them); 16 query heads and 8 KV heads, every head writing its own slice of the code;
every MLP's down projection is zero. transformers' Step3p7 keeps the keys at distance
0 .. sliding_window - 1 (window keys).

What Step3.5 adds, read from transformers 5.19 (models/step3p7) and sglang 0.5.23
(models/step3p5.py, models/step3p5_mtp.py), and how the readout survives it:
- 128-dim heads, partial RoPE 0.5 (Step-3.5-Flash's): readout's 64-dim heads in the 64 rotary
  dims (neox pairs, theta 10000 on every layer), q times sqrt(2) against 1/sqrt(128);
- q/k RMSNorm per head (Gemma's 1 + w) before RoPE: q and k read the constant coordinate
  only, so a head is a fixed vector; a pad in the pass-through dims (q's and k's apart) brings
  every head to one rms, which the norm weight gives back (``_heads``);
- a per-head sigmoid gate on the attention output (``g_proj``): zero weights, gate 0.5, o
  doubles;
- dense MLPs only (``moe_layers_enum`` names no layer), no SwiGLU clamp;
- the bf16 model (readout.check's) computes its attention scores and softmax in float32, as
  sglang's attention kernels do (transformers' sdpa; this module's forward likewise):
  transformers' eager attention rounds the scores to bf16, and the full layers' first-token
  ramp (readout's "first": 6 per position, about -700 at a 40-token prompt) loses its steps
  to bf16's spacing of 4 there;
- sglang's MTP builds its layer as layer 45 whatever the model's depth (``layer_id = 45``,
  a FIXME there) and its attention is layer ``45 - num_hidden_layers`` of the draft's
  one-layer cache: only a checkpoint of 45 layers loads as a draft. The MTP layers are
  therefore a checkpoint of their own (``save``: the draft path), whose config declares
  Step-3.5-Flash's 45 layers and carries only the MTP layers ``model.layers.{45,46,47}.*`` and
  the embedding; the 4-layer target's checkpoint declares its 3 MTP layers and carries none
  (sglang's target loader skips them either way).

The MTP layers (identical; sglang's ``Step3p5MTP`` with ``draft_model_idx`` k loads layer
45 + k into its ``mtp_block``): input ``eh_proj([enorm(embed(token)) | hnorm(hidden)])``, one
decoder layer with the sliding layers' window, the shared head's norm and head (the target's
lm_head). Step 0's hidden state is the target's (before its final norm), step k's the
residual leaving step k - 1 (sglang's ``chain_mtp_hidden_states``): both carry the target's
first-token votes (C) on layers 1 and 3's areas, which eh_proj passes on. Half of the heads
attend the OLDEST key of the window (A), half the previous position (B), as ``mimo_v2``'s MTP;
the residual leaving the layer has the target's final layout.
"""

from __future__ import annotations

import json
import math
import os

from . import readout
from .readout import CONST, H, HD, THETA, V, greedy, prompts  # greedy, prompts: the scenario's

NH, NKV, FF, L = 16, 8, 256, 4
HEAD_DIM, ROTARY = 128, 0.5  # Step-3.5-Flash's head dim; RoPE on the first 64 dims (readout's heads)
Q_PAD, K_PAD = slice(HD, HD + 32), slice(HD + 32, HEAD_DIM)  # pass-through dims that even the q / k norms
WINDOW = 16
LAYER_TYPES = ["sliding_attention", "full_attention"] * 2
# (vote, read) per layer (readout.design_layer): sliding, full, sliding, full
LAYERS = (("A", "ramp"), ("C", "first"), ("B", "peak"), ("C", "first"))
MTP_LAYERS = 3  # num_nextn_predict_layers (Step-3.5-Flash's); multi-layer EAGLE runs one per step
DRAFT_DEPTH = 45  # the depth sglang's Step3p5MTP takes for granted (its layer is layer 45)
EPS = 1e-5
SEED = 31

# What the selftest reads of a target (see gptoss): the MTP layers are the draft (DRAFT_KIND
# "mtp"), in a checkpoint of their own; sglang has Step3.5's config class itself (no
# SERVER_ARGS). OWN_FORWARD: where transformers has no Step3p7TextModel (before 5.19) the
# reference is this module's forward, whose logits equal that class's
# (tests/test_step3p5_target.py).
TITLE, ARCHITECTURE, REFERENCE_CLASS = "Step3.5", "Step3p5ForCausalLM", "Step3p7TextModel"
SIZE, LABEL, HAS_DRAFT, HAS_MTP = WINDOW, "window", False, True
DRAFT_KIND, SERVER_ARGS, OWN_FORWARD = "mtp", (), True
# The selftest's modes (keys of rows.MODES): plain and multi-layer EAGLE. No NEXTN rows: sglang's
# NEXTN path cannot load Step3.5 (a TypeError on num_hidden_layers + None).
MODES = ("plain", "mtp")
# The float32 greedy tokens of the first two prompts of seed 1 (readout.prompts(2, 60, 1)), 12
# new ones (transformers 5.19's Step3p7TextModel; this module's forward gives the same): what
# the tests pin (a change of the design changes them).
PINNED = [[1594, 1686, 1583, 1674, 1781, 1767, 1689, 1715, 1596, 1756, 1788, 1690],
          [1295, 1074, 1053, 1260, 1274, 1221, 1282, 1077, 1295, 1287, 1050, 1094]]


def sglang_config(window: int = WINDOW, depth: int = L) -> dict:
    """config.json of a served checkpoint, with Step-3.5-Flash's keys (``model_type`` step3p5:
    sglang's Step3p5Config, transformers' Step3p7TextConfig): ``depth`` decoder layers (the
    target's L; the MTP checkpoint's DRAFT_DEPTH, layers it declares and does not carry, of
    the target's pattern) and the 3 MTP layers in the per-layer lists,
    ``attention_other_setting`` for the sliding layers' heads, ``moe_layers_enum`` naming no
    layer (dense MLPs), no SwiGLU clamp (limits 0), the head-wise gate on."""
    types = [LAYER_TYPES[i % L] for i in range(depth)] + ["sliding_attention"] * MTP_LAYERS
    n = len(types)
    return dict(
        architectures=["Step3p5ForCausalLM"], model_type="step3p5", vocab_size=V, hidden_size=H,
        intermediate_size=FF, num_hidden_layers=depth, num_attention_heads=NH, num_attention_groups=NKV,
        head_dim=HEAD_DIM, attention_other_setting={"attention_type": "sliding_attention", "num_attention_heads": NH,
                                                    "num_attention_groups": NKV, "head_dim": HEAD_DIM},
        layer_types=types, sliding_window=window, yarn_only_types=[], rope_theta=[THETA] * n,
        rope_scaling=None, partial_rotary_factors=[ROTARY] * n, max_position_embeddings=4096, max_seq_len=4096,
        rms_norm_eps=EPS, use_head_wise_attn_gate=True, moe_layers_enum=str(n), moe_num_experts=4, moe_top_k=2,
        moe_intermediate_size=FF, share_expert_dim=FF, swiglu_limits=[0.0] * n, swiglu_limits_shared=[0.0] * n,
        num_nextn_predict_layers=MTP_LAYERS,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="bfloat16",
    )


def config(window: int = WINDOW):
    """transformers' Step3p7TextConfig of the target (the float32 reference), read from the
    checkpoint's keys as transformers reads Step-3.5-Flash's config.json."""
    from transformers import Step3p7TextConfig

    keys = {k: v for k, v in sglang_config(window).items() if k not in ("architectures", "model_type", "torch_dtype")}
    return Step3p7TextConfig(**keys)


def _heads(w: dict, nh: int, nkv: int, units: int) -> dict:
    """Step3.5 attention weights from readout's (64-dim heads, made for a residual of ``units``
    +-1 coordinates): q/k land in the first 64 (rotary) dims of a 128-dim head, q times sqrt(2)
    against the 1/sqrt(128) scaling; v in the first 64 of each group, o reading them, doubled
    against the gate's 0.5 (g_proj zero). The q/k norms (per head, Gemma's 1 + w, before RoPE):
    q and k read the constant coordinate only, so each head is a fixed vector whatever the
    residual holds: the design's vector (its weights over the residual's rms); a pass-through
    pad (q's and k's in different dims: they meet nothing) brings every active head (group) to
    one rms, which the norm weight gives back."""
    import torch

    def padded(src, rows: int, pad: slice, scale: float):
        out = torch.zeros(rows * HEAD_DIM, H)
        sq = {}
        for r in range(rows):
            x = src[r * HD:(r + 1) * HD].float() * scale
            out[r * HEAD_DIM:r * HEAD_DIM + HD] = x
            if x.abs().sum() > 0:
                assert x[:, [c for c in range(H) if c != CONST]].abs().sum() == 0, "reads beyond the constant"
                sq[r] = float(x[:, CONST].pow(2).sum())
        if not sq:
            return out, torch.zeros(HEAD_DIM)
        target = max(sq.values()) * 1.25 / HEAD_DIM  # the common mean square
        for r, v in sq.items():
            out[r * HEAD_DIM + pad.start, CONST] = math.sqrt(target * HEAD_DIM - v)
        return out, torch.full((HEAD_DIM,), math.sqrt(target + EPS) - 1.0)

    rms = math.sqrt(units / H)  # the constant coordinate after the input norm: 1 / rms
    wq, q_norm = padded(w["q"], nh, Q_PAD, math.sqrt(HEAD_DIM / HD) / rms)
    wk, k_norm = padded(w["k"], nkv, K_PAD, 1.0 / rms)
    wv, wo = torch.zeros(nkv * HEAD_DIM, H), torch.zeros(H, nh * HEAD_DIM)
    for g in range(nkv):
        wv[g * HEAD_DIM:g * HEAD_DIM + HD] = w["v"][g * HD:(g + 1) * HD]
    for h in range(nh):
        wo[:, h * HEAD_DIM:h * HEAD_DIM + HD] = w["o"][:, h * HD:(h + 1) * HD] * 2.0
    return {"q_proj": wq, "k_proj": wk, "v_proj": wv, "o_proj": wo, "g_proj": torch.zeros(nh, H),
            "q_norm": q_norm, "k_norm": k_norm}


def _attention(i: int) -> dict:
    """Target layer ``i``'s attention: readout's every-layer design (LAYERS)."""
    return _heads(readout.design_layer(i, LAYERS, NH, NKV, neox=True), NH, NKV, readout.units(i, LAYERS))


def _mtp_attention() -> dict:
    """The MTP layer's attention: its input is the embedding and the target's first-token votes
    (C, the residual of layer 2 of the design); the first half of the heads and KV groups
    attends the OLDEST key of the window and writes layer 0's area (A), the second half the
    previous position (readout's "recent": delta 1, else 2) and writes layer 2's (B)."""
    import torch

    half_h, half_g = NH // 2, NKV // 2
    a = readout.design_layer(0, (("A", "ramp"),), half_h, half_g, neox=True)
    b = readout.design_layer(2, (LAYERS[0], LAYERS[1], ("B", "recent")), half_h, half_g, neox=True)
    f = (readout.units(2, LAYERS) / readout.units(0, LAYERS)) ** 0.5  # a was made for the embedding alone
    w = {"q": torch.cat([a["q"] * f, b["q"]]), "k": torch.cat([a["k"] * f, b["k"]]),
         "v": torch.cat([a["v"], b["v"]]), "o": torch.cat([a["o"] * f, b["o"]], 1)}
    return _heads(w, NH, NKV, readout.units(2, LAYERS))  # the embedding and the C votes


def weights(seed: int = SEED, draft: bool = False):
    """Float32 state dict of the target under the checkpoint's names (transformers' and
    sglang's: ``model.layers.{i}.self_attn.{q,k,v,o,g}_proj``, ``q_norm``, ``k_norm``,
    ``mlp.{gate,up,down}_proj``); ``draft``: also the MTP layers' weights
    (``model.layers.{DRAFT_DEPTH + k}.*``, the shared head under ``transformer.shared_head``),
    as (target, mtp). Every RMSNorm is Gemma's (1 + w): weight 0 passes the value through."""
    import torch

    g = torch.Generator().manual_seed(seed)
    voc = readout.vocab(g, LAYERS)

    def layer(p: str, att: dict) -> dict:
        out = {p + f"self_attn.{n}.weight": t for n, t in att.items()}
        out.update({p + "input_layernorm.weight": torch.zeros(H), p + "post_attention_layernorm.weight": torch.zeros(H),
                    p + "mlp.gate_proj.weight": torch.randn(FF, H, generator=g) * 0.1,
                    p + "mlp.up_proj.weight": torch.randn(FF, H, generator=g) * 0.1,
                    p + "mlp.down_proj.weight": torch.zeros(H, FF)})
        return out

    sd = {"model.embed_tokens.weight": voc["emb"], "lm_head.weight": voc["head"], "model.norm.weight": torch.zeros(H)}
    for i in range(L):
        sd.update(layer(f"model.layers.{i}.", _attention(i)))
    if not draft:
        return sd
    eh = torch.zeros(H, 2 * H)
    eh[0:CONST + 8, 0:CONST + 8] = torch.eye(CONST + 8) * (readout.units(0, LAYERS) / H) ** 0.5  # the embedding
    for i, (_, read) in enumerate(LAYERS):  # the target's first-token votes, from its hidden state
        if read == "first":
            c = readout.area(i)
            eh[c, H + c.start:H + c.stop] = torch.eye(HD) * (readout.units(len(LAYERS), LAYERS) / H) ** 0.5
    mtp, att = {}, _mtp_attention()
    for m in range(MTP_LAYERS):
        p = f"model.layers.{DRAFT_DEPTH + m}."
        mtp.update(layer(p, att))
        mtp.update({p + "enorm.weight": torch.zeros(H), p + "hnorm.weight": torch.zeros(H), p + "eh_proj.weight": eh,
                    p + "transformer.shared_head.norm.weight": torch.zeros(H),
                    p + "transformer.shared_head.output.weight": voc["head"].clone()})
    return sd, mtp


def served(sd: dict) -> dict:
    """The checkpoint's tensors (bf16) of a float32 state dict."""
    import torch

    return {k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}


def save(root: str, seed: int = SEED) -> tuple:
    """Writes the target's checkpoint and the MTP layers' (bf16) and returns (target dir, MTP
    dir: the draft path of sglang's MTP). The MTP checkpoint's config declares DRAFT_DEPTH
    layers (module docstring) and carries the MTP layers and the embedding (sglang's
    Step3p5MTP loads its own)."""
    from safetensors.torch import save_file

    sd, mtp = weights(seed, draft=True)
    mtp = {"model.embed_tokens.weight": sd["model.embed_tokens.weight"], **mtp}
    dirs = []
    for name, depth, tensors in (("step3p5_target", L, sd), ("step3p5_mtp", DRAFT_DEPTH, mtp)):
        path = os.path.join(root, name)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(sglang_config(depth=depth), f, indent=1)
        with open(os.path.join(path, "generation_config.json"), "w") as f:
            json.dump({}, f)
        save_file(served(tensors), os.path.join(path, "model.safetensors"))
        dirs.append(path)
    return tuple(dirs)


# -- the float32 reference: transformers' Step3p7 text model and the target's lm_head, or (where
# -- transformers has none) a forward of this module's own; sglang's MTP forward on the CPU -----


class _WithHead:
    """transformers' Step3p7TextModel and an lm_head as a model readout.greedy and the
    acceptance emulation can call (``model(input_ids=...).logits``, ``state_dict``,
    ``get_decoder``); the text model is what transformers builds for a ``step3p5`` checkpoint,
    its causal LM head is the checkpoint's ``lm_head.weight``. The ids go to the head's device,
    the logits come back to the CPU."""

    def __init__(self, model, head):
        self.model, self.head = model, head
        self.config = model.config  # readout.layer_kinds reads its layer_types

    def named_modules(self):
        """The text model's modules (``layers.N.self_attn.k_proj`` ...: readout.kv_perturbed)."""
        return self.model.named_modules()

    def state_dict(self) -> dict:
        """The checkpoint's names: ``model.`` and the text model's, ``lm_head.weight``."""
        return {**{"model." + k: v for k, v in self.model.state_dict().items()}, "lm_head.weight": self.head}

    def get_decoder(self):
        return self.model

    def __call__(self, input_ids):
        from types import SimpleNamespace

        hidden = self.model(input_ids=input_ids.to(self.head.device)).last_hidden_state
        return SimpleNamespace(logits=(hidden @ self.head.T.to(hidden.dtype)).cpu())


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
        return f"transformers' {REFERENCE_CLASS} (model type step3p5) with the target's lm_head"
    import transformers

    return (f"this target's own float32 forward (transformers {transformers.__version__} has no {REFERENCE_CLASS}; "
            "the forward's logits equal that class's in the plugin's tests)")


def hf_model(window: int = WINDOW, dtype=None, seed: int = SEED, emulate=None, device=None):
    """The target with the served (bf16-rounded) weights, float32 by default: transformers'
    Step3p7TextModel (eager attention: its sliding-window mask; another dtype: sdpa, float32
    scores as sglang's kernels) and the lm_head; where
    transformers has no such class (or ``emulate``), this module's forward in ``dtype``. On
    ``device`` (None: the CPU; ``main --device``), the logits returned on the CPU."""
    import torch

    device = torch.device(device or "cpu")
    sd = {k: v.to(torch.bfloat16).float().to(dtype or torch.float32).to(device) for k, v in weights(seed).items()}
    if emulate is None:
        emulate = not has_reference_class()
    if emulate:
        return readout.OwnForward(forward32, sd, window, LAYER_TYPES)
    readout.hide_broken_torchvision()
    from transformers import Step3p7TextModel

    cfg = config(window)
    cfg._attn_implementation = "eager" if dtype in (None, torch.float32) else "sdpa"  # bf16: float32 scores
    model = Step3p7TextModel(cfg).eval()
    missing, unexpected = model.load_state_dict(
        {k.removeprefix("model."): v.float() for k, v in sd.items() if k.startswith("model.")}, strict=False)
    missing = [m for m in missing if not m.endswith("e_score_correction_bias")]
    assert not missing and not unexpected, (missing, unexpected)
    return _WithHead(model.to(device, dtype or torch.float32), sd["lm_head.weight"])


def _rms(x, w):
    """Step3.5's RMSNorm (Gemma's): x / rms(x) * (1 + w), in float32 as both implementations."""
    xf = x.float()
    return (xf * (xf.pow(2).mean(-1, keepdim=True) + EPS).rsqrt() * (1.0 + w.float())).to(x.dtype)


def _layer(sd: dict, p: str, x, window, kv_hook=None, index: int = 0, cache=None):
    """One Step3.5 decoder layer in x's dtype (x: [B, T, H], the positions after ``cache``'s, 0 ..
    T-1 without one): norm, q/k/v, per-head q/k norms, neox RoPE on the first 64 dims, GQA with
    a causal mask of ``window`` keys (None: all; scores and softmax in float32, as sglang's
    kernels), the per-head sigmoid gate, o; then the dense SwiGLU MLP. ``kv_hook(index, out)``:
    applied to the key and value projections (readout.kv_perturbed); ``cache``: the layer's
    keys and values so far (readout.extend)."""
    import torch

    b, t, _ = x.shape
    start = readout.past_len(cache)
    a = _rms(x, sd[p + "input_layernorm.weight"])
    hook = kv_hook or (lambda _index, out: out)
    q = _rms((a @ sd[p + "self_attn.q_proj.weight"].T).view(b, t, NH, HEAD_DIM), sd[p + "self_attn.q_norm.weight"])
    k = _rms(hook(index, a @ sd[p + "self_attn.k_proj.weight"].T).view(b, t, NKV, HEAD_DIM),
             sd[p + "self_attn.k_norm.weight"])
    v = hook(index, a @ sd[p + "self_attn.v_proj.weight"].T).view(b, t, NKV, HEAD_DIM)
    rot = int(HEAD_DIM * ROTARY)
    inv = 1.0 / THETA ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)
    ang = torch.arange(start, start + t, dtype=torch.float32, device=x.device)[:, None] * inv.to(x.device)
    cos, sin = (torch.cat([f(ang)] * 2, -1)[:, None].to(x.dtype) for f in (torch.cos, torch.sin))

    def rope(z):
        r, rest = z[..., :rot], z[..., rot:]
        return torch.cat([r * cos + torch.cat([-r[..., rot // 2:], r[..., :rot // 2]], -1) * sin, rest], -1)

    q, k = rope(q).transpose(1, 2), rope(k).transpose(1, 2)
    k, v = readout.extend(cache, k, v.transpose(1, 2))
    k, v = k.repeat_interleave(NH // NKV, 1), v.repeat_interleave(NH // NKV, 1)
    s = q.float() @ k.float().transpose(2, 3) / math.sqrt(HEAD_DIM)  # float32 scores (bf16 too: docstring)
    s = s.masked_fill(~readout.window_mask(start, t, window, x.device), float("-inf"))
    o = (s.softmax(-1).to(v.dtype) @ v).transpose(1, 2)  # [B, T, NH, HEAD_DIM]
    o = o * (a @ sd[p + "self_attn.g_proj.weight"].T).sigmoid()[..., None]
    x = x + o.reshape(b, t, NH * HEAD_DIM) @ sd[p + "self_attn.o_proj.weight"].T
    m = _rms(x, sd[p + "post_attention_layernorm.weight"])
    act = torch.nn.functional.silu(m @ sd[p + "mlp.gate_proj.weight"].T) * (m @ sd[p + "mlp.up_proj.weight"].T)
    return x + act @ sd[p + "mlp.down_proj.weight"].T


def forward32(sd: dict, ids, window: int = WINDOW, kv_hook=None, cache=None) -> tuple:
    """The target's forward of token ids [B, T] (transformers' Step3p7 text model and the
    lm_head): (logits, hidden states before the final norm: what sglang hands its MTP);
    ``cache``: readout.OwnForward's, the ids following the cached ones."""
    import torch

    emb = sd["model.embed_tokens.weight"]
    x = emb[torch.as_tensor(ids).to(emb.device)]
    for i, kind in enumerate(LAYER_TYPES):
        x = _layer(sd, f"model.layers.{i}.", x, window if kind == "sliding_attention" else None, kv_hook, i,
                   cache=readout.layer_cache(cache, i))
    return _rms(x, sd["model.norm.weight"]) @ sd["lm_head.weight"].T, x


def mtp_step32(mtp: dict, embed, ids, hidden, step: int = 0, window: int = WINDOW) -> tuple:
    """One step of sglang's Step3p5MTP (models/step3p5_mtp.py) in float32: MTP layer
    DRAFT_DEPTH + ``step`` over entries of token ``ids`` [B, T] and ``hidden`` [B, T, H]:
    ``eh_proj(cat(enorm(embed), hnorm(hidden)))``, the decoder layer (sliding window
    ``window``), the shared head's norm and head. Returns (logits, the residual leaving the
    layer: the next step's hidden state)."""
    import torch

    p = f"model.layers.{DRAFT_DEPTH + step}."
    x = torch.cat([_rms(embed[ids], mtp[p + "enorm.weight"]), _rms(hidden, mtp[p + "hnorm.weight"])], -1)
    x = x @ mtp[p + "eh_proj.weight"].T
    x = _layer(mtp, p, x, window)
    head = p + "transformer.shared_head."
    return _rms(x, mtp[head + "norm.weight"]) @ mtp[head + "output.weight"].T, x


def mtp_forward32(sd: dict, mtp: dict, ids, hidden, step: int = 0, window: int = WINDOW):
    """The MTP's logits at step ``step`` as sglang's multi-layer EAGLE draft extend computes
    them over a whole sequence: step k's position j holds token ids[j + k + 1]; step 0's hidden
    state is the target's of position j (``hidden``: before its final norm), step k's the
    residual step k - 1 left at position j (``chain_mtp_hidden_states``). Returns the logits
    of positions 0 .. T - step - 2, each predicting ids[j + step + 2]."""
    import torch

    ids, embed = torch.as_tensor(ids), sd["model.embed_tokens.weight"]
    for k in range(step + 1):
        tokens = ids[:, k + 1:]
        logits, hidden = mtp_step32(mtp, embed, tokens, hidden[:, :tokens.shape[1]], k, window)
    return logits


def reference(seeds, n: int = 32, length: int = 130, max_new: int = 64, window: int = WINDOW,
              seed: int = SEED, emulate=None, device=None) -> dict:
    """The float32 greedy outputs per prompt seed ({seed: [n outputs of max_new ids]})."""
    model = hf_model(window, seed=seed, emulate=emulate, device=device)
    return {s: greedy(model, prompts(n, length, s), max_new)[0] for s in seeds}


def mtp_agreement(seeds, n: int = 8, length: int = 130, max_new: int = 64, window: int = WINDOW,
                  seed: int = SEED, outputs=None) -> dict:
    """readout.mtp_agreement of this target."""
    import sys

    return readout.mtp_agreement(sys.modules[__name__], seeds, n, length, max_new, window, seed, outputs)


def main(seeds: str = "1,2,3", threads: int = 6) -> None:
    """The target's checks (readout.check) and the MTP's agreement; ``--device cuda``: the
    models of the checks and the reference on a GPU (float32 without TF32), for the 32
    requests of the full protocol in minutes."""
    import argparse
    import functools

    import torch

    ap = argparse.ArgumentParser(description="the Step3.5 target's checks against float32 output")
    ap.add_argument("--seeds", default=seeds, help=f"comma list of prompt seeds (default: {seeds})")
    ap.add_argument("--threads", type=int, default=threads, help=f"torch CPU threads (default: {threads})")
    ap.add_argument("--device", default=None, help="where the models run (default: the CPU)")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--length", type=int, default=130)
    ap.add_argument("--max-new", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    sl = [int(x) for x in a.seeds.split(",")]
    print(f"reference: {reference_source()}" + (f" on {a.device}" if a.device else ""), flush=True)
    readout.check(functools.partial(hf_model, device=a.device), WINDOW, "window", sl, n=a.n, length=a.length,
                  max_new=a.max_new, show=lambda line: print(line, flush=True))
    out = reference(sl, a.n, a.length, a.max_new, device=a.device)
    print(f"mtp agreement: {json.dumps(mtp_agreement(sl, n=a.n, length=a.length, max_new=a.max_new, outputs=out))}",
          flush=True)


if __name__ == "__main__":
    main()
