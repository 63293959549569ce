"""End-to-end proof on a Hopper GPU: real sglang servers with a tiny hybrid-SWA model
(GPT-OSS-style, alternating sliding/full layers, dummy weights) and a tiny draft model,
with and without the plugin (sglang loads it by itself through its entry point; "without"
uses sglang's own allow-list SGLANG_PLUGINS so the plugin is never loaded).

    PARALLEL=8 python tests/gpu/e2e_server.py SCENARIO [SCENARIO ...] --out DIR

CUDA graphs are ON (sglang's default) in every run unless a row says "graphs off".
PARALLEL servers run side by side on the one GPU (default 1), each on its own port.

Scenarios:
  fa3_eagle3   seed 002: FA3 + EAGLE3 tree decoding (topk 2) on a small SWA pool. Greedy
               output with speculative decoding must equal the same server's output with
               it off. Runs: reference (no spec), spec without plugin, spec with plugin.
  xqa_verify   trtllm_mha decode (XQA) with --speculative-attention-mode decode: TARGET_VERIFY
               through the XQA decode kernel in CUDA graphs, on a target whose sliding
               layers decide its output (make_swa_pair), bf16 and FP8 KV; against no-spec,
               side by side with the fa3-verify control.
  fa3_seq      seed 002 one request at a time against --disable-hybrid-swa-memory.
  guard_server the opt-in index guard on seed 002's path, with and without the FA3 fix.
  trtllm_eagle_accept
               seed 001 with a draft the target accepts (make_eagle_pair): trtllm_mha decode
               + fa3 prefill, EAGLE topk 1; draft proposals and accept length against
               --disable-hybrid-swa-memory, without and with the plugin.
  llama4_fa3   issue #19: a tiny Llama 4 (chunked layers in the SWA pool) on FA3, page size 1
               and 16, plain decode and EAGLE3 topk 1 / 2, without and with the plugin,
               against plain decode on one pool (--disable-hybrid-swa-memory).
  llama4_eagle issue #19 item 2 (fa3_local_attn_verify): the llama4_fa3 target in CUDA-graph
               EAGLE3 verify, page 1 and 16, topk 1 (and 2), without / with the
               plugin, against plain decode and a graphs-off EAGLE3 control.
  llama4_tree  issue #19 item 2, topk > 1 (fa3_local_attn_tree_verify): the llama4_fa3 target
               in EAGLE3 tree verify (topk 2), page 1, CUDA graphs on and off, without / with
               the plugin, against plain decode and the graphs-off topk-1 control.
  llama4_tree_wide  the rounding control of llama4_tree: the same model with a chunk wider
               than every request (its chunked layers then attend over the whole context, so
               stock topk 2 on one pool is exact up to rounding), stock and with the plugin.
  fi_verify    issue #17, flashinfer + EAGLE verify on sliding-window layers (flashinfer_swa_verify):
               a Gemma4 target whose sliding layers decide its output with stable margins
               (make_gemma4_pair) and its real-weight EAGLE draft, topk 1/2 with and without the
               plugin, against no spec; control: no spec on one pool; accept length against
               the same spec run on one pool.
  triton_mtp   issue #18 (triton_swa_draft): tiny MiMo-V2 target + MTP draft (a sliding-window
               layer) on the Triton backend, multi-layer EAGLE and NEXTN, with and without the
               plugin, against no spec.
  throughput   issue #31: tokens/s of 64 concurrent greedy requests with and without the plugin
               (GPT-OSS target; fa3 plain, fa3 EAGLE3 topk 1, trtllm_mha plain), warm servers side
               by side, alternating rounds; the plugin/stock ratio per row.
  cost         decode throughput for COST_SETTINGS (plugin on / off / on with the guard),
               alternating, warm servers, several repetitions.
Each scenario writes DIR/<scenario>.json and the server logs DIR/<run>.log.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# Servers run side by side on the one GPU (PARALLEL at a time, each on its own port): one
# request at a time inside a server keeps its arithmetic independent of the others.
PARALLEL = int(os.environ.get("PARALLEL", "1"))
# Each server gets a block of 10 ports, its HTTP port and (+5) its torch.distributed port,
# both checked free: servers started side by side cannot collide (sglang otherwise draws the
# distributed port at random and two servers can draw the same one).
_POOL: "ThreadPoolExecutor | None" = None
# The servers, their states and the judging are the selftest's (sglang_swa_plugin.selftest: the
# installed plugin's, as every server here imports it): OFF keeps the plugin out through sglang's
# allow-list, ON names it.
from sglang_swa_plugin.selftest.judging import compare, first_divergences, judge  # noqa: E402
from sglang_swa_plugin.selftest.server import OFF, ON, Server, first_error  # noqa: E402
from sglang_swa_plugin.selftest import rows as _rows, server as _server  # noqa: E402
from sglang_swa_plugin.selftest.rows import eagle3 as eagle3_real  # noqa: E402

START_TIMEOUT = float(os.environ.get("START_TIMEOUT", "480"))


def gpt_oss_config(vocab: int):
    """The tiny GPT-OSS-style hybrid model: 4 layers sliding/full/sliding/full, window 16,
    4 experts, hidden 256, init std 0.1."""
    from transformers import GptOssConfig

    cfg = GptOssConfig(
        vocab_size=vocab, hidden_size=256, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=16, max_position_embeddings=4096,
        layer_types=["sliding_attention", "full_attention"] * 2, tie_word_embeddings=False,
        swiglu_limit=7.0, hidden_act="silu", initializer_range=0.1,
    )
    cfg.architectures = ["GptOssForCausalLM"]
    cfg.torch_dtype = "bfloat16"
    return cfg


def make_models(root: str, vocab: int = 2048) -> tuple:
    from transformers import LlamaConfig

    target = os.path.join(root, "target")
    cfg = gpt_oss_config(vocab)
    # Random weights with a large init range, saved as a real checkpoint: sglang's dummy
    # weights (uniform +-1e-3) make attention almost uniform, so reading the wrong KV slots
    # would hardly change the output and equality would prove nothing.
    import torch
    from transformers import GptOssForCausalLM

    torch.manual_seed(0)
    GptOssForCausalLM(cfg).to(torch.bfloat16).save_pretrained(target, safe_serialization=True)
    draft = os.path.join(root, "draft")
    d = LlamaConfig(
        vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    d.architectures = ["LlamaForCausalLMEagle3"]
    d.torch_dtype = "bfloat16"
    d.draft_vocab_size = vocab
    d.target_hidden_size = 256
    d.eagle_config = {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
    d.save_pretrained(draft)
    return target, draft


def make_readout_pair(root: str, name: str, seed: int, o_scale: tuple, draft_copies: "int | None") -> tuple:
    """A GPT-OSS-style target whose next token is argmax(lm_head(E + sum of the attention
    outputs)), and an EAGLE (``LlamaForCausalLMEagle``) draft built to predict it:
    - target: 4 layers sliding/full/sliding/full (window 16); embeddings are +-1, so the RMS
      norms are the identity in bf16; every expert's down projection and every bias is zero and
      the sinks are -30 (no weight), so only attention adds to the residual; layer i's o_proj
      is scaled by ``o_scale[i]`` (0: the layer adds nothing);
    - draft: ``fc`` = [I | 0] passes the token embedding through (the target's hidden state is
      ignored); its one layer (layer id 0, whose input norm EAGLE skips) is a copy of target
      layer ``draft_copies``'s attention with the same RoPE, or adds nothing (None); its MLP
      adds zero. argmax(lm_head(x)) = argmax(lm_head(norm(x))).
    Returns (target dir, draft dir)."""
    import torch
    from safetensors.torch import save_file
    from transformers import GptOssForCausalLM, LlamaConfig

    H, V, FF = 256, 2048, 512
    cfg = gpt_oss_config(V)
    torch.manual_seed(seed)
    model = GptOssForCausalLM(cfg).to(torch.bfloat16)
    sd = model.state_dict()
    with torch.no_grad():
        sd["model.embed_tokens.weight"].copy_(torch.randint(0, 2, (V, H)) * 2 - 1)
        sd["model.norm.weight"].fill_(1)
        for i in range(4):
            p = f"model.layers.{i}."
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                sd[p + f"self_attn.{n}.bias"].zero_()
            sd[p + "self_attn.sinks"].fill_(-30.0)
            sd[p + "mlp.experts.down_proj"].zero_()
            sd[p + "mlp.experts.down_proj_bias"].zero_()
            sd[p + "input_layernorm.weight"].fill_(1)
            sd[p + "post_attention_layernorm.weight"].fill_(1)
            sd[p + "self_attn.o_proj.weight"].mul_(o_scale[i])
    target = os.path.join(root, f"target_{name}")
    model.save_pretrained(target, safe_serialization=True)

    draft = os.path.join(root, f"draft_{name}")
    d = LlamaConfig(
        vocab_size=V, hidden_size=H, intermediate_size=FF, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=False, rope_parameters=dict(cfg.rope_parameters),
    )
    d.architectures = ["LlamaForCausalLMEagle"]
    d.torch_dtype = "bfloat16"
    d.save_pretrained(draft)
    bf = lambda t: t.detach().to(torch.bfloat16).contiguous()
    w = {"embed_tokens.weight": bf(sd["model.embed_tokens.weight"]), "lm_head.weight": bf(sd["lm_head.weight"]),
         "fc.weight": bf(torch.cat([torch.eye(H), torch.zeros(H, H)], dim=1)), "fc.bias": bf(torch.zeros(H)),
         "layers.0.mlp.gate_proj.weight": bf(torch.randn(FF, H) * 0.1),
         "layers.0.mlp.up_proj.weight": bf(torch.randn(FF, H) * 0.1),
         "layers.0.mlp.down_proj.weight": bf(torch.zeros(H, FF)),
         "layers.0.post_attention_layernorm.weight": bf(torch.ones(H))}
    for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
        src = sd[f"model.layers.{draft_copies if draft_copies is not None else 0}.self_attn.{n}.weight"]
        w[f"layers.0.self_attn.{n}.weight"] = bf(src if draft_copies is not None or n != "o_proj" else torch.zeros_like(src))
    save_file(w, os.path.join(draft, "model.safetensors"))
    return target, draft


def make_eagle_pair(root: str) -> tuple:
    """Seed 001's pair: only target layer 1 (full attention) adds to the residual and the
    draft copies it, so a draft reading the right KV is accepted at nearly every step. The
    draft's layer id 0 is a sliding layer of the target: that is what seed 001 mixes up."""
    return make_readout_pair(root, "eagle", 1, (0, 1, 0, 0), draft_copies=1)


def make_swa_pair(root: str) -> tuple:
    """A target whose sliding-window layers decide its output, for the verify paths: layers
    0 and 2 (sliding) add attention scaled 0.1, layers 1 and 3 (full) 0.03. Measured in torch
    on CPU (teacher-forced random continuations of 60-token prompts, 288 positions): removing
    the sliding layers changes 43 % of the next-token choices, removing the full layers 16 %,
    lifting the window (the sliding layers attend to everything) 49 %. The draft adds nothing
    to the embedding, so it proposes argmax(lm_head(E_t)), the target's choice at 59 % of
    positions: most verify steps carry accepted draft rows, whose logits come from verify
    rows 1-3."""
    return make_readout_pair(root, "swa", 2, (0.1, 0.03, 0.1, 0.03), draft_copies=None)


LLAMA4_CHUNK = 32  # attention_chunk_size of the tiny Llama 4 (a multiple of page size 16)


