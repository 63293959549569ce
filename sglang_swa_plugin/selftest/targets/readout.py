"""Shared pieces of the readout targets (``gptoss``, ``llama4``, ``gemma4`` in this package):
RoPE score profiles from a linear program, the class codes and votes, prompts, and greedy
decoding of a transformers model in float32 with the whole sequence recomputed every step.

A readout target's tokens belong to one of 64 classes; a token's embedding is its class's
Hadamard code (+-1) on hidden coordinates 0-63 and 1 on 64-71. Its attention layers read q and
k from coordinate 64 only, so each layer's score is a fixed function of the distance between
query and key, set through RoPE (``qk``); each layer writes the attended token's code on its own
64 coordinates, and the lm_head turns the codes into votes.
"""

from __future__ import annotations

import functools
import math

HD = 64
THETA = 10000.0
STEP, PEAK = 12.0, 16.0  # score gaps (after the 1/sqrt(64) scaling)
RAMP_SPAN, PEAK_SPAN = 40, 300
H, V = 256, 2048
CODE, CONST, PA, PB = slice(0, 64), 64, slice(128, 192), slice(192, 256)  # hidden coordinates
REPR = 1000  # class k's output token is REPR + k
VOTE_A, VOTE_B, SCALES = 0.8, 1.0, (0.675, 1.0)
LOGIT = 0.1  # lm_head scale
RMS = (math.sqrt(72 / H), math.sqrt((72 + 64) / H))  # residual rms entering the two deciding layers


def vocab(g) -> dict:
    """Classes and votes (torch generator ``g``): every token's class (token REPR + k has class
    perm[k], so generated text walks a permutation instead of collapsing), class scales, the
    embedding and the lm_head. The next token is REPR + k for the class k with the larger vote
    s_k * w, w = VOTE_A for the class written on PA, VOTE_B for PB (equal classes add up); every
    other token scores below zero."""
    import torch

    had = torch.ones(1, 1)
    while had.shape[0] < 64:  # Sylvester Hadamard 64 x 64: the class codes, orthogonal
        had = torch.cat([torch.cat([had, had], 1), torch.cat([had, -had], 1)], 0)
    perm = torch.randperm(64, generator=g)
    cls = torch.randint(0, 64, (V,), generator=g)
    cls[REPR:REPR + 64] = perm
    scale = torch.tensor(SCALES)[torch.randint(0, 2, (64,), generator=g)]
    emb = torch.zeros(V, H)
    emb[:, CODE], emb[:, CONST:CONST + 8] = had[cls], 1.0
    rep = torch.arange(REPR, REPR + 64)
    head = torch.zeros(V, H)
    head[:, CONST:CONST + 8] = -LOGIT
    head[rep] = 0.0
    head[rep, PA] = LOGIT * VOTE_A * scale[:, None] * had
    head[rep, PB] = LOGIT * VOTE_B * scale[:, None] * had
    return {"had": had, "perm": perm, "cls": cls, "scale": scale, "emb": emb, "head": head, "rep": rep}


def deciding_layer(i: int, kind: str, delta: int, nh: int, nkv: int, neox: bool) -> dict:
    """q, k, v, o weights (float32, [out, in]) of deciding layer ``i`` (0: writes PA, 1: PB):
    head 0 (KV group 0) scores by ``qk(kind, delta)`` on the constant coordinate and copies the
    attended token's code; the other heads' outputs are dropped by o."""
    import torch

    q, k = qk(kind, delta, neox=neox)
    wq, wk, wv, wo = torch.zeros(nh * HD, H), torch.zeros(nkv * HD, H), torch.zeros(nkv * HD, H), torch.zeros(H, nh * HD)
    wq[0:HD, CONST] = q * RMS[i]
    wk[0:HD, CONST] = k * RMS[i]
    wv[0:HD, CODE] = torch.eye(HD)
    wo[PA if i == 0 else PB, 0:HD] = torch.eye(HD) * RMS[i]
    return {"q": wq, "k": wk, "v": wv, "o": wo}


def freqs(theta: float = THETA):
    import numpy as np

    return theta ** (-np.arange(0, HD, 2) / HD)


