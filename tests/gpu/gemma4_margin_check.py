"""CPU check of fi_verify's Gemma4 pair (tests/gpu/e2e_server.py make_gemma4_pair), run by hand:

    .nox/tests-0-5-11/bin/python tests/gpu/gemma4_margin_check.py [--out DIR]

Saves the checkpoints and computes the target under sglang 0.5.11's math on flashinfer
(e2e_server.gemma4_sglang_logits: the prompt one extend whose sliding layers see every key,
then decode steps that see the last 16), on the scenario's 32 prompts (100 tokens, seed 7)
teacher-forced with its own float32 greedy 48-token continuation (what the server generates),
and reports: (a) the top-1/top-2 logit margins in bf16 against the largest bf16-float32
margin difference, whether any argmax differs (none: the bf16 greedy output is the float32
one), and whether any choice changes when no position has a window (a retraction
re-prefills), when every position has one (transformers' semantics) and under transformers
itself; (b) the share of next-token choices that change when the sliding layers (or the
full ones, or one layer) add nothing; (c) the share of positions where the draft's proposal
equals the target's choice, and the accept length of a topk-1 chain of 3 draft steps along the greedy output."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.modules.setdefault("torchvision", None)  # the CPU envs' torchvision does not load with their torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import e2e_server as e  # noqa: E402

PROMPTS, PLEN, NEW, STEPS = 32, 100, 48, 3


def target_logits(model, seqs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=seqs).logits.float()


def greedy(model, prompts: torch.Tensor, new: int) -> torch.Tensor:
    return torch.tensor(e.gemma4_cpu_greedy(model, prompts.tolist(), new))


def draft_logits(w: dict, seqs: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """sglang's LlamaForCausalLMEagle on these weights, in torch: fc([emb, hidden]) with the
    hidden half zero-weighted, one Llama layer (no input norm on layer 0), residual out, no
    final norm (models/llama_eagle.py: the layer's MLP adds zero, hidden + residual out),
    lm_head; EAGLE swaps in the target's embedding and lm_head (equal to the draft's here).
    Positions 0..n-1 (RoPE sees only offsets)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    w = {k: v.to(dtype) for k, v in w.items()}
    B, n = seqs.shape
    x = w["embed_tokens.weight"][seqs]
    x = torch.cat([x, torch.zeros_like(x)], -1) @ w["fc.weight"].T + w["fc.bias"]
    q = (x @ w["layers.0.self_attn.q_proj.weight"].T).view(B, n, 4, 64).transpose(1, 2)
    k = (x @ w["layers.0.self_attn.k_proj.weight"].T).view(B, n, 2, 64).transpose(1, 2)
    v = (x @ w["layers.0.self_attn.v_proj.weight"].T).view(B, n, 2, 64).transpose(1, 2)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None]
    emb = torch.cat([ang, ang], -1)
    q, k = apply_rotary_pos_emb(q, k, emb.cos().to(dtype)[None], emb.sin().to(dtype)[None])
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = (q.float() @ k.float().transpose(-1, -2)) / 8.0
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    o = (s.softmax(-1) @ v.float()).to(dtype).transpose(1, 2).reshape(B, n, 256)
    h = x + o @ w["layers.0.self_attn.o_proj.weight"].T
    # the MLP adds zero (down projection zero): residual out
    return (h @ w["lm_head.weight"].T).float()


def margins(logits: torch.Tensor) -> torch.Tensor:
    top = logits.topk(2, -1).values
    return top[..., 0] - top[..., 1]


def pct(t: torch.Tensor, qs=(0.0, 0.01, 0.05, 0.5)) -> dict:
    t = t.flatten().float()
    return {f"p{int(q * 100)}": round(float(t.quantile(q)), 4) for q in qs}