def make_llama4_pair(root: str, seed: int = 4, chunk: int = LLAMA4_CHUNK) -> tuple:
    """A tiny text-only ``Llama4ForConditionalGeneration`` (the one Llama 4 architecture sglang
    serves on the hybrid SWA pool and with chunked attention) and a tiny EAGLE3 draft.

    Target: 4 dense layers (``interleave_moe_layer_step`` 0, ``moe_layers`` []): layers 0-2
    are chunked ("local", RoPE) and sit in the SWA pool, layer 3 is global (NoPE) in the full
    pool, as sglang's Llama 4 code fixes it ((i + 1) % 4). No vision weights in the checkpoint
    and multimodal off (sglang's default for Llama 4): no processor or tokenizer is needed with
    --skip-tokenizer-init. Readout design as make_readout_pair: embeddings +-1, norms 1, every
    MLP's down projection zero, so only attention adds to the residual; the chunked layers'
    o_proj is scaled 0.1, the global layer's 0.03, so the chunked layers decide most next-token
    choices. Draft: ``LlamaForCausalLMEagle3`` config only (served with dummy weights), reading
    target layers 0-2."""
    import torch
    from safetensors.torch import save_file

    H, V, FF, NH, NKV, HD, L = 256, 2048, 512, 4, 2, 64, 4
    text = dict(
        model_type="llama4_text", vocab_size=V, hidden_size=H, intermediate_size=FF, intermediate_size_mlp=FF,
        num_hidden_layers=L, num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD,
        max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_parameters={"rope_theta": 500000.0, "rope_type": "default"}, rope_scaling=None,
        attention_chunk_size=chunk, no_rope_layers=[int((i + 1) % 4 != 0) for i in range(L)],
        no_rope_layer_interval=4, interleave_moe_layer_step=0, moe_layers=[], num_local_experts=0,
        num_experts_per_tok=1, use_qk_norm=False, attn_temperature_tuning=False, floor_scale=8192,
        attn_scale=0.1, attention_bias=False, hidden_act="silu", tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="bfloat16",
    )
    vision = dict(model_type="llama4_vision_model", hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=128, image_size=336, patch_size=14, num_channels=3, vision_output_dim=64,
                  projector_input_dim=64, projector_output_dim=64, pixel_shuffle_ratio=0.5, rope_theta=10000)
    cfg = dict(architectures=["Llama4ForConditionalGeneration"], model_type="llama4", text_config=text,
               vision_config=vision, image_token_index=V - 1, boi_token_index=V - 2, eoi_token_index=V - 3,
               tie_word_embeddings=False, torch_dtype="bfloat16")
    target = os.path.join(root, "target_llama4")
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(target, "generation_config.json"), "w") as f:
        json.dump({}, f)
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: (torch.randn(*shape, generator=g) * 0.1).to(torch.bfloat16)
    p = "language_model.model."
    w = {p + "embed_tokens.weight": (torch.randint(0, 2, (V, H), generator=g) * 2 - 1).to(torch.bfloat16),
         p + "norm.weight": torch.ones(H, dtype=torch.bfloat16), "language_model.lm_head.weight": rnd(V, H)}
    for i in range(L):
        q = f"{p}layers.{i}."
        scale = 0.1 if (i + 1) % 4 else 0.03
        w[q + "self_attn.q_proj.weight"] = rnd(NH * HD, H)
        w[q + "self_attn.k_proj.weight"] = rnd(NKV * HD, H)
        w[q + "self_attn.v_proj.weight"] = rnd(NKV * HD, H)
        w[q + "self_attn.o_proj.weight"] = (rnd(H, NH * HD).float() * scale).to(torch.bfloat16)
        w[q + "input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        w[q + "post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        w[q + "feed_forward.gate_proj.weight"] = rnd(FF, H)
        w[q + "feed_forward.up_proj.weight"] = rnd(FF, H)
        w[q + "feed_forward.down_proj.weight"] = torch.zeros(H, FF, dtype=torch.bfloat16)
    save_file(w, os.path.join(target, "model.safetensors"))

    draft = os.path.join(root, "draft_llama4_eagle3")
    os.makedirs(draft, exist_ok=True)
    d = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", vocab_size=V, draft_vocab_size=V,
             hidden_size=H, target_hidden_size=H, intermediate_size=FF, num_hidden_layers=1,
             num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD, max_position_embeddings=4096,
             rms_norm_eps=1e-5, rope_theta=500000.0, hidden_act="silu", tie_word_embeddings=False,
             torch_dtype="bfloat16", eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    with open(os.path.join(draft, "config.json"), "w") as f:
        json.dump(d, f, indent=1)
    return target, draft


def prompts(n: int, length: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    return [[rng.randrange(10, 2000) for _ in range(length)] for _ in range(n)]


def run(name, out, args, env, reqs, max_new, concurrency=32, rounds=1):
    """One server (``sglang_swa_plugin.selftest.server.run``: its states, outputs, accept length,
    retracting steps), START_TIMEOUT from the environment; ``probe``: the lines of the test-side
    probes on its path (tests/gpu/retract_probe), if any."""
    res = _server.run(name, out, args, env, reqs, max_new, concurrency, rounds, start_timeout=START_TIMEOUT)
    log = os.path.join(out, f"{name}.log")
    lines = open(log, errors="replace").read().splitlines() if os.path.exists(log) else []
    res["probe"] = [l.split("RETRACT_PROBE ", 1)[1] for l in lines if "RETRACT_PROBE " in l]
    return res


def run_many(runs: dict) -> dict:
    """``{key: (name, out, args, env, reqs, max_new[, kwargs])}`` -> ``{key: result}``, run on the
    shared pool (PARALLEL servers at a time across every scenario)."""
    def one(spec):
        return run(*spec[:6], **(spec[6] if len(spec) > 6 else {}))

    if _POOL is None:
        return {k: one(v) for k, v in runs.items()}
    futures = {k: _POOL.submit(one, v) for k, v in runs.items()}
    return {k: f.result() for k, f in futures.items()}


def eagle3(draft: str, topk: int, steps: int = 3, draft_tokens: int = 4) -> list:
    """Server arguments for the tiny dummy-weight EAGLE3 draft."""
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
            "--speculative-draft-load-format", "dummy", "--speculative-eagle-topk", str(topk),
            "--speculative-num-steps", str(steps), "--speculative-num-draft-tokens", str(draft_tokens)]


# sglang's defaults but for the piecewise (prefill) CUDA graphs, whose torch.compile takes
# ~2 minutes per server and does not touch the decode/verify graphs these runs are about.
# CUDA graphs are ON; eager(args) is the secondary --disable-cuda-graph row.
# MEM_FRACTION: with servers side by side, each must still find (1 - fraction) of the card free
# when it sizes its pools (its KV pool is capped by --max-total-tokens anyway).
BASE = ["--skip-tokenizer-init", "--disable-piecewise-cuda-graph", "--mem-fraction-static", os.environ.get("MEM_FRACTION", "0.5"),
        "--page-size", "1", "--max-total-tokens", os.environ.get("MAX_TOTAL_TOKENS", "4096"),
        "--swa-full-tokens-ratio", os.environ.get("SWA_RATIO", "0.1"), "--random-seed", "0"]


def eager(args: list) -> list:
    return args + ["--disable-cuda-graph"]


def judged(runs: dict, ref: str) -> dict:
    """Every run's outputs against ``runs[ref]``'s."""
    out = {}
    for key, r in runs.items():
        if key != ref:
            cmp = compare(r.get("outputs") or [], runs[ref].get("outputs") or [])
            out[f"{key}_vs_{ref}"] = {**cmp, "bands": first_divergences(cmp)}
    return out


def scenario_fa3_eagle3(out, target, draft):
    reqs = prompts(32, 60)
    common = BASE + ["--model-path", target, "--attention-backend", "fa3"]
    spec = eagle3(draft, topk=2)
    runs = run_many({
        "reference": ("fa3_ref_nospec", out, common, ON, reqs, 64),
        "without_plugin": ("fa3_eagle3_without_plugin", out, common + spec, OFF, reqs, 64),
        "with_plugin": ("fa3_eagle3_with_plugin", out, common + spec, ON, reqs, 64),
    })
    return {**runs, "reference_distinct_outputs": len({tuple(o) for o in runs["reference"].get("outputs") or [] if o}),
            **judged(runs, "reference")}


def scenario_fa3_seq(out, target, draft):
    """seed 002, free of batch effects: one request at a time, so that two servers compute
    the same arithmetic. EAGLE3 topk 2 on the hybrid SWA pool without and with the plugin,
    against the same spec run with --disable-hybrid-swa-memory (no index translation at all,
    correct by construction). With the plugin the outputs must be identical to it."""
    reqs = prompts(12, 60, seed=3)
    common = BASE + ["--model-path", target, "--attention-backend", "fa3"] + eagle3(draft, topk=2)
    runs = run_many({
        "no_hybrid": ("fa3seq_no_hybrid_swa", out, common + ["--disable-hybrid-swa-memory"], ON, reqs, 96, {"concurrency": 1}),
        "without_plugin": ("fa3seq_without_plugin", out, common, OFF, reqs, 96, {"concurrency": 1}),
        "with_plugin": ("fa3seq_with_plugin", out, common, ON, reqs, 96, {"concurrency": 1}),
    })
    return {**runs, **judged(runs, "no_hybrid")}


def scenario_fa3_control(out, target, draft):
    """Controls for fa3_eagle3 (same prompts): the same spec run without the hybrid SWA pool
    (no index translation at all: correct by construction), and topk 1 (which never takes
    the topk > 1 SWA path), both with the plugin loaded. Their divergence from the no-spec
    reference is what bf16 numerics alone produce."""
    reqs = prompts(32, 60)
    common = BASE + ["--model-path", target, "--attention-backend", "fa3"]
    runs = run_many({
        "no_hybrid": ("fa3_eagle3_no_hybrid_swa", out, common + eagle3(draft, topk=2) + ["--disable-hybrid-swa-memory"], ON, reqs, 64),
        "topk1": ("fa3_eagle3_topk1", out, common + eagle3(draft, topk=1), ON, reqs, 64),
    })
    return {**runs, **judged(runs, "no_hybrid")}


def scenario_guard_server(out, target, draft):
    """The opt-in index guard on a real server (seed 002's path: FA3 + EAGLE3 topk 2, 32
    requests, small SWA pool): with every fix the run completes (no false alarm); with the
    FA3 fix taken out the scheduler stops on the guard's named device-side assert instead
    of an illegal memory access or silently wrong tokens."""
    reqs = prompts(32, 60)
    common = BASE + ["--model-path", target, "--attention-backend", "fa3"] + eagle3(draft, topk=2)
    guard = {**ON, "SGLANG_SWA_PLUGIN_GUARD": "1"}
    runs = run_many({
        "all_fixes": ("guard_fa3_eagle3_all_fixes", out, common, guard, reqs, 64),
        "without_fa3_fix": ("guard_fa3_eagle3_without_fa3_fix", out, common,
                            {**guard, "SGLANG_SWA_PLUGIN_FIXES": "-fa3_spec_translate"}, reqs, 64),
    })
    log = open(os.path.join(out, "guard_fa3_eagle3_without_fa3_fix.log"), errors="replace").read()
    runs["without_fa3_fix"]["guard_message"] = [l[-300:] for l in log.splitlines()
                                                if "Assertion" in l and "swa_index_guard:" in l][:3]
    runs["without_fa3_fix"]["illegal_memory_access"] = "illegal memory access" in log
    return runs


RECORDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spec_recorder")


def recorded(env: dict, out: str, name: str) -> dict:
    """``env`` plus the test-side recorder of the draft tokens each verify step checks."""
    path = os.path.join(out, f"{name}.proposals.jsonl")
    if os.path.exists(path):
        os.remove(path)
    return {**env, "SWA_E2E_RECORD": path,
            "PYTHONPATH": os.pathsep.join(filter(None, [RECORDER, os.environ.get("PYTHONPATH")]))}


def proposals(out: str, name: str) -> tuple:
    """(draft tokens of every verified request-step, how many of those steps read a request
    whose SWA-pool and full-pool indices differ somewhere)."""
    path = os.path.join(out, f"{name}.proposals.jsonl")
    lines = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    tokens = [req for rec in lines for req in rec["tokens"]]
    differs = [d for rec in lines if isinstance(rec["swa_index_differs"], list) for d in rec["swa_index_differs"]]
    return tokens, sum(1 for d in differs if d)


def compare_proposals(a: list, b: list) -> dict:
    n = min(len(a), len(b))
    return {"verify_steps": [len(a), len(b)], "identical_steps": sum(1 for x, y in zip(a, b) if x == y),
            "first_different_step": next((i for i in range(n) if a[i] != b[i]), None)}


def scenario_trtllm_eagle_accept(out, _target, _draft):
    """seed 001 with a draft whose proposals the target accepts (make_eagle_pair): trtllm_mha
    decode (XQA on Hopper) + fa3 prefill, EAGLE topk 1, 3 steps. The EAGLE draft owns a
    full-only pool; without the fix its trtllm_mha backends resolve the target's SWA pool
    through the shared allocator and, its layer 0 being a sliding layer there, push the
    draft's full-pool indices through the full->SWA mapping in the draft decode steps
    (proposals 2 and 3; the first comes from the fa3 draft extend). Recorded: every verify
    step's draft tokens and the accept length; with the fix both must equal those of the
    same run with --disable-hybrid-swa-memory. One request at a time; prompts of 200 tokens
    (page size 64 for trtllm_mha: 5 pages a request, 6 in the SWA pool), so that each request
    makes the SWA radix cache evict the previous one's SWA pages while its full pages stay
    cached: the two index spaces drift apart from the second request on (recorded per step).
    With 60-token prompts they never did, and the bug had nothing to show."""
    target, draft = make_eagle_pair(tempfile.mkdtemp(prefix="swa_eagle_"))
    reqs = prompts(12, 200, seed=1)
    common = BASE + ["--model-path", target, "--decode-attention-backend", "trtllm_mha",
                     "--prefill-attention-backend", "fa3",
                     "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", draft,
                     "--speculative-eagle-topk", "1", "--speculative-num-steps", "3",
                     "--speculative-num-draft-tokens", "4"]
    kinds = {"no_hybrid_swa": (["--disable-hybrid-swa-memory"], ON), "without_plugin": ([], OFF), "with_plugin": ([], ON)}
    names = {key: f"eagle_accept_{key}" for key in kinds}
    res = run_many({key: (names[key], out, common + extra, recorded(env, out, names[key]), reqs, 96, {"concurrency": 1})
                    for key, (extra, env) in kinds.items()})
    for key in kinds:
        res[key]["proposals"], res[key]["steps_with_index_spaces_apart"] = proposals(out, names[key])
    ref = res["no_hybrid_swa"]
    for key in ("without_plugin", "with_plugin"):
        res[f"{key}_vs_no_hybrid"] = compare(res[key].get("outputs") or [], ref.get("outputs") or [])
        res[f"{key}_proposals_vs_no_hybrid"] = compare_proposals(res[key]["proposals"], ref["proposals"])
    res["reference_distinct_outputs"] = len({tuple(o) for o in ref.get("outputs") or [] if o})
    return res


def scenario_xqa_verify(out, _target, _draft):
    """trtllm_mha decode on Hopper (XQA) with ``--speculative-attention-mode decode``: TARGET_VERIFY
    runs the XQA decode kernel with 4 query tokens per request (trtllm_xqa_spec_decode), in
    CUDA graphs (sglang's default). Target: make_swa_pair (its sliding-window layers decide
    its output; its draft is accepted often, so verify rows 1-3 matter). 32 prompts of 60
    tokens (window 16), 64 new tokens, one request at a time, greedy. Judged against the
    no-spec run of the same server configuration, side by side with the control: the same
    speculative run with verify on fa3 (``--speculative-attention-mode prefill``, the path
    upstream supports), so that kernel rounding is told apart from a bug. Per KV dtype in
    XQA_KVS (default "auto,fp8_e4m3"). Secondary rows (first KV dtype only): graphs off;
    without the fix (XQA refuses the call at start-up); OLD_PLUGIN (a directory holding
    another build of the plugin, e.g. 6b08c25's) in front of the payload, graphs on."""
    target, draft = make_swa_pair(tempfile.mkdtemp(prefix="swa_xqa_"))
    reqs = prompts(32, 60, seed=3)
    spec = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", draft,
            "--speculative-eagle-topk", "1", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"]
    kvs = os.environ.get("XQA_KVS", "auto,fp8_e4m3").split(",")
    runs = {}
    for i, kv in enumerate(kvs):
        common = BASE + ["--model-path", target, "--decode-attention-backend", "trtllm_mha",
                         "--prefill-attention-backend", "fa3", "--kv-cache-dtype", kv]
        xqa = common + spec + ["--speculative-attention-mode", "decode"]
        one = {"concurrency": 1}
        runs[f"{kv}_nospec"] = (f"xqa_{kv}_nospec", out, common, ON, reqs, 64, one)
        runs[f"{kv}_xqa_verify"] = (f"xqa_{kv}_xqa_verify", out, xqa, ON, reqs, 64, one)
        runs[f"{kv}_fa3_verify_control"] = (f"xqa_{kv}_fa3_verify", out, common + spec + ["--speculative-attention-mode", "prefill"],
                                            ON, reqs, 64, one)
        if i == 0:
            runs[f"{kv}_xqa_verify_graphs_off"] = (f"xqa_{kv}_xqa_verify_eager", out, eager(xqa), ON, reqs, 64, one)
            runs[f"{kv}_xqa_verify_without_fix"] = (f"xqa_{kv}_without_fix", out, xqa,
                                                    {**ON, "SGLANG_SWA_PLUGIN_FIXES": "-trtllm_xqa_spec_decode"}, reqs[:2], 16, one)
            if os.environ.get("OLD_PLUGIN"):
                runs[f"{kv}_xqa_verify_old_plugin"] = (f"xqa_{kv}_xqa_verify_old_plugin", out, xqa,
                                                       {**ON, "PYTHONPATH_PREPEND": os.environ["OLD_PLUGIN"]}, reqs, 64, one)
    res = run_many(runs)
    for kv in kvs:
        mine = {k[len(kv) + 1:]: v for k, v in res.items() if k.startswith(kv + "_")}
        res[f"{kv}_judged"] = judged({k: v for k, v in mine.items() if k != "xqa_verify_without_fix"}, "nospec")
    return res


def scenario_batched_decode(out, _target, _draft):
    """Plain decode (no speculative decoding), one request at a time against 16 at once: XQA
    (trtllm_mha decode on Hopper) and, as the control, fa3. A request's decode attention does
    not depend on its neighbours, so batching may change its output only through rounding.
    Asks whether XQA misreads the strided query a model hands over once a batch has more than
    one request (tests/gpu/xqa_window_semantics.py: relative error 0.68 at kernel level)."""
    target, _ = make_swa_pair(tempfile.mkdtemp(prefix="swa_batch_"))
    reqs = prompts(32, 60, seed=5)
    runs = {}
    for name, backend in (("xqa", ["--decode-attention-backend", "trtllm_mha", "--prefill-attention-backend", "fa3"]),
                          ("fa3", ["--attention-backend", "fa3"])):
        common = BASE + ["--model-path", target] + backend
        runs[f"{name}_one_at_a_time"] = (f"batch_{name}_c1", out, common, ON, reqs, 64, {"concurrency": 1})
        runs[f"{name}_16_at_once"] = (f"batch_{name}_c16", out, common, ON, reqs, 64, {"concurrency": 16})
    res = run_many(runs)
    for name in ("xqa", "fa3"):
        res[f"{name}_judged"] = judged({k: v for k, v in res.items() if k.startswith(name + "_")}, f"{name}_one_at_a_time")
    return res


def llama4_common(target: str, ps: int) -> list:
    """Server arguments of the Llama 4 scenarios at page size ``ps``: fa3, CUDA graphs up to
    batch 32, 8192 tokens with a quarter of them in the SWA pool."""
    base = list(BASE)
    base[base.index("--page-size") + 1] = str(ps)
    base[base.index("--max-total-tokens") + 1] = "8192"
    base[base.index("--swa-full-tokens-ratio") + 1] = "0.25"
    return base + ["--model-path", target, "--attention-backend", "fa3", "--cuda-graph-max-bs", "32"]


def log_facts(res: dict, out: str, fix: str = None, key: str = "fix_log", asserts=("AssertionError",)) -> dict:
    """Every run of ``res`` gets what its server log shows: an illegal memory access, its first
    assertion lines (lines naming one of ``asserts``) and, with ``fix``, the plugin's lines
    naming that fix (under ``key``)."""
    for r in res.values():
        if isinstance(r, dict) and "name" in r:
            log = os.path.join(out, r["name"] + ".log")
            lines = (open(log, errors="replace").read() if os.path.exists(log) else "").splitlines()
            r["illegal_memory_access"] = any("illegal memory access" in l for l in lines)
            r["assert_lines"] = [l[-200:] for l in lines if any(a in l for a in asserts)][:3]
            if fix:
                r[key] = [l[-200:] for l in lines if fix in l][:3]
    return res


def scenario_llama4_fa3(out, _target, _draft):
    """Issue #19: Llama 4 chunked ("local") layers on FA3, the SWA-pool layers of the hybrid
    pool. Target: make_llama4_pair (chunk 32; its chunked layers decide its output). 32
    prompts of 130 tokens (4 chunks + 2), 64 new tokens, 32 at once, greedy, CUDA graphs on
    unless a key says "eager". Per page size (1, 16): the reference is plain decode with
    --disable-hybrid-swa-memory and the plugin loaded (one KV pool: no full->SWA translation
    at all); against it:
      nospec_{off,on}      plain decode on the hybrid pool without / with the plugin. Item 1
                           (page ids pushed through the token-slot mapping in the decode
                           graph's local-attention metadata) shows at page 16 without it.
      nospec_nohybrid_off  page 16 only: the reference without the plugin; the eager half
                           (#32902: the eager local table is never turned into page ids)
                           shows here, on one pool.
      e3k1_{off,on}        EAGLE3 topk 1 (dummy draft): item 2, chunked layers in CUDA-graph
                           TARGET_VERIFY get no local-attention metadata and read the
                           full-pool page table in the SWA buffer, over the whole context.
      e3k1_nohybrid        page 1: the same on one pool (no index-space mix-up, the chunk is
                           still lost in graph verify): tells the two halves of item 2 apart.
      e3k1_eager_off       page 1: graphs off, where topk-1 verify does build local metadata.
      e3k2_{off,on}        page 1 only: EAGLE3 topk 2 (eager-built and graph verify carry no
                           local metadata for topk > 1). Page 16 with topk 2 stops on sglang's
                           own assert (topk > 1 with page size > 1 on a model with a window).
    Each judged against its page size's reference (identical requests, first-divergence
    bands), plus crash / illegal memory access, accept length, and the plugin's log lines."""
    root = tempfile.mkdtemp(prefix="swa_llama4_")
    target, draft = make_llama4_pair(root)
    reqs = prompts(32, 130, seed=19)
    nohy = ["--disable-hybrid-swa-memory"]
    runs = {}
    for ps in (1, 16):
        common = llama4_common(target, ps)
        e3k1, e3k2 = eagle3(draft, topk=1), eagle3(draft, topk=2)
        rows = {"ref": (common + nohy, ON), "nospec_off": (common, OFF), "nospec_on": (common, ON),
                "e3k1_off": (common + e3k1, OFF), "e3k1_on": (common + e3k1, ON)}
        if ps == 1:
            rows.update({"e3k1_nohybrid": (common + e3k1 + nohy, ON), "e3k1_eager_off": (eager(common + e3k1), OFF),
                         "e3k2_off": (common + e3k2, OFF), "e3k2_on": (common + e3k2, ON)})
        else:
            rows["nospec_nohybrid_off"] = (common + nohy, OFF)
        for key, (args, env) in rows.items():
            runs[f"ps{ps}_{key}"] = (f"llama4_ps{ps}_{key}", out, args, env, reqs, 64)
    res = run_many(runs)
    for ps in (1, 16):
        mine = {k[len(f"ps{ps}_"):]: v for k, v in res.items() if k.startswith(f"ps{ps}_")}
        res[f"ps{ps}_judged"] = judged(mine, "ref")
        res[f"ps{ps}_reference_distinct_outputs"] = len({tuple(o) for o in mine["ref"].get("outputs") or [] if o})
    cmp = compare(res["ps16_ref"].get("outputs") or [], res["ps1_ref"].get("outputs") or [])
    res["ps16_ref_vs_ps1_ref"] = {**cmp, "bands": first_divergences(cmp)}
    return log_facts(res, out, asserts=("AssertionError", "page size > 1"))


def scenario_llama4_eagle(out, _target, _draft):
    """Issue #19 item 2 (fa3_local_attn_verify): Llama 4 chunked layers in FA3's CUDA-graph
    EAGLE3 target verify. Target and requests as llama4_fa3 (make_llama4_pair, chunk 32, 32
    prompts of 130 tokens, 64 new, 32 at once, greedy; 4 draft tokens cross chunk boundaries).
    CUDA graphs ON unless a key says "control". Per page size (1, 16):
      ref           plain decode, --disable-hybrid-swa-memory, plugin on (llama4_fa3's reference)
      nospec_on     plain decode on the hybrid pool, plugin on (the no-spec row on this pool)
      e3k1_off/on   EAGLE3 topk 1, without / with the plugin: off is wrong from token 1-2
                    (0/32 on the last run); on must match the control
      control       EAGLE3 topk 1 with --disable-cuda-graph (eager topk-1 verify builds the
                    local metadata itself; 32/32 at page 1 on the last run): page 1 without
                    the plugin, page 16 with it (the eager page-id half is fa3_local_attn_pages)
    Page 1 also: e3k1_nohybrid_on (one pool, the chunk half alone) and e3k2_off/on (topk 2:
    fa3_local_attn_tree_verify's; llama4_tree is its scenario). Judged against ref, and
    e3k1_on directly against control and nospec_on."""
    root = tempfile.mkdtemp(prefix="swa_llama4_eagle_")
    target, draft = make_llama4_pair(root)
    reqs = prompts(32, 130, seed=19)
    nohy = ["--disable-hybrid-swa-memory"]
    runs = {}
    for ps in (1, 16):
        common = llama4_common(target, ps)
        e3k1 = eagle3(draft, topk=1)
        rows = {"ref": (common + nohy, ON), "nospec_on": (common, ON),
                "e3k1_off": (common + e3k1, OFF), "e3k1_on": (common + e3k1, ON),
                "control": (eager(common + e3k1), OFF if ps == 1 else ON)}
        if ps == 1:
            e3k2 = eagle3(draft, topk=2)
            rows.update({"e3k1_nohybrid_on": (common + e3k1 + nohy, ON),
                         "e3k2_off": (common + e3k2, OFF), "e3k2_on": (common + e3k2, ON)})
        for key, (args, env) in rows.items():
            runs[f"ps{ps}_{key}"] = (f"llama4e_ps{ps}_{key}", out, args, env, reqs, 64)
    res = run_many(runs)
    for ps in (1, 16):
        mine = {k[len(f"ps{ps}_"):]: v for k, v in res.items() if k.startswith(f"ps{ps}_")}
        res[f"ps{ps}_judged"] = judged(mine, "ref")
        for other in ("control", "nospec_on"):
            cmp = compare(mine["e3k1_on"].get("outputs") or [], mine[other].get("outputs") or [])
            res[f"ps{ps}_judged"][f"e3k1_on_vs_{other}"] = {**cmp, "bands": first_divergences(cmp)}
        res[f"ps{ps}_reference_distinct_outputs"] = len({tuple(o) for o in mine["ref"].get("outputs") or [] if o})
    return log_facts(res, out, fix="fa3_local_attn_verify", key="verify_fix_log")


def scenario_llama4_tree(out, _target, _draft):
    """Issue #19 item 2, topk > 1 (fa3_local_attn_tree_verify): Llama 4 chunked layers in FA3's
    EAGLE3 tree verify (topk 2, 3 steps, 4 draft tokens; cascade attention). Target and
    requests as llama4_fa3 (chunk 32, 32 prompts of 130 tokens, 64 new, 32 at once, greedy),
    page 1 (sglang stops topk > 1 with page size > 1 on this model). CUDA graphs ON unless a
    key says "eager"; the hybrid pool unless it says "nohybrid":
      ref              plain decode, --disable-hybrid-swa-memory, plugin on
      nospec_on        plain decode on the hybrid pool, plugin on (rounding between the pools)
      control          EAGLE3 topk 1, graphs off, without the plugin (sglang's own eager topk-1
                       verify builds the local metadata: a path upstream supports)
      e3k2_off / on    EAGLE3 topk 2 without / with the plugin (headline)
      e3k2_eager_off / on   the same with --disable-cuda-graph (secondary)
      e3k2_nohybrid_on topk 2 on one pool with the plugin (the chunk half alone)
    Judged against ref, and e3k2_on directly against control and nospec_on."""
    root = tempfile.mkdtemp(prefix="swa_llama4_tree_")
    target, draft = make_llama4_pair(root)
    reqs = prompts(32, 130, seed=19)
    nohy = ["--disable-hybrid-swa-memory"]
    common = llama4_common(target, 1)
    e3k1, e3k2 = eagle3(draft, topk=1), eagle3(draft, topk=2)
    rows = {"ref": (common + nohy, ON), "nospec_on": (common, ON), "control": (eager(common + e3k1), OFF),
            "e3k2_off": (common + e3k2, OFF), "e3k2_on": (common + e3k2, ON),
            "e3k2_eager_off": (eager(common + e3k2), OFF), "e3k2_eager_on": (eager(common + e3k2), ON),
            "e3k2_nohybrid_on": (common + e3k2 + nohy, ON)}
    res = run_many({k: (f"llama4t_{k}", out, args, env, reqs, 64) for k, (args, env) in rows.items()})
    res["judged"] = judged(res, "ref")
    for other in ("control", "nospec_on"):
        cmp = compare(res["e3k2_on"].get("outputs") or [], res[other].get("outputs") or [])
        res["judged"][f"e3k2_on_vs_{other}"] = {**cmp, "bands": first_divergences(cmp)}
    res["reference_distinct_outputs"] = len({tuple(o) for o in res["ref"].get("outputs") or [] if o})
    return log_facts(res, out, fix="fa3_local_attn_tree_verify")


def scenario_llama4_tree_wide(out, _target, _draft):
    """The rounding control of llama4_tree. The same weights with a chunk of 256 tokens, wider
    than every request (130 + 64): its chunked layers attend over the whole context, so
    sglang's own topk-2 cascade verify on one pool (--disable-hybrid-swa-memory, no index
    translation) is right up to kernel rounding (the cascade merges two bf16 partial outputs
    where plain decode makes one). Page 1, CUDA graphs ON:
      ref                plain decode, one pool, plugin on
      k2_stock_nohybrid  EAGLE3 topk 2, one pool, without the plugin: the cascade's own rounding
      k2_on_nohybrid     the same with the plugin (its two parts carry the same keys here)
      k2_on              EAGLE3 topk 2 on the hybrid pool with the plugin
    Judged against ref, and k2_on / k2_on_nohybrid against k2_stock_nohybrid."""
    root = tempfile.mkdtemp(prefix="swa_llama4_wide_")
    target, draft = make_llama4_pair(root, chunk=256)
    reqs = prompts(32, 130, seed=19)
    nohy = ["--disable-hybrid-swa-memory"]
    common, e3k2 = llama4_common(target, 1), eagle3(draft, topk=2)
    rows = {"ref": (common + nohy, ON), "k2_stock_nohybrid": (common + e3k2 + nohy, OFF),
            "k2_on_nohybrid": (common + e3k2 + nohy, ON), "k2_on": (common + e3k2, ON)}
    res = run_many({k: (f"llama4w_{k}", out, args, env, reqs, 64) for k, (args, env) in rows.items()})
    res["judged"] = judged(res, "ref")
    for key in ("k2_on", "k2_on_nohybrid"):
        cmp = compare(res[key].get("outputs") or [], res["k2_stock_nohybrid"].get("outputs") or [])
        res["judged"][f"{key}_vs_k2_stock_nohybrid"] = {**cmp, "bands": first_divergences(cmp)}
    res["reference_distinct_outputs"] = len({tuple(o) for o in res["ref"].get("outputs") or [] if o})
    return res


def prompt_seeds() -> list:
    """The prompt seeds of a run: PROMPT_SEEDS (comma list) from the environment; a scenario
    that judges against the model's own output holds at every one of them."""
    raw = os.environ.get("PROMPT_SEEDS")
    if not raw:
        raise SystemExit("set PROMPT_SEEDS (e.g. PROMPT_SEEDS=11,12,13): the prompts' seeds come from the environment")
    return [int(x) for x in raw.split(",")]


def against_reference(tag: str, out: str, reqs: list, model_fn, rows: dict) -> dict:
    """Runs ``rows`` ({key: (args, env)}) side by side while transformers' float32 output of
    ``model_fn()`` for ``reqs`` is computed on the CPU; judges every row against it per prompt
    seed (32 requests each); prints one ``tag`` line per row; writes ``<tag>_outputs.json``."""
    import readout

    ref_box = {}

    def reference():
        import torch

        torch.set_num_threads(4)
        model = model_fn()
        ref_box["outputs"], ref_box["margins"] = [], []
        for i in range(0, len(reqs), 32):
            o, m = readout.greedy(model, reqs[i:i + 32], 64)
            ref_box["outputs"] += o
            ref_box["margins"] += m

    ref_thread = threading.Thread(target=reference)
    ref_thread.start()
    only = os.environ.get("ROWS")
    if only:
        rows = {k: v for k, v in rows.items() if k in only.split(",")}
    # a row is (args, env) or (args, env, run options), e.g. {"rounds": 2}: the outputs judged are
    # the last round's, served from a radix cache that holds the first rounds' prompts
    res = run_many({k: (f"{tag}_{k}", out, row[0], row[1], reqs, 64, {"concurrency": 32, **(row[2] if len(row) > 2 else {})})
                    for k, row in rows.items()})
    ref_thread.join()
    ref = ref_box["outputs"]
    table = {k: judge(res[k], ref, 32) for k in rows}
    with open(os.path.join(out, f"{tag}_outputs.json"), "w") as f:
        json.dump({"reference": ref, **{k: res[k].get("outputs") for k in rows}}, f)
    for k, v in table.items():
        cells = (" | ".join(f"{c['identical']}/{c['of']} {c['bands']}" for c in v["per_seed"])
                 if v["state"] == "served" else f"{v['state']}: {v['error']}")
        print(f"{tag.upper()} {k}: {cells} | accept {v.get('accept_length')} | retracting steps "
              f"{res[k].get('retractions')}", flush=True)
        if res[k].get("probe"):
            v["probe"] = retraction_report(res[k], ref)
            print(f"{tag.upper()} {k} probe: {json.dumps(v['probe'])}", flush=True)
    return {"reference_min_margin": round(min(ref_box["margins"]), 3),
            "reference_distinct": len({tuple(o) for o in ref}), "table": table,
            **{k: {x: v.get(x) for x in ("state", "error", "accept_length", "startup_s", "assertions", "fix_log",
                                         "illegal_memory_access")} for k, v in res.items()}}


def retraction_report(row: dict, ref: list) -> dict:
    """For a row served with tests/gpu/retract_probe on its path: every request that differs from
    the reference (index of ``reqs``, first differing token) with the output lengths at which it
    was retracted and the prefix its recomputations matched; how many requests were retracted;
    the probe's violation lines (RETRACT_PROBE_CHECK=1)."""
    events = {}
    for line in row["probe"]:
        kind, *fields = line.split()
        f = dict(x.split("=", 1) for x in fields if "=" in x)
        if kind in ("retract", "reprefill") and f.get("rid", "").startswith("q"):
            j = int(f["rid"][1:].split("r")[0])
            events.setdefault(j, []).append(f"{kind}@{f['out']}" + (f"/p{f['prefix']}" if kind == "reprefill" else ""))
    wrong = {}
    for j, (o, r) in enumerate(zip(row["outputs"], ref)):
        if o != r:
            first = next((t for t, (a, b) in enumerate(zip(o, r)) if a != b), min(len(o), len(r)))
            wrong[j] = {"first_diff": first, "events": events.get(j, [])}
    return {"wrong": wrong, "retracted_requests": len(events),
            "violations": [l for l in row["probe"] if l.startswith(("violation", "probe_error"))][:12]}


def exact_base(target: str, total: int = 16384, piecewise: bool = False, swa_ratio: float = 0.25) -> list:
    """The selftest's server arguments (sglang's defaults, piecewise prefill graphs only where asked)
    with MEM_FRACTION from the environment."""
    return _rows.exact_base(target, total, piecewise, swa_ratio, mem_fraction=os.environ.get("MEM_FRACTION", "0.5"))


def scenario_llama4_exact(out, _target, _draft):
    """Issue #26: Llama 4 on FA3 against the model's own float32 output (transformers' Llama 4 on
    the CPU, its chunked mask). Target and draft: tests/gpu/llama4_target.py (chunked layers
    decide the output with bf16-safe margins; the chunk start decides a quarter of the choices;
    an EAGLE3 draft with real weights that the target accepts). 32 prompts of 130 tokens per
    seed (PROMPT_SEEDS), 64 new tokens, 32 at once, greedy; sglang's defaults (CUDA graphs ON,
    fa3's page size) unless a row says "eager" (graphs off) or "nohy" (one pool,
    --disable-hybrid-swa-memory). Rows: plain decode (plugin on and off, one pool graphs off);
    EAGLE3 topk 1 (3 steps, 4 draft tokens), topk 2 (3 steps, 4), topk 4 (3 steps, 8): plugin
    on (hybrid / one pool, graphs on / off) and stock (hybrid, graphs on). ATTRIBUTE (fix names)
    adds plain-decode rows with each fix alone and all fixes but it."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import llama4_target as lt

    seeds = prompt_seeds()
    target, draft = lt.save(tempfile.mkdtemp(prefix="swa_llama4_exact_"))
    reqs = [p for s in seeds for p in lt.prompts(32, 130, s)]
    base = exact_base(target) + ["--attention-backend", "fa3"]
    nohy = ["--disable-hybrid-swa-memory"]
    spec = {1: eagle3_real(draft, 1, 3, 4), 2: eagle3_real(draft, 2, 3, 4), 4: eagle3_real(draft, 4, 3, 8)}
    rows = {"plain_on": (base, ON), "plain_off": (base, OFF), "plain_nohy_eager_off": (eager(base + nohy), OFF),
            "plain_eager_off": (eager(base), OFF),  # with plain_off: is stock's plain-decode error a graph one?
            "plain_nohy_off": (base + nohy, OFF)}  # stock, graphs on, one pool
    for fix in filter(None, os.environ.get("ATTRIBUTE", "").split(",")):  # which fix makes plain decode right
        rows[f"plain_on_without_{fix}"] = (base, {**ON, "SGLANG_SWA_PLUGIN_FIXES": f"all,-{fix}"})
        rows[f"plain_on_only_{fix}"] = (base, {**ON, "SGLANG_SWA_PLUGIN_FIXES": fix})
    for k, sp in spec.items():
        rows.update({f"k{k}_on": (base + sp, ON), f"k{k}_nohy_on": (base + sp + nohy, ON),
                     f"k{k}_eager_on": (eager(base + sp), ON), f"k{k}_nohy_eager_on": (eager(base + sp + nohy), ON),
                     f"k{k}_off": (base + sp, OFF)})
    return {"seeds": seeds, **against_reference("llama4_exact", out, reqs, lt.hf_model, rows)}


def scenario_llama4_trtllm(out, _target, _draft):
    """Issue #28: Llama 4 on trtllm_mha (Hopper: its XQA decode with fa3's prefill) against the
    model's own float32 output, as scenario_llama4_exact (the chunk-32 target, PROMPT_SEEDS, 32
    prompts of 130 tokens, 64 new, 32 at once). ``trtllm_local_attn`` runs a chunked layer's
    decode-kernel rows from their chunk's first page, so it covers pages that tile the chunk:
    ``p32``/``p16`` rows (``--page-size``; one and two pages per chunk) against stock; the default
    page (64 here) does not tile the target's chunk (one warning; real Llama 4: 8192, tiled by
    any page). ``k1``: EAGLE3 topk 1 (3 steps, 4 draft tokens), the verify on fa3 (sglang's default
    ``--speculative-attention-mode prefill``) or on trtllm_mha's XQA (``dm``: mode decode)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import llama4_target as lt

    seeds = prompt_seeds()
    target, draft = lt.save(tempfile.mkdtemp(prefix="swa_llama4_trtllm_"))
    reqs = [p for s in seeds for p in lt.prompts(32, 130, s)]
    base = exact_base(target) + BACKEND_ARGS["trtllm_mha"]
    p32, p16, k1, dm = ["--page-size", "32"], ["--page-size", "16"], eagle3_real(draft, 1, 3, 4), [
        "--speculative-attention-mode", "decode"]
    rows = {"plain_on": (base, ON), "plain_p32_on": (base + p32, ON), "plain_p32_off": (base + p32, OFF),
            "plain_p16_on": (base + p16, ON), "plain_p32_eager_on": (eager(base + p32), ON),
            "k1_p32_on": (base + p32 + k1, ON), "k1_p32_off": (base + p32 + k1, OFF),
            "k1_p32_dm_on": (base + p32 + k1 + dm, ON), "k1_p32_dm_off": (base + p32 + k1 + dm, OFF),
            "k1_p32_dm_eager_on": (eager(base + p32 + k1 + dm), ON)}
    return {"seeds": seeds, **against_reference("llama4_trtllm", out, reqs, lt.hf_model, rows)}