@functools.lru_cache(maxsize=None)
def profile(kind: str, delta: int = 0):
    """Per RoPE pair j: (amplitude A_j, phase psi_j) of score(d) = sum_j A_j cos(d w_j + psi_j),
    from a linear program (least total amplitude, which bounds bf16's error): 'ramp' rises by
    STEP per position over 0..RAMP_SPAN; 'peak' is PEAK above every other d in 0..PEAK_SPAN.
    Solved once per process (every model of a target reads the same few profiles); the arrays
    are shared: read them, never write them."""
    import numpy as np
    from scipy.optimize import linprog

    w = freqs()
    n = 2 * len(w)

    def basis(ds):
        ds = np.asarray(ds, dtype=float)[:, None]
        return np.concatenate([np.cos(ds * w), np.sin(ds * w)], 1)

    if kind == "ramp":
        b = basis(range(RAMP_SPAN + 1))
        g, margin = b[1:] - b[:-1], STEP
    elif kind == "recent":  # delta 1 first, delta 2 second, each PEAK above what follows
        b = basis(range(PEAK_SPAN + 1))
        g, margin = np.vstack([b[1] - b[2], b[2][None, :] - np.delete(b, [1, 2], 0)]), PEAK
    else:
        b = basis(range(PEAK_SPAN + 1))
        g, margin = b[delta][None, :] - np.delete(b, delta, 0), PEAK
    eye = np.eye(n)
    a_ub = np.vstack([np.hstack([-g, np.zeros_like(g)]), np.hstack([eye, -eye]), np.hstack([-eye, -eye])])
    b_ub = np.concatenate([-margin * np.ones(len(g)), np.zeros(2 * n)])
    res = linprog(np.concatenate([np.zeros(n), np.ones(n)]), A_ub=a_ub, b_ub=b_ub,
                  bounds=[(None, None)] * n + [(0, None)] * n, method="highs")
    assert res.status == 0, res.message
    c = res.x[:n]
    cos, sin = c[: len(w)], c[len(w):]
    return np.hypot(cos, sin), np.arctan2(-sin, cos)


def qk(kind: str, delta: int = 0, neox: bool = False):
    """(q, k), 64 dims each, whose RoPE'd dot product times 1/sqrt(64) is the profile's score.
    Llama 4 (HF) pairs dims (2j, 2j+1); Llama's neox layout pairs (j, j + 32)."""
    import torch

    amp, psi = profile(kind, delta)
    q, k = torch.zeros(HD, dtype=torch.float64), torch.zeros(HD, dtype=torch.float64)
    for j, (a, p) in enumerate(zip(amp, psi)):
        r = math.sqrt(a)
        re, im = (j, j + HD // 2) if neox else (2 * j, 2 * j + 1)
        k[re] = r
        q[re], q[im] = r * math.cos(p) * math.sqrt(HD), r * math.sin(p) * math.sqrt(HD)
    return q, k


def hide_broken_torchvision() -> None:
    """transformers' model classes import torchvision when it is installed; where it does not
    load with the env's torch (the CPU test envs: "operator torchvision::nms does not exist"),
    it is marked absent, as transformers then expects. Called before a model class is read."""
    import sys

    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure to load means: absent
        sys.modules["torchvision"] = None


def greedy(model, prompts: list, max_new: int) -> tuple:
    """Greedy continuation of equal-length prompts, the whole sequence recomputed every step (no
    cache). Returns (outputs, smallest relative logit margin of each request)."""
    import torch

    ids = torch.tensor(prompts)
    margins = torch.full((len(prompts),), float("inf"))
    with torch.no_grad():
        for _ in range(max_new):
            logits = model(input_ids=ids).logits[:, -1].float()
            top = logits.topk(2, dim=-1).values
            margins = torch.minimum(margins, (top[:, 0] - top[:, 1]) / top[:, 0].abs().clamp_min(1e-9))
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
    return ids[:, len(prompts[0]):].tolist(), margins.tolist()


def prompts(n: int, length: int, seed: int) -> list:
    """``n`` prompts of ``length`` token ids, the same for a seed everywhere (the first k of n
    are the k prompts of the same seed)."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(10, 2000) for _ in range(length)] for _ in range(n)]


D_PB, D_PA = slice(0, 64), slice(64, 128)  # the EAGLE3 draft's hidden coordinates


def eagle3_draft(voc: dict, g, ff: int, nh: int, nkv: int) -> dict:
    """Weights (sglang's EAGLE3 names, float32) of an EAGLE3 draft for a readout target whose
    layer 0 writes PA and layer 1 (previous token) PB, captured after layer 0 (aux layer id 0):
    ``fc`` carries PA's vote at half weight; the one layer reads [norm(embed) | norm(hidden)]:
    KV group 0 attends the most recent key other than itself (delta 1, else 2: sglang's draft
    extend puts token t_{j+1} at position j, its multi-step draft decode puts t_k at k) and
    copies its code (the B vote); group 1 attends delta 0 and reads the carried hidden state's
    B vote, which head 2 writes back negated, so each step votes B (1) and the carried A (0.5)."""
    import torch

    rms_e, rms_h = math.sqrt(72 / H), math.sqrt((64 + 64 * 0.25) / H)
    dq, dk, dv, do = torch.zeros(nh * HD, 2 * H), torch.zeros(nkv * HD, 2 * H), torch.zeros(nkv * HD, 2 * H), torch.zeros(H, nh * HD)
    for grp, (kind, delta) in enumerate((("recent", 0), ("peak", 0))):
        q, k = qk(kind, delta, neox=True)
        for h in (2 * grp, 2 * grp + 1):
            dq[h * HD:(h + 1) * HD, CONST] = q * rms_e
        dk[grp * HD:(grp + 1) * HD, CONST] = k * rms_e
    dv[0:HD, CODE] = torch.eye(HD)
    dv[HD:2 * HD, H + D_PB.start:H + D_PB.stop] = torch.eye(HD)
    do[D_PB, 0:HD] = torch.eye(HD) * rms_e
    do[D_PB, 2 * HD:3 * HD] = -torch.eye(HD) * rms_h
    fc = torch.zeros(H, 3 * H)
    fc[D_PA, PA] = 0.5 * torch.eye(HD)
    dhead = torch.zeros(V, H)
    dhead[voc["rep"], D_PB] = LOGIT * voc["had"]
    dhead[voc["rep"], D_PA] = LOGIT * voc["had"]
    return {"fc.weight": fc, "embed_tokens.weight": voc["emb"], "lm_head.weight": dhead, "norm.weight": torch.ones(H),
            "midlayer.input_layernorm.weight": torch.ones(H), "midlayer.hidden_norm.weight": torch.ones(H),
            "midlayer.post_attention_layernorm.weight": torch.ones(H),
            "midlayer.self_attn.q_proj.weight": dq, "midlayer.self_attn.k_proj.weight": dk,
            "midlayer.self_attn.v_proj.weight": dv, "midlayer.self_attn.o_proj.weight": do,
            "midlayer.mlp.gate_proj.weight": torch.randn(ff, H, generator=g) * 0.1,
            "midlayer.mlp.up_proj.weight": torch.randn(ff, H, generator=g) * 0.1,
            "midlayer.mlp.down_proj.weight": torch.zeros(H, ff)}


def eagle3_config(ff: int, nh: int, nkv: int) -> dict:
    """config.json of ``eagle3_draft``'s checkpoint (``LlamaForCausalLMEagle3``)."""
    return dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", vocab_size=V, draft_vocab_size=V,
                hidden_size=H, target_hidden_size=H, intermediate_size=ff, num_hidden_layers=1,
                num_attention_heads=nh, num_key_value_heads=nkv, head_dim=HD, max_position_embeddings=4096,
                rms_norm_eps=1e-5, rope_theta=THETA, rope_parameters={"rope_theta": THETA, "rope_type": "default"},
                hidden_act="silu", tie_word_embeddings=False, torch_dtype="bfloat16",
                eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})