def first_run(path: str) -> dict:
    """The first fi_verify target (sliding layers' rising term G4_MONO = 300) under sglang's
    math and under the window everywhere (transformers' semantics), in bf16 and float32,
    against that run's server rows and its transformers row (fi_verify.json at ``path``):
    requests whose first token / first 8 tokens / 48 tokens are equal."""
    first = json.load(open(path))
    sd = {k: v.to(torch.bfloat16) for k, v in e.gemma4_readout_weights(mono=300.0)[0].items()}
    reqs = e.prompts(PROMPTS, PLEN, seed=7)
    res = {}
    for dt in (torch.float32, torch.bfloat16):
        for window in (None, 16):
            out = e.gemma4_sglang_greedy(sd, reqs, NEW, dt, window)
            key = f"{'sglang_math' if window is None else 'window_everywhere'}_{str(dt)[6:]}"
            for row in ("ref", "nospec_nohy", "cpu_float32"):
                srv = first[row]["outputs"]
                res[f"{key}_vs_{row}"] = {n: sum(a[:k] == b[:k] for a, b in zip(out, srv)) for n, k in
                                          (("token0", 1), ("tokens_0_7", 8), ("all_48", NEW))}
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--first-run", default=None, help="the first run's fi_verify.json: reproduce its outputs only")
    a = ap.parse_args()
    if a.first_run:
        print(json.dumps(first_run(a.first_run), indent=1))
        return
    from transformers import Gemma4ForCausalLM

    root = a.out or tempfile.mkdtemp(prefix="g4check_")
    target_dir, draft_dir, _ = e.make_gemma4_pair(root)
    w = load_file(os.path.join(target_dir, "model.safetensors"))  # the bf16 checkpoint sglang loads
    dw = load_file(os.path.join(draft_dir, "model.safetensors"))
    prompts = torch.tensor(e.prompts(PROMPTS, PLEN, seed=7))
    # sglang's math (e.gemma4_sglang_logits): the prompt one extend (sliding layers without
    # window), then decode steps (window 16); teacher-forced over the float32 greedy output
    seqs = torch.cat([prompts, torch.tensor(e.gemma4_sglang_greedy(w, prompts.tolist(), NEW))], 1)
    pos = slice(PLEN - 1, PLEN - 1 + NEW)  # the logits that choose the generated tokens
    sg = lambda wt, dtype=torch.float32, prefill=PLEN, window=None: e.gemma4_sglang_logits(
        wt, seqs, prefill, dtype, window)[:, pos]
    lf, lb = sg(w), sg(w, torch.bfloat16)
    top1 = lf.max(-1).values
    noise = (lb - lf).abs()
    choice = lf.argmax(-1)
    res = {"positions": int(lf.shape[0] * lf.shape[1]),
           "a_margin_f32": pct(margins(lf)), "a_margin_bf16": pct(margins(lb)),
           "a_relative_margin_f32": pct(margins(lf) / top1),
           "a_top1_logit": pct(top1, (0.0, 0.5, 1.0)),
           "a_bf16_minus_f32_max_abs_logit": round(float(noise.max()), 4),
           "a_bf16_minus_f32_max_abs_margin": round(float((margins(lb) - margins(lf)).abs().max()), 4),
           # equal teacher-forced argmax at every step <=> the bf16 greedy output equals the f32 one
           "a_argmax_differs_bf16_vs_f32": int((lb.argmax(-1) != choice).sum())}
    res["a_teacher_forced_argmax_equals_greedy"] = bool((choice == seqs[:, PLEN:]).all())
    res["a_min_margin_over_max_noise"] = round(res["a_margin_bf16"]["p0"] / max(res["a_bf16_minus_f32_max_abs_margin"], 1e-9), 1)
    # path independence: every position re-prefilled (a retraction at any step: no window
    # anywhere), the window applied everywhere (transformers), and transformers itself
    tf = Gemma4ForCausalLM.from_pretrained(target_dir, dtype=torch.float32, attn_implementation="eager").eval()
    res["a_argmax_differs_no_window_anywhere"] = int((sg(w, prefill=seqs.shape[1]).argmax(-1) != choice).sum())
    res["a_argmax_differs_window_everywhere"] = int((sg(w, window=16).argmax(-1) != choice).sum())
    res["a_argmax_differs_transformers_f32"] = int((target_logits(tf, seqs)[:, pos].argmax(-1) != choice).sum())
    res["a_greedy_requests_identical_transformers_vs_sglang_math"] = int(
        (greedy(tf, prompts, NEW) == seqs[:, PLEN:]).all(1).sum())

    for name, layers in (("no_sliding_layers", (0, 2)), ("no_full_layers", (1, 3)), ("no_layer0", (0,)), ("no_layer2", (2,))):
        cut = dict(w)
        for i in layers:
            cut[f"model.layers.{i}.post_attention_layernorm.weight"] = torch.zeros_like(w["model.norm.weight"])
        res[f"b_changed_{name}"] = round(float((sg(cut).argmax(-1) != choice).float().mean()), 4)
    res["b_generated_token_equals_current_token"] = round(float((seqs[:, PLEN:] == seqs[:, PLEN - 1:-1]).float().mean()), 4)

    # (c) EAGLE: the draft at position i reads token i + 1 (and the target's hidden state i,
    # unused) and proposes token i + 2; over the token sequence that is draft_logits at index
    # j proposing token j + 1, as the target's logits at j do.
    dl = draft_logits(dw, seqs)
    dl_bf = draft_logits(dw, seqs, torch.bfloat16)
    res["c_draft_equals_target_choice"] = round(float((dl[:, pos].argmax(-1) == choice).float().mean()), 4)
    res["c_draft_margin_bf16"] = pct(margins(dl_bf[:, pos]))
    res["c_draft_relative_margin_f32"] = pct(margins(dl[:, pos]) / dl[:, pos].max(-1).values)
    res["c_draft_bf16_minus_f32_max_abs_margin"] = round(float((margins(dl_bf[:, pos]) - margins(dl[:, pos])).abs().max()), 4)
    res["c_draft_argmax_differs_bf16_vs_f32"] = int((dl_bf[:, pos].argmax(-1) != dl[:, pos].argmax(-1)).sum())
    lens = []
    for r in range(PROMPTS):
        j = PLEN - 1  # verify steps along the greedy output: the draft proposes STEPS tokens
        while j < PLEN - 1 + NEW - STEPS:
            ctx = seqs[r:r + 1, :j + 1]
            acc = 0
            for _ in range(STEPS):
                prop = draft_logits(dw, ctx)[0, -1].argmax()
                if prop != seqs[r, ctx.shape[1]]:
                    break
                acc += 1
                ctx = torch.cat([ctx, prop.view(1, 1)], 1)
            lens.append(acc + 1)
            j += acc + 1
    res["c_accept_length_topk1_3_steps"] = round(sum(lens) / len(lens), 3)
    # attention: the score of each layer's (and draft head's) peak key minus the best other key
    # up to 160 back (sglang's prefill applies no window to the sliding layers)
    gaps = {}
    for name, (offset, mono, reach) in {
            "L0_sliding": (e.G4_LAYERS[0][0], e.G4_MONO, 160), "L2_sliding": (e.G4_LAYERS[2][0], e.G4_MONO, 160),
            "L1_full": (e.G4_LAYERS[1][0], 0.0, 160), "draft_L0": (e.G4_LAYERS[0][0], 0.0, 160),
            "draft_L1": (e.G4_LAYERS[1][0], 0.0, 160)}.items():
        q, k = e._gemma4_qk(offset, mono)
        score = []
        for d in range(reach + 1):
            w = 10000.0 ** (-torch.arange(32, dtype=torch.float64) / 32) * d
            zq, zk = torch.complex(q[:32], q[32:]), torch.complex(k[:32], k[32:])
            score.append(float((zq * zk.conj() * torch.exp(1j * w)).real.sum()))
        score = torch.tensor(score)
        gaps[name] = round(float(score[offset] - torch.cat([score[:offset], score[offset + 1:]]).max()), 2)
    res["attention_peak_gap"] = gaps
    res["cpu_greedy_from_checkpoint_equals"] = e.gemma4_sglang_greedy(target_dir, prompts[:2].tolist(), 3) == seqs[:2, PLEN:PLEN + 3].tolist()
    res["checkpoints"] = root
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