BACKEND_ARGS = {"fa3": ["--attention-backend", "fa3"], "flashinfer": ["--attention-backend", "flashinfer"],
                "triton": ["--attention-backend", "triton"],
                "triton_nohy": ["--attention-backend", "triton", "--disable-hybrid-swa-memory"],
                # every layer in effect full (window 4096 > any request): is a triton error a window one?
                # (judged against the served rows of the same flags, not the window-16 reference)
                "triton_wide": ["--attention-backend", "triton", "--json-model-override-args", '{"sliding_window": 4096}'],
                # XQA decode on Hopper; sglang refuses trtllm_mha prefill on sm90 before 0.5.19
                "trtllm_mha": ["--decode-attention-backend", "trtllm_mha", "--prefill-attention-backend", "fa3"]}


def scenario_gptoss_exact(out, _target, _draft):
    """Issues #27/#28 (first slice): the GPT-OSS readout target (tests/gpu/gptoss_target.py: its
    sliding layer attends the oldest key of its window, so the window's exact size decides a
    quarter of the tokens) against transformers' float32 output, plain decode, per backend
    (BACKENDS, default fa3,flashinfer,triton,trtllm_mha) with and without the plugin, CUDA
    graphs ON, sglang's page size; "small": --max-total-tokens 4096 (32 requests of 194 tokens
    do not fit: retractions); "pw": piecewise CUDA-graph prefill on too (every default flag);
    control: fa3, one pool, graphs off, stock. PROMPT_SEEDS."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gptoss_target as gt

    seeds = prompt_seeds()
    target, draft = gt.save(tempfile.mkdtemp(prefix="swa_gptoss_exact_"))
    reqs = [p for s in seeds for p in gt.prompts(32, 130, s)]
    rows = {"fa3_nohy_eager_off": (eager(exact_base(target) + BACKEND_ARGS["fa3"] + ["--disable-hybrid-swa-memory"]), OFF)}
    for b in os.environ.get("BACKENDS", "fa3,flashinfer,triton,trtllm_mha").split(","):
        rows[f"{b}_on"] = (exact_base(target) + BACKEND_ARGS[b], ON)
        rows[f"{b}_off"] = (exact_base(target) + BACKEND_ARGS[b], OFF)
        rows[f"{b}_eager_off"] = (eager(exact_base(target) + BACKEND_ARGS[b]), OFF)
        rows[f"{b}_eager_on"] = (eager(exact_base(target) + BACKEND_ARGS[b]), ON)
        rows[f"{b}_small_on"] = (exact_base(target, 4096) + BACKEND_ARGS[b], ON)
        rows[f"{b}_small_off"] = (exact_base(target, 4096) + BACKEND_ARGS[b], OFF)
        rows[f"{b}_small_noradix_on"] = (exact_base(target, 4096) + BACKEND_ARGS[b] + ["--disable-radix-cache"], ON)
        # is a small-pool error the SWA pool's? one pool; an SWA pool as large as the full one
        rows[f"{b}_small_nohy_off"] = (exact_base(target, 4096) + BACKEND_ARGS[b] + ["--disable-hybrid-swa-memory"], OFF)
        rows[f"{b}_small_r1_off"] = (exact_base(target, 4096, swa_ratio=1.0) + BACKEND_ARGS[b], OFF)
        # which part of sglang the small-pool error comes with (issue #28): the retract probe
        # (tests/gpu/retract_probe) names the retracted requests, "check" also checks every
        # batch's window slots; the overlap scheduler off; SWA eviction every step; one pool of
        # half the tokens (meant to retract as often as the small SWA pool; it retracted twice)
        probe = {"PYTHONPATH": os.pathsep.join(filter(None, [RETRACT_PROBE, os.environ.get("PYTHONPATH")]))}
        small = exact_base(target, 4096) + BACKEND_ARGS[b]
        rows[f"{b}_small_probe_on"] = (small, {**ON, **probe})
        rows[f"{b}_small_probe_off"] = (small, {**OFF, **probe})
        rows[f"{b}_small_check_on"] = (small, {**ON, **probe, "RETRACT_PROBE_CHECK": "1"})
        rows[f"{b}_small_noovl_on"] = (small + ["--disable-overlap-schedule"], {**ON, **probe})
        rows[f"{b}_small_ev1_on"] = (small, {**ON, **probe, "SGLANG_SWA_EVICTION_INTERVAL": "1"})
        rows[f"{b}_small_nohy2k_off"] = (exact_base(target, 2048) + BACKEND_ARGS[b] + ["--disable-hybrid-swa-memory"],
                                         {**OFF, **probe})
        for topk in map(int, filter(None, os.environ.get("SPEC_TOPK", "").split(","))):  # EAGLE3, real draft
            sp = eagle3_real(draft, topk, 3, 4 if topk < 4 else 8)
            rows[f"{b}_k{topk}_on"] = (exact_base(target) + BACKEND_ARGS[b] + sp, ON)
            rows[f"{b}_k{topk}_off"] = (exact_base(target) + BACKEND_ARGS[b] + sp, OFF)
            rows[f"{b}_k{topk}_eager_on"] = (eager(exact_base(target) + BACKEND_ARGS[b] + sp), ON)
        for fix in filter(None, os.environ.get("WITHOUT_FIX", "").split(",")):  # the plugin less one fix
            rows[f"{b}_on_without_{fix}"] = (exact_base(target) + BACKEND_ARGS[b], {**ON, "SGLANG_SWA_PLUGIN_FIXES": f"all,-{fix}"})
        rows[f"{b}_pw_on"] = (exact_base(target, piecewise=True) + BACKEND_ARGS[b], ON)  # every default flag
        rows[f"{b}_pw_off"] = (exact_base(target, piecewise=True) + BACKEND_ARGS[b], OFF)
    if os.environ.get("TRITON_WINDOW_PROBE"):  # triton with one key more in its window buffers (test-side probe)
        probe = {"PYTHONPATH": os.pathsep.join(filter(None, [TRITON_WINDOW_PROBE, os.environ.get("PYTHONPATH")]))}
        rows["triton_window_plus1_on"] = (exact_base(target) + BACKEND_ARGS["triton"], {**ON, **probe})
        rows["triton_window_plus1_eager_on"] = (eager(exact_base(target) + BACKEND_ARGS["triton"]), {**ON, **probe})
        rows["triton_window_plus1_small_on"] = (exact_base(target, 4096) + BACKEND_ARGS["triton"], {**ON, **probe})
    return {"seeds": seeds, **against_reference("gptoss_exact", out, reqs, gt.hf_model, rows)}


def scenario_gemma4_exact(out, _target, _draft):
    """Issue #27 (conformance matrix, Gemma 4): the Gemma 4 readout target
    (tests/gpu/gemma4_target.py: Gemma4ForCausalLM, its sliding layer 0 attends the oldest key
    of its window, so the window's exact size decides a quarter of the tokens) against
    transformers' float32 output, plain decode, per backend (BACKENDS, default
    triton,fa3,flashinfer,trtllm_mha) with and without the plugin, CUDA graphs on and off,
    sglang's page size; "small": --max-total-tokens 4096 (32 requests of 194 tokens do not fit:
    retractions); "without_gemma4_window": the plugin with that one fix off; control: fa3, one
    pool, graphs off, stock and with the plugin (on 0.5.11-0.5.13 stock Gemma 4 attends one key
    more than the model on every backend: gemma4_window). No EAGLE3 rows (sglang 0.5.11's
    Gemma4ForCausalLM captures no auxiliary hidden states). PROMPT_SEEDS."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gemma4_target as gt

    seeds = prompt_seeds()
    target, _ = gt.save(tempfile.mkdtemp(prefix="swa_gemma4_exact_"))
    reqs = [p for s in seeds for p in gt.prompts(32, 130, s)]
    control = eager(exact_base(target) + BACKEND_ARGS["fa3"] + ["--disable-hybrid-swa-memory"])
    rows = {"fa3_nohy_eager_off": (control, OFF), "fa3_nohy_eager_on": (control, ON)}
    for b in os.environ.get("BACKENDS", "triton,fa3,flashinfer,trtllm_mha").split(","):
        rows[f"{b}_on"] = (exact_base(target) + BACKEND_ARGS[b], ON)
        rows[f"{b}_on_without_gemma4_window"] = (exact_base(target) + BACKEND_ARGS[b],
                                                 {**ON, "SGLANG_SWA_PLUGIN_FIXES": "all,-gemma4_window"})
        rows[f"{b}_off"] = (exact_base(target) + BACKEND_ARGS[b], OFF)
        rows[f"{b}_eager_off"] = (eager(exact_base(target) + BACKEND_ARGS[b]), OFF)
        rows[f"{b}_eager_on"] = (eager(exact_base(target) + BACKEND_ARGS[b]), ON)
        rows[f"{b}_small_on"] = (exact_base(target, 4096) + BACKEND_ARGS[b], ON)
        rows[f"{b}_pw_on"] = (exact_base(target, piecewise=True) + BACKEND_ARGS[b], ON)  # every default flag
        rows[f"{b}_pw_off"] = (exact_base(target, piecewise=True) + BACKEND_ARGS[b], OFF)
    without_fsp = {**ON, "SGLANG_SWA_PLUGIN_FIXES": "all,-flashinfer_swa_prefill"}
    rows["flashinfer_on_without_flashinfer_swa_prefill"] = (exact_base(target) + BACKEND_ARGS["flashinfer"], without_fsp)
    # flashinfer's cached-prefix prefill (#26513) and paged-only plan (#31501): "tiny" retracts
    # (2048 tokens) and the recomputations match cached prefixes (the retract probe logs them);
    # "pw": piecewise CUDA-graph prefill
    probe = {"PYTHONPATH": os.pathsep.join(filter(None, [RETRACT_PROBE, os.environ.get("PYTHONPATH")]))}
    tiny = exact_base(target, 2048) + BACKEND_ARGS["flashinfer"]
    rows["flashinfer_tiny_on"] = (tiny, {**ON, **probe})
    rows["flashinfer_tiny_on_without_flashinfer_swa_prefill"] = (tiny, {**without_fsp, **probe})
    rows["flashinfer_pw_on_without_flashinfer_swa_prefill"] = (exact_base(target, piecewise=True)
                                                               + BACKEND_ARGS["flashinfer"], without_fsp)
    # "again": the same requests three times, the last round judged: every prompt is a cached
    # prefix by then (flashinfer's cached-prefix prefill, ragged part + paged prefix, #26513)
    again = exact_base(target) + BACKEND_ARGS["flashinfer"]
    rows["flashinfer_again_on"] = (again, ON, {"rounds": 2})
    rows["flashinfer_again_on_without_flashinfer_swa_prefill"] = (again, without_fsp, {"rounds": 2})
    rows["triton_again_on"] = (exact_base(target) + BACKEND_ARGS["triton"], ON, {"rounds": 2})
    return {"seeds": seeds, **against_reference("gemma4_exact", out, reqs, gt.hf_model, rows)}