def save_draft(root: str, draft: dict, ff: int, nh: int, nkv: int) -> str:
    import json
    import os

    import torch
    from safetensors.torch import save_file

    path = os.path.join(root, "eagle3_draft")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(eagle3_config(ff, nh, nkv), f, indent=1)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in draft.items()}, os.path.join(path, "model.safetensors"))
    return path


def check(hf_model, size: int, label: str, seeds, n: int = 32, length: int = 130, max_new: int = 64,
          show=print) -> dict:
    """A readout target's checks, per prompt seed: ``hf_model(size, dtype=None)`` (transformers,
    float32 unless given) as the reference; the same weights in bf16 equal to it; the smallest
    relative logit margin; requests changed by ``size`` - 1 and + 1 (the window or chunk, named
    ``label``); distinct outputs. ``show`` (None: silent) gets one line per seed."""
    import json

    import torch

    ref32, bf16 = hf_model(size), hf_model(size, dtype=torch.bfloat16)
    near = {w: hf_model(w) for w in (size - 1, size + 1)}
    out = {}
    for s in seeds:
        ps = prompts(n, length, s)
        ref, margin = greedy(ref32, ps, max_new)
        low, _ = greedy(bf16, ps, max_new)
        row = {"bf16_equal": sum(a == b for a, b in zip(ref, low)), "min_margin": round(min(margin), 3),
               "distinct": len({tuple(o) for o in ref})}
        for w, m in near.items():
            other, _ = greedy(m, ps, max_new)
            row[f"changed_by_{label}_{w}"] = sum(a != b for a, b in zip(ref, other))
        out[s] = row
        if show is not None:
            show(f"seed {s}: {json.dumps(row)}")
    return out


def main(hf_model, size: int, label: str, seeds: str = "1,2,3", threads: int = 6) -> None:
    """``python -m sglang_swa_plugin.selftest.targets.<family> [--seeds 1,2,3] [--threads 6]``:
    the target's checks (``check``) at each prompt seed, on ``threads`` CPU threads; the
    defaults are the caller's (the GPU harness's ``python tests/gpu/<family>_target.py`` takes
    them from its environment)."""
    import argparse

    import torch

    ap = argparse.ArgumentParser(description="the target's checks against transformers' float32 output")
    ap.add_argument("--seeds", default=seeds, help=f"comma list of prompt seeds (default: {seeds})")
    ap.add_argument("--threads", type=int, default=threads, help=f"torch CPU threads (default: {threads})")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    check(hf_model, size, label, [int(x) for x in a.seeds.split(",")], show=lambda line: print(line, flush=True))