RETRACT_PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "retract_probe")
TRITON_WINDOW_PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_window_probe")


# Test-side only (put on a server's PYTHONPATH, never installed): sglang 0.5.11's
# Gemma4ForCausalLM has no get_embed_and_head (nor EAGLE3's set_eagle3_layers_to_capture), so
# no EAGLE worker starts on it. This adds the one accessor EAGLE needs, as every other EAGLE
# target defines it (the embedding and lm_head weights); nothing else is changed.
GEMMA4_EAGLE_SHIM = """
import os, sys
sys.path.insert(0, GPU_DIR)
from after_import import patch_after_import, run_next_sitecustomize  # tests/gpu/after_import.py
sys.path.pop(0)


def _add_accessor(module):
    cls = module.Gemma4ForCausalLM
    if not hasattr(cls, "get_embed_and_head"):
        cls.get_embed_and_head = lambda self: (self.model.embed_tokens.weight, self.lm_head.weight)


patch_after_import({"sglang.srt.models.gemma4_causal": _add_accessor})
run_next_sitecustomize(__file__)
""".replace("GPU_DIR", repr(os.path.dirname(os.path.abspath(__file__))))


def gemma4_config(vocab: int = 2048, window: int = 16):
    """Tiny Gemma4ForCausalLM (model_type gemma4_text): 4 layers sliding/full/sliding/full,
    window 16, hidden 256, 4 heads, 2 KV heads, head_dim 64 on both layer types (one KV pool
    layout, one flashinfer head dim), no per-layer embeddings, no KV sharing, no MoE, no
    softcapping, default RoPE on both layer types, untied lm_head, init std 0.1. The swa_* keys
    are what sglang's config loader derives for the multimodal Gemma4 config only; a text-only
    config must carry them itself (the hybrid SWA pool reads them)."""
    from transformers import Gemma4TextConfig

    rope = {"rope_type": "default", "rope_theta": 10000.0}
    cfg = Gemma4TextConfig(
        vocab_size=vocab, vocab_size_per_layer_input=vocab, hidden_size=256, intermediate_size=512,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64, global_head_dim=64,
        num_global_key_value_heads=2, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
        enable_moe_block=False, attention_k_eq_v=False, use_double_wide_mlp=False, final_logit_softcapping=None,
        sliding_window=window, max_position_embeddings=4096, tie_word_embeddings=False, initializer_range=0.1,
        layer_types=["sliding_attention", "full_attention"] * 2,
        rope_parameters={"sliding_attention": dict(rope), "full_attention": dict(rope)},
    )
    cfg.swa_head_dim = cfg.swa_v_head_dim = cfg.v_head_dim = 64
    cfg.swa_num_key_value_heads = 2
    cfg.architectures = ["Gemma4ForCausalLM"]
    cfg.torch_dtype = "bfloat16"
    return cfg


# The Gemma4 readout pair (make_gemma4_pair): constants shared with tests/gpu/gemma4_margin_check.py.
G4_CODE, G4_CONST, G4_VOTE = slice(0, 64), slice(64, 72), slice(128, 192)  # hidden coordinates
G4_REPR = 1000  # class a's output token is G4_REPR + a (64 classes)
G4_PEAK = (0.471, 0.196, 0.097, 0.001, 0.019, 0.045, 0.039, 0.0, 0.129, 0.003)  # RoPE pairs 0-9
# G4_MONO: a rising term on pair 16 for the sliding layers (scores grow with distance, so that only
# the window keeps the peak). 0: sglang 0.5.11 runs the sliding layers' prefill (and a retracted
# request's re-prefill) on flashinfer WITHOUT the window (gemma4_sglang_logits), so a target whose
# choice depends on the window has no single output there; with 0 every peak is the best key at any
# distance up to 170, window or not. 300.0 rebuilds the first fi_verify target (r1/5).
G4_P, G4_MONO, G4_MONO_PAIR = 100.0, 0.0, 16  # peak score; sliding layers' rising term (see above)
# layer -> (key offset the layer attends to, vote weight); the embedding's own vote: G4_EMB_VOTE
G4_LAYERS = {0: (15, 0.82), 1: (23, 0.38), 2: (1, 0.62), 3: (40, 0.0)}
G4_EMB_VOTE, G4_CLASS_SCALES = 0.34, (0.675, 1.0)
G4_DRAFT_HEADS = (0, 1)  # target layers the draft's two KV groups copy (without a window)


def _gemma4_qk(offset: int, mono: float):
    """Query and key (64 dims, RoPE neox pairs (j, j + 32)) whose score q.R(delta)k peaks at
    delta = ``offset``: sum_j P a_j cos((delta - offset) w_j), w_j = 10000^(-j/32), at most 0.71 P
    off the peak for |delta - offset| <= 170; plus ``-mono cos(delta w_16)`` (rises with delta)."""
    import math

    import torch

    q, k = torch.zeros(64, dtype=torch.float64), torch.zeros(64, dtype=torch.float64)
    for j, a in enumerate(G4_PEAK):
        w, r = 10000.0 ** (-j / 32), math.sqrt(G4_P * a)
        k[j] = r
        q[j], q[j + 32] = r * math.cos(-offset * w), r * math.sin(-offset * w)
    if mono:
        k[G4_MONO_PAIR], q[G4_MONO_PAIR] = math.sqrt(mono), -math.sqrt(mono)
    return q, k


def gemma4_readout_weights(seed: int = 17, mono: float = None) -> tuple:
    """The weights of make_gemma4_pair: (target state dict, draft weights, token classes,
    class scales), float32 (bf16 when saved). A readout target whose next token is decided by
    exact votes (see make_gemma4_pair); everything here is constant, so the result does not
    depend on torch's random state."""
    import torch

    H, V, HD, FF = 256, 2048, 64, 512
    g = torch.Generator().manual_seed(seed)
    had = torch.ones(1, 1)
    while had.shape[0] < 64:  # Sylvester Hadamard 64 x 64: the class codes, orthogonal
        had = torch.cat([torch.cat([had, had], 1), torch.cat([had, -had], 1)], 0)
    cls = torch.randint(0, 64, (V,), generator=g)
    cls[G4_REPR:G4_REPR + 64] = torch.arange(64)
    scale = torch.tensor(G4_CLASS_SCALES)[torch.randint(0, 2, (64,), generator=g)]
    emb = torch.zeros(V, H)
    emb[:, G4_CODE], emb[:, G4_CONST] = had[cls], 1.0
    head = torch.zeros(V, H)
    head[:, G4_CONST] = -1.0  # every token but the 64 class outputs scores below zero
    rep = torch.arange(G4_REPR, G4_REPR + 64)
    head[rep] = 0.0
    head[rep, G4_CODE] = (G4_EMB_VOTE / 16) * scale[:, None] * had  # the embedding enters x sqrt(256)
    head[rep, G4_VOTE] = scale[:, None] * had
    sd = {"model.embed_tokens.weight": emb, "lm_head.weight": head, "model.norm.weight": torch.ones(H)}
    c = G4_CONST.start  # q and k read one constant coordinate; q_norm / k_norm restore their length
    for i, (offset, vote) in G4_LAYERS.items():
        p = f"model.layers.{i}."
        sliding = i % 2 == 0
        q, k = _gemma4_qk(offset, (G4_MONO if mono is None else mono) if sliding else 0.0)
        wq, wk, wv, wo = torch.zeros(4 * HD, H), torch.zeros(2 * HD, H), torch.zeros(2 * HD, H), torch.zeros(H, 4 * HD)
        for h in range(4):
            wq[h * HD:(h + 1) * HD, c] = q
        for h in range(2):
            wk[h * HD:(h + 1) * HD, c] = k
            wv[h * HD:(h + 1) * HD, G4_CODE] = torch.eye(HD)  # v = the token's class code (v_norm: exactly +-1)
        wo[G4_VOTE, 0:HD] = torch.eye(HD)  # head 0's output into the vote coordinates
        post = torch.zeros(H)
        post[G4_VOTE] = vote / 2  # post_attention_layernorm: the +-1 code over 64 of 256 dims has rms 1/2
        sd.update({p + "self_attn.q_proj.weight": wq, p + "self_attn.k_proj.weight": wk,
                   p + "self_attn.v_proj.weight": wv, p + "self_attn.o_proj.weight": wo,
                   p + "self_attn.q_norm.weight": torch.full((HD,), float(q.pow(2).mean().sqrt())),
                   p + "self_attn.k_norm.weight": torch.full((HD,), float(k.pow(2).mean().sqrt())),
                   p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": post,
                   p + "pre_feedforward_layernorm.weight": torch.ones(H),
                   p + "post_feedforward_layernorm.weight": torch.ones(H),
                   p + "mlp.gate_proj.weight": torch.randn(FF, H, generator=g) * 0.1,
                   p + "mlp.up_proj.weight": torch.randn(FF, H, generator=g) * 0.1,
                   p + "mlp.down_proj.weight": torch.zeros(H, FF), p + "layer_scalar": torch.ones(1)})
    # Draft (LlamaForCausalLMEagle, one layer, no window, Llama's 1/sqrt(64) score scale, no
    # norm before or after its layer): input fc = [I | 0] (the token embedding; the target's
    # hidden state is not read); KV group 0 (heads 0, 1) attends like target layer
    # G4_DRAFT_HEADS[0] without its rising term, group 1 like G4_DRAFT_HEADS[1]; heads 0 and 2
    # write their codes with the target's vote weights / 16 (its embedding is not scaled).
    dq, dk, dv, do = torch.zeros(4 * HD, H), torch.zeros(2 * HD, H), torch.zeros(2 * HD, H), torch.zeros(H, 4 * HD)
    for grp, layer in enumerate(G4_DRAFT_HEADS):
        offset, vote = G4_LAYERS[layer]
        q, k = _gemma4_qk(offset, 0.0)
        for h in (2 * grp, 2 * grp + 1):
            dq[h * HD:(h + 1) * HD, c] = q * HD ** 0.5
        dk[grp * HD:(grp + 1) * HD, c] = k
        dv[grp * HD:(grp + 1) * HD, G4_CODE] = torch.eye(HD)
        do[G4_VOTE, 2 * grp * HD:(2 * grp + 1) * HD] = torch.eye(HD) * (vote / 16)
    draft = {"embed_tokens.weight": emb, "lm_head.weight": head,
             "fc.weight": torch.cat([torch.eye(H), torch.zeros(H, H)], dim=1), "fc.bias": torch.zeros(H),
             "layers.0.self_attn.q_proj.weight": dq, "layers.0.self_attn.k_proj.weight": dk,
             "layers.0.self_attn.v_proj.weight": dv, "layers.0.self_attn.o_proj.weight": do,
             "layers.0.post_attention_layernorm.weight": torch.ones(H),
             "layers.0.mlp.gate_proj.weight": torch.randn(FF, H, generator=g) * 0.1,
             "layers.0.mlp.up_proj.weight": torch.randn(FF, H, generator=g) * 0.1,
             "layers.0.mlp.down_proj.weight": torch.zeros(H, FF)}
    return sd, draft, cls, scale


def gemma4_draft_config(cfg):
    from transformers import LlamaConfig

    d = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                    rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    d.architectures = ["LlamaForCausalLMEagle"]
    d.torch_dtype = "bfloat16"
    return d


def make_gemma4_pair(root: str) -> tuple:
    """(target dir, EAGLE draft dir, shim dir) for fi_verify: a tiny Gemma4ForCausalLM
    (gemma4_config: sliding/full/sliding/full, window 16) whose next token is decided by exact
    votes with stable margins, its sliding layers deciding most of them, and a
    LlamaForCausalLMEagle draft built to predict it (real weights, checkpoint saved), plus
    the directory holding GEMMA4_EAGLE_SHIM as sitecustomize.py.

    Target (every norm is Gemma4's plain ``x / rms * w`` in transformers and in sglang 0.5.11;
    the embedding is scaled by sqrt(256) = 16; no softcapping; layer_scalar 1): each token
    belongs to one of 64 classes; its embedding is the class's Hadamard code (+-1) on
    coordinates 0-63 and 1 on 64-71 (constant). q and k read only the constant coordinate, so
    after q_norm / k_norm they are fixed vectors whatever the residual holds, and RoPE makes
    each layer attend to one relative offset (G4_LAYERS: sliding layer 0 the window's oldest
    key, delta 15; sliding layer 2 the previous token, delta 1; full layer 1 delta 23; full
    layer 3 adds nothing); the score peaks 29+ above any other key's up to 170 back, so
    attention is one-hot on that key whether or not the window is applied (sglang 0.5.11's
    flashinfer prefill applies none, its decode does: G4_MONO, gemma4_sglang_logits); the
    sliding layers' keys come from the SWA pool on a hybrid server. v reads the
    code (v_norm: exactly +-1); o_proj puts head 0's output on coordinates 128-191 and
    post_attention_layernorm scales it to the layer's vote weight; every MLP's down projection
    is zero. Class a's output token is 1000 + a, whose lm_head row is the class code on the
    code and vote coordinates times the class scale (0.675 or 1): the logit of class a is
    scale_a x (sum of the vote weights of the embedding and the layers that read a token of
    class a), exactly (codes are orthogonal), other classes score 0 and every other token
    below 0. Vote weights and scales leave every two possible sums >= 9 % apart. The same
    holds under sglang's math (gemma4_sglang_logits) and transformers' (gemma4_cpu_greedy).
    Draft: EAGLE's draft reads (token embedding, target hidden state) at the position before
    the target's, attends over its own KV (the same tokens), so it copies the same offsets:
    it carries the embedding vote and target layers 0 and 1's (no window needed at a fixed
    offset) but not layer 2's. Figures: tests/gpu/gemma4_margin_check.py."""
    import torch
    from safetensors.torch import save_file
    from transformers import Gemma4ForCausalLM

    cfg = gemma4_config()
    sd, draft_w, _, _ = gemma4_readout_weights()
    model = Gemma4ForCausalLM(cfg)
    missing = set(model.state_dict()) - set(sd)
    assert not missing, f"unset Gemma4 weights: {sorted(missing)}"
    model.load_state_dict(sd, strict=True)
    target = os.path.join(root, "gemma4_target")
    model.to(torch.bfloat16).save_pretrained(target, safe_serialization=True)
    draft = os.path.join(root, "gemma4_draft")
    gemma4_draft_config(cfg).save_pretrained(draft)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in draft_w.items()}, os.path.join(draft, "model.safetensors"))
    shim = os.path.join(root, "gemma4_shim")
    os.makedirs(shim, exist_ok=True)
    with open(os.path.join(shim, "sitecustomize.py"), "w") as f:
        f.write(GEMMA4_EAGLE_SHIM)
    return target, draft, shim


def gemma4_cpu_greedy(target, reqs: list, max_new: int) -> list:
    """Greedy continuations of ``target`` (a checkpoint directory: transformers in float32 on
    the CPU, what tests/gpu/gemma4_margin_check.py measures; or a loaded model), with its KV
    cache: the server's no-spec output should equal them."""
    import torch
    from transformers import Gemma4ForCausalLM

    torch.set_num_threads(min(4, torch.get_num_threads()))  # beside the servers' start-up
    model = target if not isinstance(target, str) else Gemma4ForCausalLM.from_pretrained(
        target, dtype=torch.float32, attn_implementation="eager").eval()
    ids, past, outs = torch.tensor(reqs), None, []
    with torch.no_grad():
        for _ in range(max_new):
            o = model(input_ids=ids, past_key_values=past, use_cache=True)
            past, ids = o.past_key_values, o.logits[:, -1].argmax(-1, keepdim=True)
            outs.append(ids)
    return torch.cat(outs, 1).tolist()


def gemma4_sglang_logits(w: dict, seqs, prefill: int, dtype=None, window: int = None, cache: list = None):
    """Logits of sglang 0.5.11's Gemma4ForCausalLM (models/gemma4_causal.py) with
    --attention-backend flashinfer, written out in plain torch module by module, on the
    weights ``w`` of make_gemma4_pair's checkpoint (HF names). Embedding x sqrt(hidden);
    RMSNorm ``x / rms * w`` in float32 (input, post-attention, pre/post-feedforward, final;
    q_norm/k_norm: Gemma4RMSNorm scale_shift 0, v_norm without weight); neox RoPE per layer
    type (rope_parameters); attention scale 1; no softcapping (final_logit_softcapping None);
    gelu-tanh MLP; x layer_scalar; untied lm_head. Float32 out.
    ``seqs`` ([B, m]) are the tokens at positions len(cache)..: positions < ``prefill`` are one
    extend from an empty prefix, later ones decode steps. Sliding layers as flashinfer runs
    them there (layers/attention/flashinfer_backend.py): an extend's query sees EVERY earlier
    key: an extend without prefix runs the ragged wrapper, which is given no window at all
    (forward_extend, extend_no_prefix); the paged wrapper (a cached prefix, or
    SGLANG_FLASHINFER_USE_PAGED) is planned without window_left, so flashinfer builds it
    without the sliding-window mask and the window_left handed to ``forward`` is not applied
    (upstream #31501 passes it at plan time). A decode query sees the last ``sliding_window``
    keys (the decode KV list is clamped to sliding_window_size + 1 = 16).
    ``window`` applies that window to every query instead, as transformers does. ``cache``: a
    list that keeps each layer's keys and values (the KV cache) across calls."""
    import math

    import torch

    dt = dtype or torch.float32
    cfg = gemma4_config()
    H, NH, NKV, HD, eps = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    w = {k: v.to(dt) for k, v in w.items()}
    cache = [] if cache is None else cache
    B, m = seqs.shape
    start = cache[0][0].shape[1] if cache else 0
    pos, keys = torch.arange(start, start + m), torch.arange(start + m)

    def rms(x, weight=None):  # sglang RMSNorm / Gemma4RMSNorm (scale_shift 0): float32, x / rms * w
        xf = x.float()
        xf = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)
        return (xf if weight is None else xf * weight.float()).to(dt)

    def rope(x, theta):  # neox: pairs (j, j + HD/2)
        inv = 1.0 / (theta ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
        ang = pos.float()[:, None] * inv[None]
        cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]
        x1, x2 = x[..., :HD // 2].float(), x[..., HD // 2:].float()
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(dt)

    causal = keys[None, :] <= pos[:, None]
    lo = pos - (window or cfg.sliding_window) + 1
    if window is None:
        lo = torch.where(pos < prefill, torch.zeros_like(pos), lo)
    windowed = causal & (keys[None, :] >= lo[:, None])
    x = w["model.embed_tokens.weight"][seqs] * math.sqrt(H)
    for i, kind in enumerate(cfg.layer_types):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, m, NH, HD)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, m, NKV, HD)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, m, NKV, HD)
        q, k, v = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"]), rms(v)
        theta = cfg.rope_parameters[kind]["rope_theta"]
        q, k = rope(q, theta), rope(k, theta)
        if len(cache) <= i:
            cache.append((k[:, :0], v[:, :0]))
        k, v = torch.cat([cache[i][0], k], 1), torch.cat([cache[i][1], v], 1)
        cache[i] = (k, v)
        k, v = k.repeat_interleave(NH // NKV, 2), v.repeat_interleave(NH // NKV, 2)
        s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float())  # scaling 1.0
        s = s.masked_fill(~(windowed if kind == "sliding_attention" else causal), float("-inf"))
        o = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v.float()).to(dt).reshape(B, m, NH * HD)
        o = o @ w[p + "self_attn.o_proj.weight"].T
        x = (x.float() + rms(o, w[p + "post_attention_layernorm.weight"]).float()).to(dt)
        h = rms(x, w[p + "pre_feedforward_layernorm.weight"])
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        f = (torch.nn.functional.gelu(g.float(), approximate="tanh") * u.float()).to(dt) @ w[p + "mlp.down_proj.weight"].T
        x = ((x.float() + rms(f, w[p + "post_feedforward_layernorm.weight"]).float()) * w[p + "layer_scalar"].float()).to(dt)
    return (rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T).float()


def gemma4_sglang_greedy(target, reqs: list, max_new: int, dtype=None, window: int = None) -> list:
    """Greedy continuations under gemma4_sglang_logits (``target``: a checkpoint directory or
    a weight dict): the prompt one extend, every new token a decode step, as on a server
    that neither retracts nor chunks the request (a retracted request's re-prefill is an
    extend again; make_gemma4_pair's target gives the same tokens either way)."""
    import torch

    if isinstance(target, str):
        from safetensors.torch import load_file

        target = load_file(os.path.join(target, "model.safetensors"))
    target = {k: v.to(dtype or torch.float32) for k, v in target.items()}
    torch.set_num_threads(min(4, torch.get_num_threads()))  # beside the servers' start-up
    ids, cache, outs = torch.tensor(reqs), [], []
    with torch.no_grad():
        for _ in range(max_new):
            ids = gemma4_sglang_logits(target, ids, len(reqs[0]), dtype, window, cache)[:, -1].argmax(-1, keepdim=True)
            outs.append(ids)
    return torch.cat(outs, 1).tolist()


def scenario_fi_verify(out, _target, _draft):
    """flashinfer_swa_verify on a real server, CUDA graphs on: the tiny hybrid-SWA Gemma4 of
    make_gemma4_pair (GPT-OSS is refused with flashinfer; its sliding layers decide most
    next-token choices with margins bf16 cannot flip; its real-weight EAGLE draft is accepted
    often) on --attention-backend flashinfer, EAGLE (plain: 0.5.11's Gemma4 is no EAGLE3
    target, and needs the test-side accessor GEMMA4_EAGLE_SHIM even for EAGLE, on every
    server's PYTHONPATH, spec or not), 32 prompts of 100 tokens (window 16), 48 new tokens,
    greedy, 32 at once. Judged against ``ref`` (no spec, hybrid pool, plugin on). Rows:
    nospec_nohy: no spec on one pool (--disable-hybrid-swa-memory), the control (rounding
    between two supported paths); k1/k2 = topk 1 (3 steps, 4 draft tokens) / topk 2 (3 steps,
    4 draft tokens), _on/_off = plugin loaded or not (without it 0.5.10-0.5.13 fail at start-up
    with a TypeError: ``prefix_lens`` None); k1_nohy_on: --disable-hybrid-swa-memory with the
    plugin, the accept-length reference; k1_on_eager: graphs off (secondary row). Also the
    float32 CPU greedy output of sglang's math (``cpu_float32``: gemma4_sglang_logits, windowless
    prefill, windowed decode) and of transformers (``cpu_transformers``, window everywhere;
    equal to cpu_float32 for this target) against ``ref``.
    Proof: nospec_nohy and cpu_float32 equal ref (32/32: the margins hold); k1_on, k2_on and
    k1_on_eager equal ref 32/32; k1_on's accept length equals k1_nohy_on's (same draft, same
    proposals: equal to the last digit when the outputs are equal) and is well above 1 (CPU:
    about 2.4: tests/gpu/gemma4_margin_check.py)."""
    target, draft, shim = make_gemma4_pair(tempfile.mkdtemp(prefix="swa_fi_"))
    reqs = prompts(32, 100, seed=7)
    common = BASE + ["--model-path", target, "--attention-backend", "flashinfer"]
    spec = lambda topk: ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", draft,
                         "--speculative-eagle-topk", str(topk), "--speculative-num-steps", "3",
                         "--speculative-num-draft-tokens", "4"]
    pp = os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")]))
    on, off = {**ON, "PYTHONPATH": pp}, {**OFF, "PYTHONPATH": pp}
    nohy = ["--disable-hybrid-swa-memory"]
    rows = {
        "ref": (common, on), "nospec_nohy": (common + nohy, on),
        "k1_off": (common + spec(1), off), "k1_on": (common + spec(1), on),
        "k2_off": (common + spec(2), off), "k2_on": (common + spec(2), on),
        "k1_nohy_on": (common + spec(1) + nohy, on), "k1_on_eager": (eager(common + spec(1)), on),
        "k2_nohy_on": (common + spec(2) + nohy, on), "k2_on_b": (common + spec(2), on),
        "k2_on_eager": (eager(common + spec(2)), on), "k2_on_c": (common + spec(2), on),
        # the plugin without swa_graph_padding (padded CUDA-graph replays keep stale SWA write locations)
        **{f"k2_pad_off{s}": (common + spec(2), {**on, "SGLANG_SWA_PLUGIN_FIXES": "-swa_graph_padding"})
           for s in ("", "_b", "_c")},
    }
    # FI_ROWS: a comma list of the rows to run (default: the first eight; k2_nohy_on, k2_on_b
    # (a second topk-2 server) and k2_on_eager are the topk-2 controls)
    keep = os.environ.get("FI_ROWS", "ref,nospec_nohy,k1_off,k1_on,k2_off,k2_on,k1_nohy_on,k1_on_eager").split(",")
    runs = {k: (f"fi_{k}", out, args, env, reqs, 48) for k, (args, env) in rows.items() if k in keep}
    with ThreadPoolExecutor(2) as ex:  # beside the servers, on the CPU
        cpu = {"cpu_float32": ex.submit(gemma4_sglang_greedy, target, reqs, 48),
               "cpu_transformers": ex.submit(gemma4_cpu_greedy, target, reqs, 48)}
        res = run_many(runs)
        cpu_out = {}
        for name, fut in cpu.items():
            try:
                cpu_out[name] = {"name": name, "outputs": fut.result()}
            except Exception as err:  # noqa: BLE001 - the server rows stand without it
                cpu_out[name] = {"name": name, "error": f"{type(err).__name__}: {err}"}
    for k, r in res.items():
        log = os.path.join(out, f"fi_{k}.log")
        lines = open(log, errors="replace").read().splitlines() if os.path.exists(log) else []
        r["type_errors"] = [l[-240:] for l in lines if "TypeError" in l][:3]
        # a retracted request is prefilled again: its sliding layers then run without window
        retract = [l.split("#new_token_ratio")[0] for l in lines if "Retract requests" in l]
        r["retracted_requests"] = sum(int(re.search(r"#retracted_reqs: (\d+)", l).group(1)) for l in retract
                                      if re.search(r"#retracted_reqs: (\d+)", l))
        r["retractions"] = [l[-60:] for l in retract][:12]
        r["plugin_log"] = [l[-160:] for l in r.get("plugin_log", []) if "flashinfer" in l or "swa_verify" in l][:4]
    res.update(cpu_out)
    res["reference_distinct_outputs"] = len({tuple(o) for o in res["ref"].get("outputs") or [] if o})
    res["accept_length"] = {k: r.get("accept_length") for k, r in res.items() if isinstance(r, dict) and "name" in r}
    judge = judged({k: v for k, v in res.items() if isinstance(v, dict) and "name" in v}, "ref")
    cmp = compare(res["k1_on"].get("outputs") or [], res["k1_nohy_on"].get("outputs") or [])
    judge["k1_on_vs_k1_nohy_on"] = {**cmp, "bands": first_divergences(cmp)}
    res["identical_of_32"] = {k[:-len("_vs_ref")]: v["identical_requests"] for k, v in judge.items() if k.endswith("_vs_ref")}
    return {**res, **judge}


MIMO_WINDOW = 16  # sliding_window_size of the tiny MiMo-V2 (its MTP layer is a window layer too)
MIMO_CONFIG_PY = """from transformers import PretrainedConfig


class MiMoV2FlashConfig(PretrainedConfig):
    model_type = "mimo_v2_flash"
"""


def mimo_v2_config(vocab: int = 2048, window: int = MIMO_WINDOW) -> dict:
    """Tiny ``MiMoV2FlashForCausalLM`` (sglang 0.5.11 models/mimo_v2.py, text-only arch): 4 dense
    layers (``moe_layer_freq`` all 0), ``hybrid_layer_pattern`` 1/0/1/0 (1: sliding window
    ``window``, SWA pool), hidden 256, 4 heads, 2 KV heads, head_dim 64 on both layer kinds,
    no attention sinks, one MTP layer (``num_nextn_predict_layers``; the draft arch becomes
    ``MiMoV2MTP``, whose one layer is a sliding-window layer, layer 0 of its own SWA pool). The
    config class comes with the checkpoint (``auto_map``, --trust-remote-code), as MiMo-V2-Flash's."""
    return dict(
        architectures=["MiMoV2FlashForCausalLM"], model_type="mimo_v2_flash",
        auto_map={"AutoConfig": "configuration_mimo_v2_flash.MiMoV2FlashConfig"},
        vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        hybrid_layer_pattern=[1, 0, 1, 0], sliding_window_size=window,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, v_head_dim=64,
        swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=64, swa_v_head_dim=64,
        attention_bias=False, add_swa_attention_sink_bias=False, add_full_attention_sink_bias=False,
        rope_theta=10000.0, swa_rope_theta=10000.0, rope_scaling=None, partial_rotary_factor=1.0,
        layernorm_epsilon=1e-5, hidden_act="silu", max_position_embeddings=4096,
        moe_layer_freq=[0, 0, 0, 0], n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=256,
        n_group=1, topk_group=1, norm_topk_prob=True, topk_method="greedy", num_nextn_predict_layers=1,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="bfloat16",
    )


def make_mimo_v2_target(root: str, seed: int = 18) -> str:
    """The tiny MiMo-V2 target as a real checkpoint: random weights (std 0.1; embeddings +-1,
    norms 1), every layer's attention o_proj scaled 0.1 (sliding) / 0.03 (full) and MLP down
    projection 0.1, so the sliding layers weigh in its next-token choices. No MTP weights:
    the draft is served with --speculative-draft-load-format dummy (the target's verify
    decides the greedy output; the draft only has to run)."""
    import torch
    from safetensors.torch import save_file

    cfg = mimo_v2_config()
    H, V, FF, NH, NKV, HD = 256, cfg["vocab_size"], 512, 4, 2, 64
    target = os.path.join(root, "mimo_v2_target")
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(target, "configuration_mimo_v2_flash.py"), "w") as f:
        f.write(MIMO_CONFIG_PY)
    with open(os.path.join(target, "generation_config.json"), "w") as f:
        json.dump({}, f)
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape, scale=0.1: (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)
    ones = lambda n: torch.ones(n, dtype=torch.bfloat16)
    w = {"model.embed_tokens.weight": (torch.randint(0, 2, (V, H), generator=g) * 2 - 1).to(torch.bfloat16),
         "model.norm.weight": ones(H), "lm_head.weight": rnd(V, H)}
    for i, swa in enumerate(cfg["hybrid_layer_pattern"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = rnd(NH * HD, H)
        w[p + "self_attn.k_proj.weight"] = rnd(NKV * HD, H)
        w[p + "self_attn.v_proj.weight"] = rnd(NKV * HD, H)
        w[p + "self_attn.o_proj.weight"] = rnd(H, NH * HD, scale=0.1 * (0.1 if swa else 0.03))
        w[p + "mlp.gate_proj.weight"] = rnd(FF, H)
        w[p + "mlp.up_proj.weight"] = rnd(FF, H)
        w[p + "mlp.down_proj.weight"] = rnd(H, FF, scale=0.01)
        w[p + "input_layernorm.weight"] = ones(H)
        w[p + "post_attention_layernorm.weight"] = ones(H)
    save_file(w, os.path.join(target, "model.safetensors"))
    return target


def scenario_triton_mtp(out, _target, _draft):
    """Issue #18 (triton_swa_draft): a tiny MiMo-V2 target (make_mimo_v2_target) with its MTP
    draft (``MiMoV2MTP``: one sliding-window layer, dummy weights) on --attention-backend
    triton, CUDA graphs on, a small SWA pool (BASE: --swa-full-tokens-ratio 0.1 of 4096),
    32 prompts of 100 tokens (window 16), 48 new tokens, greedy, 32 at once. Rows (judged
    against ``ref``: no speculative decoding, plugin on):
      mle_{off,on}   --speculative-algorithm EAGLE: sglang turns on multi-layer EAGLE for MiMo-V2
                     (MultiLayerEagleWorkerV2, 3 MTP steps, topk 1): the draft runs DRAFT_EXTEND_V2
                     per step through the multi-layer draft-extend CUDA graphs.
      n1_{off,on}    --speculative-algorithm NEXTN, 1 step (NEXTN becomes EAGLE only after sglang's
                     MiMo-V2 adjustment: EAGLEWorkerV2, DRAFT_EXTEND_V2 through the draft-extend
                     CUDA graph; no multi-step draft decode).
      n3_{off,on}    NEXTN, 3 steps: also the multi-step draft decode (TritonMultiStepDraftBackend,
                     two decode steps, eager-built rails captured in the draft CUDA graphs).
      mle_on_eager   mle_on with --disable-cuda-graph (eager DRAFT_EXTEND_V2 runs as EXTEND, which
                     builds its window in every release).
      mle_off_eager  the same without the plugin: sglang alone on its eager path (the plugin's
                     draft-extend hooks do nothing there on 0.5.11), to tell whether an illegal
                     memory access there is sglang's own.
    Controls (paths upstream runs without the plugin's Triton fix):
      ref_fa3        no spec on --attention-backend fa3: the rounding between the two backends.
      mle_fa3_nohy_off / n3_fa3_nohy_off  the spec runs on fa3 with --disable-hybrid-swa-memory,
                     plugin off (one pool, no index translation: correct by construction); the
                     spec rows are judged against them too (``*_vs_mle_fa3``/``*_vs_n3_fa3``).
      mle_on_nohy    mle_on with --disable-hybrid-swa-memory: the plugin's windows without any
                     full->SWA translation (tells a translation error from a window error).
    Without the plugin (0.5.10-0.5.22) the draft-extend graph capture hands the sliding layer
    ``kv_indices=None``: a Triton compile error, the server does not start (``error``). With
    it every request completes and the greedy outputs equal ``ref``'s."""
    target = make_mimo_v2_target(tempfile.mkdtemp(prefix="swa_mimo_"))
    reqs = prompts(32, 100, seed=18)
    common = BASE + ["--model-path", target, "--trust-remote-code", "--attention-backend", "triton",
                     "--cuda-graph-max-bs", "32"]
    spec = lambda algo, steps, tokens: ["--speculative-algorithm", algo, "--speculative-draft-model-path", target,
                                        "--speculative-draft-load-format", "dummy", "--speculative-eagle-topk", "1",
                                        "--speculative-num-steps", str(steps),
                                        "--speculative-num-draft-tokens", str(tokens)]
    mle, n1, n3 = spec("EAGLE", 3, 4), spec("NEXTN", 1, 2), spec("NEXTN", 3, 4)
    nohy = ["--disable-hybrid-swa-memory"]
    fa3 = [a if a != "triton" else "fa3" for a in common]
    blocking = {"CUDA_LAUNCH_BLOCKING": "1"}  # eager rows: an illegal access names its own kernel
    rows = {"ref": (common, ON), "mle_off": (common + mle, OFF), "mle_on": (common + mle, ON),
            "n1_on": (common + n1, ON), "n3_off": (common + n3, OFF),
            "n3_on": (common + n3, ON), "mle_on_eager": (eager(common + mle), {**ON, **blocking}),
            "mle_off_eager": (eager(common + mle), {**OFF, **blocking}), "ref_fa3": (fa3, ON),
            "mle_fa3_nohy_off": (fa3 + mle + nohy, OFF), "n3_fa3_nohy_off": (fa3 + n3 + nohy, OFF),
            "mle_on_nohy": (common + mle + nohy, ON)}
    res = run_many({k: (f"mtp_{k}", out, args, env, reqs, 48) for k, (args, env) in rows.items()})
    for k, r in res.items():
        log = os.path.join(out, f"mtp_{k}.log")
        lines = open(log, errors="replace").read().splitlines() if os.path.exists(log) else []
        r["compile_errors"] = [l[-240:] for l in lines if "CompilationError" in l or "kv_indices" in l][:3]
        r["illegal_memory_access"] = any("illegal memory access" in l for l in lines)
        r["multi_layer_eagle"] = any("multi-layer EAGLE" in l for l in lines)
        r["plugin_log"] = [l[-160:] for l in r.get("plugin_log", []) if "triton_swa_draft" in l][:3]
        r["index_asserts"] = [l[-200:] for l in lines if "index out of bounds" in l][:2]
        tb = max((i for i, l in enumerate(lines) if "Traceback" in l), default=None)
        r["last_traceback"] = [l.strip()[-200:] for l in lines[tb:tb + 40] if 'File "' in l or "Error" in l][-14:] \
            if tb is not None else []
    res["reference_distinct_outputs"] = len({tuple(o) for o in res["ref"].get("outputs") or [] if o})
    res["accept_length"] = {k: r.get("accept_length") for k, r in res.items() if isinstance(r, dict) and "name" in r}
    runs = {k: v for k, v in res.items() if isinstance(v, dict) and "name" in v}
    controls = {}
    for ctl, keys in (("mle_fa3_nohy_off", ("mle_on", "mle_on_eager", "mle_off_eager", "mle_on_nohy", "n1_on")),
                      ("n3_fa3_nohy_off", ("n3_on",)), ("ref_fa3", ("mle_fa3_nohy_off", "n3_fa3_nohy_off")),
                      ("mle_on_nohy", ("mle_on",))):
        short = ctl.replace("_nohy_off", "")  # spec on fa3 vs no spec on fa3: rounding of spec alone
        for k in keys:
            cmp = compare(runs[k].get("outputs") or [], runs[ctl].get("outputs") or [])
            controls[f"{k}_vs_{short}"] = {**cmp, "bands": first_divergences(cmp)}
    return {**res, **judged(runs, "ref"), **controls}


PROBE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "item5_probe")


def scenario_one_pool_mle(out, _target, _draft):
    """Issue #28 item 4 (one_pool_draft_extend, triton_one_pool_window): the tiny MiMo-V2 target
    of triton_mtp with multi-layer EAGLE (3 MTP steps, topk 1, dummy draft weights) with one
    KV pool (--disable-hybrid-swa-memory), CUDA graphs on, per backend of ONE_POOL_BACKENDS
    (default fa3,triton). Stock fa3 stops in the draft-extend graph capture on 0.5.10-0.5.12
    (AttributeError: the pool has no SWA translation); stock triton builds no window buffers
    with one pool for a model without its own window method (MiMo-V2, Step3.5) and stops at
    the first graph capture (Triton CompilationError). Rows per backend (fa3's keys have no
    prefix): ``ref`` (no speculation, plugin on), ``ref_off`` (no speculation, stock),
    ``mle_on``, ``mle_off``. Each row's state; the speculative rows' requests identical to the
    same backend's ``ref`` (a right draft path changes no token); triton's ``ref`` against
    fa3's (the two backends' one-pool decode of the same model). ONE_POOL_EXTRA: more server
    arguments for every row (e.g. ``--disable-cuda-graph``); ONE_POOL_POOLS=one,hybrid: the same
    rows on sglang's SWA pools too (keys ``<backend>_hybrid_...``)."""
    target = make_mimo_v2_target(tempfile.mkdtemp(prefix="swa_mimo_"))
    reqs = [p for seed in prompt_seeds() for p in prompts(32, 100, seed=seed)]
    mle = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", target,
           "--speculative-draft-load-format", "dummy", "--speculative-eagle-topk", "1",
           "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"]
    rows, against = {}, {}  # against: the row each row is compared with
    pools = os.environ.get("ONE_POOL_POOLS", "one").split(",")  # "hybrid": the same rows on sglang's SWA pools
    for b in os.environ.get("ONE_POOL_BACKENDS", "fa3,triton").split(","):
        for pool in pools:
            base = BASE + ["--model-path", target, "--trust-remote-code", "--attention-backend", b,
                           "--cuda-graph-max-bs", "32"] + os.environ.get("ONE_POOL_EXTRA", "").split()
            base += ["--disable-hybrid-swa-memory"] if pool == "one" else []
            p = ("" if b == "fa3" else f"{b}_") + ("" if pool == "one" else f"{pool}_")
            rows.update({f"{p}ref": (base, ON), f"{p}ref_off": (base, OFF), f"{p}mle_on": (base + mle, ON),
                         f"{p}mle_off": (base + mle, OFF)})
            against.update({f"{p}ref_off": f"{p}ref", f"{p}mle_on": f"{p}ref", f"{p}mle_off": f"{p}ref"})
            for probe in filter(None, os.environ.get("ONE_POOL_PROBES", "").split(",")):  # item 5: tests/gpu/item5_probe
                spec = mle if probe != "steps1" else mle[:-4] + ["--speculative-num-steps", "1", "--speculative-num-draft-tokens", "2"]
                env = {**ON, "ITEM5_PROBE": probe.removesuffix("fix"), "PYTHONPATH_PREPEND": PROBE_DIR}
                if probe == "a":  # probe a with 0.5.11's own pool; "afix": with mle_hidden_pool's
                    env["SGLANG_SWA_PLUGIN_FIXES"] = "-mle_hidden_pool"
                rows[f"{p}mle_on_{probe}"] = (base + spec, env)
                against[f"{p}mle_on_{probe}"] = f"{p}ref"
            if p:
                against[f"{p}ref"] = "ref"  # another backend's (or pool's) decode against fa3's one-pool decode
    only = os.environ.get("ROWS")
    if only:
        rows = {k: v for k, v in rows.items() if k in only.split(",")}
    res = run_many({k: (f"onepool_{k}", out, args, env, reqs, 48) for k, (args, env) in rows.items()})
    for k, r in res.items():
        ref_key = against.get(k)
        ref = res.get(ref_key, {}) if ref_key else {}
        both = r.get("state") == "served" and ref.get("state") == "served"
        cmp = compare(r.get("outputs") or [], ref.get("outputs") or []) if both else None
        print(f"ONE_POOL_MLE {k}: {r.get('state')} | identical to {ref_key} {cmp and cmp['identical_requests']}/{len(reqs)} | "
              f"accept {r.get('accept_length')} | {r.get('error') or ''}"[:400], flush=True)
    return res


def scenario_tree_accept(out, _target, _draft):
    """The listed gap "triton, topk > 1, CUDA graphs on, 0.5.11: 1.3-1.5 accepted" against its
    reading in the source: sglang's topk > 1 runs the non-overlap (V1) EAGLE worker, which packs
    each request's accepted tokens for the draft extend, while triton's draft-extend CUDA graph lays
    out steps + 1 query tokens per request, so from the second request on a request's last token
    attends another's block (not tied to sliding windows). The selftest's MiMo-V2 target with its
    MTP draft on triton, plugin on, NEXTN 3 steps; rows: topk 2 with CUDA graphs at concurrency 1
    (prediction: eager's acceptance) and 16 (the drop), topk 2 eager, topk 2 with that graph
    refused (probe ``nodext``: ``EAGLEDraftExtendCudaGraphRunner.can_run`` False; prediction: eager's
    acceptance), topk 1 on the V1 worker (``--disable-overlap-schedule``; prediction: the drop) and
    on the default V2 worker. Every row's tokens against the concurrency-1 row."""
    from sglang_swa_plugin.selftest.targets import mimo_v2

    target, _ = mimo_v2.save(tempfile.mkdtemp(prefix="tree_accept_"))
    reqs = [p for seed in prompt_seeds() for p in mimo_v2.prompts(32, 130, seed)]
    base = exact_base(target) + ["--attention-backend", "triton", "--trust-remote-code"]
    k2, k1 = eagle3_real(target, 2, 3, 4, "NEXTN"), eagle3_real(target, 1, 3, 4, "NEXTN")
    probe = {**ON, "ITEM5_PROBE": "nodext", "PYTHONPATH_PREPEND": PROBE_DIR}
    rows = {"k2_c1": (base + k2, ON, 1), "k2_c16": (base + k2, ON, 16), "k2_eager_c16": (eager(base + k2), ON, 16),
            "k2_nodext_c16": (base + k2, probe, 16), "k1_v1_c16": (base + k1 + ["--disable-overlap-schedule"], ON, 16),
            "k1_c16": (base + k1, ON, 16)}
    res = run_many({k: (f"tree_{k}", out, a, env, reqs, 64, {"concurrency": c}) for k, (a, env, c) in rows.items()})
    ref = res["k2_c1"]
    for k, r in res.items():
        both = r.get("state") == "served" and ref.get("state") == "served"
        cmp = compare(r.get("outputs") or [], ref.get("outputs") or []) if both else None
        print(f"TREE_ACCEPT {k}: {r.get('state')} | accept {r.get('accept_length')} | identical to k2_c1 "
              f"{cmp and cmp['identical_requests']}/{len(reqs)} | {r.get('error') or ''}"[:300], flush=True)
    return res


SETTINGS = {"off": OFF, "on": ON, "guard": {**ON, "SGLANG_SWA_PLUGIN_GUARD": "1"}}


def scenario_cost(out, target, _draft, reps: int = int(os.environ.get("COST_REPS", "2"))):
    """Decode throughput (no speculative decoding, CUDA graphs on) for the settings in
    COST_SETTINGS (default "on,off"; "guard" = plugin on with the index guard), alternating,
    ``reps`` servers each; per server a warm-up round and 3 timed rounds, median taken."""
    import statistics

    reqs = prompts(64, 32, seed=2)
    common = BASE + ["--model-path", target, "--attention-backend", "fa3", "--max-total-tokens", "16384",
                     "--cuda-graph-max-bs", "64"]
    labels = os.environ.get("COST_SETTINGS", "on,off").split(",")
    rows = []
    for i in range(reps):
        for label in labels:
            r = run(f"cost_{label}_{i}", out, common, SETTINGS[label], reqs, 256, concurrency=64, rounds=3)
            rounds = r.get("round_tok_per_s") or []
            rows.append({"setting": label, "rep": i, "rounds_tok_per_s": rounds,
                         "tok_per_s": statistics.median(rounds) if rounds else None, "error": r.get("error"),
                         "plugin_log": [l[-120:] for l in r.get("plugin_log", [])][:8]})
    res = {"rows": rows}
    for label in labels:
        vals = [r["tok_per_s"] for r in rows if r["setting"] == label and r["tok_per_s"]]
        res[f"mean_{label}"] = sum(vals) / len(vals) if vals else None
    if len(labels) > 1 and res.get(f"mean_{labels[0]}") and res.get(f"mean_{labels[1]}"):
        res[f"ratio_{labels[0]}_over_{labels[1]}"] = res[f"mean_{labels[0]}"] / res[f"mean_{labels[1]}"]
    return res


def scenario_throughput(out, _target, _draft):
    """Issue #31 item 2: server throughput with the plugin and without it, on the conformance
    matrix's default rows where both run (the GPT-OSS target of tests/gpu/gptoss_target.py,
    sglang's defaults: CUDA graphs on, the backend's page size): fa3 plain decode, fa3 EAGLE3
    topk 1 (its real-weight draft, 3 steps, 4 draft tokens) and trtllm_mha (XQA decode) plain.
    Per row a plugin server and a stock server start side by side and stay warm; then a warm-up
    round on each and TP_ROUNDS (default 5) timed rounds each, alternating A/B, every round
    64 concurrent greedy requests (130-token prompts, TP_NEW_TOKENS new tokens, default 384,
    ignore_eos). Tokens/s per round (completion tokens / wall time); the ratio plugin/stock
    of the per-row medians. TP_ROWS (comma list) selects rows. TP_WITHOUT (comma list of fix
    names): per row, one more plugin server per fix with that fix off ("without_<fix>"), in the
    same alternation, to attribute a ratio below 1. TP_CONTROL=1: a second stock server
    ("stock_again"), whose ratio to stock is the measurement's own spread. Accept length per
    side where speculative."""
    import statistics

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gptoss_target as gt
    import throughput_rows

    target, draft = gt.save(tempfile.mkdtemp(prefix="swa_throughput_"))
    reqs = gt.prompts(64, 130, 31)
    rounds, new = int(os.environ.get("TP_ROUNDS", "5")), int(os.environ.get("TP_NEW_TOKENS", "384"))
    # room for 64 requests of 130 + 256 tokens, CUDA graphs up to 64 requests (the later flag wins)
    # the SWA pool as large as the full one: no request waits for SWA room (a queue decides the
    # throughput otherwise, not the step: the first run had "#queue-req 16" at 98 % SWA usage)
    base = exact_base(target, 65536) + ["--cuda-graph-max-bs", "64", "--max-running-requests", "64",
                                        "--swa-full-tokens-ratio", "1.0"]
    rows = {"fa3_plain": base + BACKEND_ARGS["fa3"], "fa3_eagle3_k1": base + BACKEND_ARGS["fa3"] + eagle3_real(draft, 1, 3, 4),
            "trtllm_mha_plain": base + BACKEND_ARGS["trtllm_mha"], "triton_plain": base + BACKEND_ARGS["triton"]}
    chosen = [r for r in os.environ.get("TP_ROWS", ",".join(rows)).split(",") if r in rows]
    without = [f for f in os.environ.get("TP_WITHOUT", "").split(",") if f]
    sides = {"plugin": ON, "stock": OFF, **{f"without_{f}": {**ON, "SGLANG_SWA_PLUGIN_FIXES": f"all,-{f}"} for f in without}}
    if os.environ.get("TP_CONTROL"):  # A/A: a second stock server in the same alternation (the ratio's spread)
        sides["stock_again"] = OFF
    servers = {(row, side): Server(f"throughput_{row}_{side}", out, rows[row], env)
               for row in chosen for side, env in sides.items()}  # all start side by side

    def one_round(srv) -> dict:
        return throughput_rows.one_round(srv.port, reqs, new)

    res = {"rounds": rounds, "new_tokens": new, "concurrency": len(reqs), "rows": {}}
    try:
        started = {k: srv.wait() for k, srv in servers.items()}
        for row in chosen:
            a, b = servers[(row, "plugin")], servers[(row, "stock")]
            r = {side: [] for side in sides}
            if not (started[(row, "plugin")] and started[(row, "stock")]):
                r["error"] = "; ".join(f"{side}: {first_error(s.log) or 'did not start'}" for side, s in
                                       (("plugin", a), ("stock", b)) if not started[(row, side)])
                res["rows"][row] = r
                continue
            live = [side for side in sides if started[(row, side)]]
            warm = {side: one_round(servers[(row, side)]) for side in live}
            r["accept_length"] = {side: w["accept_length"] for side, w in warm.items()}
            for _ in range(rounds):  # A B A B ...
                for side in live:
                    got = one_round(servers[(row, side)])
                    r[side].append(got["tok_per_s"])
                    if got["errors"]:
                        r.setdefault("errors", []).extend(got["errors"])
            for side in live:
                r[f"{side}_median_tok_per_s"] = statistics.median(r[side]) if r[side] else None
            for side in live[2:]:
                if r[f"{side}_median_tok_per_s"] and r["stock_median_tok_per_s"]:
                    r[f"ratio_{side}_over_stock"] = round(r[f"{side}_median_tok_per_s"] / r["stock_median_tok_per_s"], 4)
                    r[f"round_ratios_{side}"] = [round(x / y, 4) for x, y in zip(r[side], r["stock"]) if y]
            if r["plugin_median_tok_per_s"] and r["stock_median_tok_per_s"]:
                r["ratio_plugin_over_stock"] = round(r["plugin_median_tok_per_s"] / r["stock_median_tok_per_s"], 4)
                # each plugin round over the stock round right after it: the spread of the ratio
                r["round_ratios"] = [round(x / y, 4) for x, y in zip(r["plugin"], r["stock"]) if y]
                r["median_round_ratio"] = statistics.median(r["round_ratios"])
            same = sum(1 for x, y in zip(warm["plugin"]["outputs"], warm["stock"]["outputs"]) if x is not None and x == y)
            r["identical_requests_plugin_vs_stock"] = f"{same}/{len(reqs)}"  # for information: stock may be wrong
            r["plugin_log"] = [l[-120:] for l in a.log_lines("sglang-swa-plugin")][:6]
            r["stock_plugin_lines"] = len(b.log_lines("sglang-swa-plugin"))  # 0: the stock server ran without it
            res["rows"][row] = r
    finally:
        for srv in servers.values():
            srv.stop()
    print(f"{'row':<18} {'plugin tok/s':>13} {'stock tok/s':>12} {'ratio':>7} {'median round ratio':>19}")
    for row, r in res["rows"].items():
        if "error" in r:
            print(f"{row:<18} error: {r['error'][:200]}")
        else:
            print(f"{row:<18} {r['plugin_median_tok_per_s'] or '-':>13} {r['stock_median_tok_per_s'] or '-':>12} "
                  f"{r.get('ratio_plugin_over_stock', '-'):>7} {r.get('median_round_ratio', '-'):>19}")
    print("THROUGHPUT=" + json.dumps({k: {x: y for x, y in v.items() if x.startswith(("ratio", "round_ratios")) or x in (
        "plugin", "stock", "median_round_ratio", "error", "accept_length", "identical_requests_plugin_vs_stock")}
                                      for k, v in res["rows"].items()}), flush=True)
    return res


SCENARIOS = {"trtllm_eagle_accept": scenario_trtllm_eagle_accept, "xqa_verify": scenario_xqa_verify,
             "fa3_seq": scenario_fa3_seq, "fa3_eagle3": scenario_fa3_eagle3, "fa3_control": scenario_fa3_control,
             "guard_server": scenario_guard_server, "batched_decode": scenario_batched_decode, "cost": scenario_cost,
             "llama4_fa3": scenario_llama4_fa3, "fi_verify": scenario_fi_verify, "llama4_eagle": scenario_llama4_eagle,
             "llama4_tree": scenario_llama4_tree, "llama4_tree_wide": scenario_llama4_tree_wide,
             "triton_mtp": scenario_triton_mtp, "llama4_exact": scenario_llama4_exact,
             "gptoss_exact": scenario_gptoss_exact, "gemma4_exact": scenario_gemma4_exact,
             "throughput": scenario_throughput, "one_pool_mle": scenario_one_pool_mle,
             "llama4_trtllm": scenario_llama4_trtllm, "tree_accept": scenario_tree_accept}


def _summary(res: dict) -> dict:
    summary = {}
    for k, v in res.items():
        if isinstance(v, dict) and "identical_steps" in v:
            summary[k] = v
        elif isinstance(v, dict) and "identical_requests" in v:
            summary[k] = f"{v['identical_requests']}/{v['of']} requests identical; first divergence: {v.get('bands')}"
        elif isinstance(v, dict) and "name" in v:
            summary[k] = {x: v.get(x) for x in ("accept_length", "cuda_graph", "crash", "error", "startup_s", "errors",
                                                "assertions", "round_tok_per_s", "steps_with_index_spaces_apart",
                                                "guard_message", "illegal_memory_access", "assert_lines", "verify_fix_log", "retracted_requests") if v.get(x) not in (None, [], False)}
            summary[k]["plugin_log"] = [l[-110:] for l in v.get("plugin_log", [])
                                        if "trtllm_xqa" in l or "guard" in l or "fa3_local_attn" in l or "flashinfer" in l or "triton_swa_draft" in l][:2]
        elif isinstance(v, dict):
            summary[k] = _summary(v)
        elif not isinstance(v, list):
            summary[k] = v
    if "rows" in res:
        summary["rows"] = res["rows"]
    return summary


def run_scenario(name: str, out: str, target: str, draft: str) -> None:
    from importlib.metadata import version

    t = time.time()
    try:
        res = SCENARIOS[name](out, target, draft)
    except Exception as e:  # noqa: BLE001 - the other scenarios go on
        res = {"scenario_error": f"{type(e).__name__}: {e}"}
    res["sglang"] = version("sglang")
    res["seconds"] = round(time.time() - t, 1)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"== {name}: " + json.dumps(_summary(res))[:5000], flush=True)


def main():
    global _POOL
    ap = argparse.ArgumentParser()
    ap.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    import sglang  # noqa: F401

    root = tempfile.mkdtemp(prefix="swa_e2e_")
    target, draft = make_models(root)
    if PARALLEL > 1:  # scenarios side by side, PARALLEL servers at a time in all
        _POOL = ThreadPoolExecutor(PARALLEL)
        with ThreadPoolExecutor(len(a.scenarios)) as ex:
            list(ex.map(lambda s: run_scenario(s, a.out, target, draft), a.scenarios))
    else:
        for s in a.scenarios:
            run_scenario(s, a.out, target, draft)


if __name__ == "__main__":
    main()
