"""The accept length a speculative row should reach: sglang's speculative data flow run on the
CPU with the target and the draft in float32, so that a row whose draft reads the wrong keys
(a draft-side window or index bug: the target still verifies every token, only acceptance
drops) shows against the model's own figure.

What is emulated (read from sglang 0.5.11's speculative/eagle_worker.py, multi_layer_eagle_worker.py,
spec_utils.py, eagle_info.py, models/llama_eagle3.py and models/mimo_v2_nextn.py):
- the target is the row's float32 reference (``hf_model``); its greedy tokens are the
  ``reference_outputs`` (verification accepts a draft token exactly when it is the reference's
  token there), and its hidden states at every position come from one forward of prompt +
  output (causal: what each verify computes at the accepted positions);
- the draft's weights and config are read from the checkpoint ``save`` writes (bf16 as served,
  computed in float32); the draft shares the target's embedding (EAGLE3: its own lm_head;
  MTP: the target's head);
- EAGLE3 (``EAGLEWorker``): the target's aux hidden states (the residual stream leaving each
  layer of ``eagle_aux_hidden_state_layer_ids``, concatenated) go through ``fc``; the draft's
  one Llama layer reads ``[input_layernorm(embed) | hidden_norm(hidden)]``, neox RoPE; draft
  extend after the prefill and after every verify (cache entry j: token j + 1 with the target's
  hidden state of position j); draft decode steps carry the draft's pre-norm output, run at
  RoPE position seq_len + 1 + i with cache index seq_len + i; topk > 1: the full tree, as
  ``select_top_k_tokens`` and ``organize_draft_results`` build it, each branch reading its own
  cache slots of the round (``generate_draft_decode_kv_indices``: by slot, not by lineage);
- MiMo-V2's MTP layers: ``eh_proj([enorm(embed) | hnorm(hidden)])``, the sliding-window layer
  (window by cache index), ``final_layernorm``, the target's head. NEXTN runs them in
  ``EAGLEWorker`` (as EAGLE3 above, one layer reused per step; the target hands its post-norm
  hidden state, the draft decode carries the layer's post-norm output); multi-layer EAGLE
  (``MultiLayerEagleWorker``) runs step k as layer k's extend over the same positions, its
  input ids shifted once more per step with the previous step's prediction appended (kept in
  that layer's cache afterwards), every step reading the target's pre-norm hidden state;
- Step3.5's MTP layers (models/step3p5_mtp.py, a checkpoint of their own): as MiMo-V2's, with
  Gemma's norms (1 + w), per-head q/k norms before RoPE, the head-wise sigmoid gate and the
  shared head's norm and head; multi-layer EAGLE only, its steps chained
  (``chain_mtp_hidden_states``: step k reads the residual step k - 1 left, step 0 the target's
  pre-norm hidden state);
- the figure is sglang's: completion tokens (the prefill's token included) over verify steps,
  summed over all requests; a request ends at ``len(output)`` tokens.
What is approximated: float32 instead of bf16 (the drafts are built with bf16-safe margins);
the data flow of the overlap scheduler's workers (``*_worker_v2``) is taken to be the same;
sglang 0.5.11's MiMo-V2 MTP loader maps every ``model.mtp.layers.N`` onto one block (the last
read wins): here NEXTN uses the last layer and multi-layer EAGLE step k layer k (the target's
layers are identical). Multi-layer EAGLE with topk > 1 is not computed (None).
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from types import ModuleType
from typing import NamedTuple, Optional, Sequence

FAULTS = ("shift", "window-1", "window+1", "decode-window-1")  # the draft-side reading errors ``fault`` emulates
# A row's accept length may fall this far below the expectation (bf16, the server's scheduling);
# every fault above lowers the expectation of every selftest target and mode it applies to by more.
TOLERANCE = 0.3
# The least expectation a speculative row is judged on: a draft that accepts less (on average not
# one draft token every other step) leaves too little for a reading error to lower, and the
# row's floor (expectation - TOLERANCE) comes near the 1.0 every row reaches. The selftest's
# drafts expect about 2.0 (EAGLE3) and 4.0 (MTP); a lower figure is the target's fault.
DRAFT_ACCEPTS = 1.5
MTP_ARCHITECTURES = {"MiMoV2FlashForCausalLM", "Step3p5ForCausalLM"}  # targets whose MTP layers the emulation knows


def expected_accept(target_module: ModuleType, spec, prompts: Sequence[Sequence[int]], new_tokens: int,
                    reference_outputs: Sequence[Sequence[int]], *, fault: Optional[str] = None,
                    model=None, saved: Optional[tuple] = None) -> Optional[float]:
    """The accept length (completion tokens / verify steps, over all requests, as sglang's
    ``spec_verify_ct`` counts) of ``spec`` (a ``rows.Spec``) on ``target_module`` for greedy
    requests ``prompts`` with their float32 outputs ``reference_outputs`` (``new_tokens`` each;
    a shorter output ends its request there), sglang's speculative data flow with the target
    and the draft computed in float32. None where it is not computable: no spec, a draft kind
    the target does not have, a target without a float32 reference here, MTP layers of an
    architecture other than MTP_ARCHITECTURES, multi-layer EAGLE with topk > 1, Step3.5's MTP
    other than as multi-layer EAGLE (sglang's Step3p5MTP loads only as one of its layers, with
    a ``draft_model_idx``: NEXTN's one-layer draft stops at its weights), no requests.

    ``fault`` (one of FAULTS; None: the draft as sglang should run it) makes the draft read
    wrong keys: "shift": every cached key but the query's own is read from the slot before;
    "window-1" / "window+1": the draft's sliding window one key narrower / wider (ValueError for
    a draft without a window); "decode-window-1": only its draft-decode steps read one key fewer
    (its extend as it should: the first draft token of a round right; ValueError without a window
    or a draft decode, i.e. multi-layer EAGLE). ``model``: the target's float32 reference model if already built
    (``hf_model(SIZE)``); ``saved``: the (target dir, draft dir) ``save`` wrote, else they are
    written to a temporary directory once per process."""
    from . import targets

    if spec is None or not prompts or targets.draft_kind(target_module) != spec.draft:
        return None
    if targets.unavailable(target_module) is not None:
        return None
    if spec.algorithm.upper() == "EAGLE" and spec.draft == "mtp" and spec.topk > 1:
        return None
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")
    import torch

    with torch.no_grad():
        model = model if model is not None else target_module.hf_model(target_module.SIZE)
        target_dir, draft_dir = saved or _saved(target_module.__name__)
        states = _TargetStates(model, target_module)
        if spec.draft == "mtp":
            cfg = _config(draft_dir)  # MiMo-V2: the target's own checkpoint; Step3.5: the MTP layers' own
            if not set(cfg.get("architectures") or ()) & MTP_ARCHITECTURES:
                return None
            step3p5 = cfg.get("model_type") == "step3p5"
            if step3p5 and spec.algorithm.upper() != "EAGLE":
                return None
            layers = _step3p5_mtp_layers(draft_dir, cfg) if step3p5 else _mtp_layers(draft_dir)
            embed, head = states.embed_and_head()
            if spec.algorithm.upper() == "EAGLE":  # multi-layer EAGLE: step k runs MTP layer k
                drafts = [_Draft("mtp", layers[min(k, len(layers) - 1)], cfg, embed, head, fault)
                          for k in range(spec.steps)]
            else:  # NEXTN: one MTP layer (sglang's loader keeps the last) for every step
                drafts = [_Draft("mtp", layers[-1], cfg, embed, head, fault)]
        else:
            cfg = _config(draft_dir)
            w = _tensors(draft_dir)
            w = {k[len("model."):] if k.startswith("model.") else k: v for k, v in w.items()}
            embed, head = states.embed_and_head()
            own_head = w.get("lm_head.weight")
            drafts = [_Draft("eagle3", w, cfg, embed, own_head if own_head is not None else head, fault)]
        if fault in ("window-1", "window+1", "decode-window-1") and drafts[0].window is None:
            raise ValueError(f"the {spec.draft} draft has no sliding window: fault {fault!r} does not apply")
        if fault == "decode-window-1" and (len(drafts) > 1 or spec.steps < 2):
            raise ValueError(f"{spec.algorithm} here runs no draft decode: fault {fault!r} does not apply")
        tokens = verifies = 0
        for prompt, out in zip(prompts, reference_outputs):
            out = list(out)[:new_tokens]
            if not out:
                continue
            seq = list(prompt) + out
            if spec.draft == "eagle3":
                hidden = states.aux(seq, _aux_layers(cfg, states.num_layers()))
            else:
                hidden = states.final(seq, post_norm=spec.algorithm.upper() != "EAGLE")
            if len(drafts) > 1:
                n = _multi_layer(drafts, seq, len(prompt), len(out), hidden, spec)
            else:
                n = _eagle(drafts[0], seq, len(prompt), len(out), hidden, spec)
            tokens, verifies = tokens + len(out), verifies + n
        return round(tokens / verifies, 4) if verifies else None


# -- the checkpoints ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _saved(module_name: str) -> tuple:
    """(target dir, draft dir) of the target's checkpoint, written once per process."""
    import importlib

    root = tempfile.mkdtemp(prefix="swa-selftest-accept-")
    return importlib.import_module(module_name).save(root)


def _config(path: str) -> dict:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def _tensors(path: str) -> dict:
    """Every tensor of the checkpoint's safetensors files, as float32."""
    from safetensors.torch import load_file

    out = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            out.update({k: v.float() for k, v in load_file(os.path.join(path, name)).items()})
    return out


def _mtp_layers(path: str) -> list:
    """The MTP layers' weights (``model.mtp.layers.N.``, names without the prefix), by N."""
    import re

    layers = {}
    for k, v in _tensors(path).items():
        m = re.match(r"(?:model\.)?mtp\.layers\.(\d+)\.(.+)", k)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2).replace("pre_mlp_layernorm", "post_attention_layernorm")] = v
    if not layers:
        raise ValueError(f"no MTP layers in {path}")
    return [layers[n] for n in sorted(layers)]


def _step3p5_mtp_layers(path: str, cfg: dict) -> list:
    """Step3.5's MTP layers (``model.layers.{num_hidden_layers + k}.``, ``transformer.`` dropped,
    as sglang's Step3p5MTP names them) under the names ``_Draft`` reads: every norm weight as
    the factor it is (Gemma's 1 + w), the shared head's norm as ``final_layernorm``."""
    import re

    first, layers = cfg["num_hidden_layers"], {}
    for k, v in _tensors(path).items():
        m = re.match(r"model\.layers\.(\d+)\.(?:transformer\.)?(.+)", k)
        if m and int(m.group(1)) >= first:
            name = m.group(2).replace("shared_head.norm.", "final_layernorm.")
            layers.setdefault(int(m.group(1)), {})[name] = v + 1.0 if name.endswith("norm.weight") else v
    if not layers:
        raise ValueError(f"no MTP layers in {path}")
    return [layers[n] for n in sorted(layers)]


def _aux_layers(cfg: dict, num_layers: int) -> list:
    """The target layers whose output the EAGLE3 draft reads (sglang's default where the draft's
    config names none)."""
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return list(ids) if ids else [1, num_layers // 2 - 1, num_layers - 4]


# -- the target ---------------------------------------------------------------------------------


class _TargetStates:
    """The target's hidden states of a whole sequence: the residual stream leaving each layer
    (EAGLE3's aux) or the last layer's, before or after the final norm (MTP)."""

    def __init__(self, model, module: ModuleType):
        self.model, self.module = model, module
        self.own = getattr(model, "sd", None) is not None and hasattr(module, "forward32")

    def embed_and_head(self) -> tuple:
        sd = self.model.state_dict()
        embed = [v for k, v in sd.items() if k.endswith("embed_tokens.weight")]
        head = [v for k, v in sd.items() if k.endswith("lm_head.weight")]
        return embed[0].float(), head[0].float()

    def num_layers(self) -> int:
        cfg = getattr(self.model, "config", None)
        cfg = getattr(cfg, "text_config", None) or cfg
        return cfg.num_hidden_layers

    def aux(self, seq: list, layer_ids: list):
        import torch

        out = self.model(input_ids=torch.tensor([seq]), output_hidden_states=True)
        hs = out.hidden_states
        return torch.cat([hs[i + 1][0].float() for i in layer_ids], -1)

    def final(self, seq: list, post_norm: bool):
        import torch

        ids = torch.tensor([seq])
        if self.own:
            _, x = self.module.forward32(self.model.sd, ids, self.model.window)
            x = x[0].float()
            if post_norm:
                w = self.model.sd["model.norm.weight"].float()
                x = x * (x.pow(2).mean(-1, keepdim=True) + self.module.EPS).rsqrt() * w
            return x
        norm = self.model.get_decoder().norm
        seen = {}
        handle = norm.register_forward_hook(lambda m, a, o: seen.update(pre=a[0], post=o))
        try:
            self.model(input_ids=ids)
        finally:
            handle.remove()
        return seen["post" if post_norm else "pre"][0].float()


# -- the draft's one layer ----------------------------------------------------------------------


class _Cache(NamedTuple):
    k: object  # [n, kv heads, head dim], RoPE'd at each entry's position
    v: object
    idx: object  # [n] cache index


def _rms(x, w, eps):
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * w


class _Draft:
    """One draft layer (sglang's EAGLE3 LlamaDecoderLayer or MiMo-V2's MTP layer) over a cache
    of its own keys: ``step`` runs new entries (tokens, the hidden states handed to them, RoPE
    positions, cache indices) against a cache and returns the last entry's (logits, pre-norm
    output, post-norm output) and the cache with the new entries."""

    def __init__(self, kind: str, w: dict, cfg: dict, embed, head, fault: Optional[str]):
        import torch

        self.kind, self.w, self.embed, self.fault = kind, w, embed, fault
        if kind == "eagle3":
            self.nh, self.nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
            self.hd = cfg.get("head_dim") or cfg["hidden_size"] // self.nh
            self.vhd, self.rot, self.vscale = self.hd, self.hd, 1.0
            self.theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 10000.0)
            self.eps, self.window = cfg.get("rms_norm_eps", 1e-6), None
        elif cfg.get("model_type") == "step3p5":  # Step3.5's MTP layer (models/step3p5_mtp.py): a sliding layer
            other, n = cfg["attention_other_setting"], cfg["num_hidden_layers"]
            self.nh, self.nkv, self.hd = other["num_attention_heads"], other["num_attention_groups"], other["head_dim"]
            self.vhd, self.vscale = self.hd, 1.0
            self.rot = int(self.hd * cfg["partial_rotary_factors"][n])
            self.theta, self.eps, self.window = cfg["rope_theta"][n], cfg["rms_norm_eps"], cfg["sliding_window"]
            head = w.get("shared_head.output.weight", head)
        else:  # MiMo-V2's MTP layer: the sliding layers' attention (models/mimo_v2_nextn.py)
            self.nh, self.nkv = cfg["swa_num_attention_heads"], cfg["swa_num_key_value_heads"]
            self.hd = cfg["swa_head_dim"]
            self.vhd = cfg.get("swa_v_head_dim") or self.hd
            self.rot = int(self.hd * cfg.get("partial_rotary_factor", 1.0))
            self.vscale = cfg.get("attention_value_scale") or 1.0
            self.theta = cfg.get("swa_rope_theta", cfg.get("rope_theta", 10000.0))
            self.eps, self.window = cfg.get("layernorm_epsilon", 1e-6), cfg["sliding_window_size"]
        self.head = head
        self.outputs = None  # the residual leaving the layer at every entry of the last step (chained MTP)
        if self.window is not None and fault in ("window-1", "window+1"):
            self.window += 1 if fault == "window+1" else -1
        self.inv = 1.0 / self.theta ** (torch.arange(0, self.rot, 2, dtype=torch.float32) / self.rot)
        self.fc = w.get("fc.weight")
        self.p = "midlayer." if kind == "eagle3" else ""

    def empty(self) -> _Cache:
        import torch

        return _Cache(torch.zeros(0, self.nkv, self.hd), torch.zeros(0, self.nkv, self.vhd), torch.zeros(0, dtype=torch.long))

    def _rope(self, x, pos):
        import torch

        ang = pos.float()[:, None] * self.inv
        cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
        r, rest = x[..., :self.rot], x[..., self.rot:]
        half = torch.cat([-r[..., self.rot // 2:], r[..., :self.rot // 2]], -1)
        return torch.cat([r * cos + half * sin, rest], -1)

    def step(self, tokens, hidden, pos, idx, cache: _Cache, decode: bool = False):
        import torch

        w, p, eps = self.w, self.p, self.eps
        tokens, pos, idx = torch.as_tensor(tokens), torch.as_tensor(pos), torch.as_tensor(idx)
        e = self.embed[tokens]
        if self.kind == "eagle3":
            if hidden.shape[-1] != e.shape[-1]:
                hidden = hidden @ self.fc.T + (w["fc.bias"] if "fc.bias" in w else 0)
            residual = hidden
            a = torch.cat([_rms(e, w[p + "input_layernorm.weight"], eps), _rms(hidden, w[p + "hidden_norm.weight"], eps)], -1)
        else:
            x = torch.cat([_rms(e, w["enorm.weight"], eps), _rms(hidden, w["hnorm.weight"], eps)], -1) @ w["eh_proj.weight"].T
            residual, a = x, _rms(x, w["input_layernorm.weight"], eps)
        n = len(tokens)
        q = (a @ w[p + "self_attn.q_proj.weight"].T).view(n, self.nh, self.hd)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).view(n, self.nkv, self.hd)
        if p + "self_attn.q_norm.weight" in w:  # Step3.5: per-head q/k norms before RoPE
            q, k = _rms(q, w[p + "self_attn.q_norm.weight"], eps), _rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = self._rope(q, pos), self._rope(k, pos)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(n, self.nkv, self.vhd) * self.vscale
        cache = _Cache(torch.cat([cache.k, k]), torch.cat([cache.v, v]), torch.cat([cache.idx, idx]))
        o = self._attend(q, idx, cache, decode)
        if p + "self_attn.g_proj.weight" in w:  # Step3.5: the head-wise sigmoid gate
            gate = (a @ w[p + "self_attn.g_proj.weight"].T).sigmoid()
            o = (o.view(n, self.nh, self.vhd) * gate[..., None]).reshape(n, self.nh * self.vhd)
        att = o @ w[p + "self_attn.o_proj.weight"].T
        residual = residual + att
        m = _rms(residual, w[p + "post_attention_layernorm.weight"], eps)
        act = torch.nn.functional.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)
        self.outputs = residual + act @ w[p + "mlp.down_proj.weight"].T
        out = self.outputs[-1]
        normed = _rms(out, w["norm.weight" if self.kind == "eagle3" else "final_layernorm.weight"], eps)
        return normed @ self.head.T, out, normed, cache

    def _attend(self, q, qidx, cache: _Cache, decode: bool = False):
        """Each query (cache index qidx) over the cache's keys at index <= its own (within the
        window); ``fault`` "shift": the keys other than its own read from the slot before;
        "decode-window-1": a draft-decode step's (``decode``) window one key narrower."""
        import torch

        window = self.window
        if window is not None and decode and self.fault == "decode-window-1":
            window -= 1
        q = q.view(len(qidx), self.nkv, self.nh // self.nkv, self.hd)  # query heads by KV group
        k, v = cache.k, cache.v
        s = torch.einsum("qgjd,kgd->gjqk", q, k) / math.sqrt(self.hd)
        own = cache.idx[None, :] == qidx[:, None]
        if self.fault == "shift":
            ks, vs = torch.cat([k[:1], k[:-1]]), torch.cat([v[:1], v[:-1]])
            s = torch.where(own, s, torch.einsum("qgjd,kgd->gjqk", q, ks) / math.sqrt(self.hd))
        dist = qidx[:, None] - cache.idx[None, :]
        allowed = (dist >= 0) & ((dist < window) if window is not None else True)
        prob = s.masked_fill(~allowed, float("-inf")).softmax(-1)
        if self.fault == "shift":
            o = torch.einsum("gjqk,kgd->qgjd", prob * own, v) + torch.einsum("gjqk,kgd->qgjd", prob * ~own, vs)
        else:
            o = torch.einsum("gjqk,kgd->qgjd", prob, v)
        return o.reshape(len(qidx), self.nh * self.vhd)


# -- sglang's speculative loops -----------------------------------------------------------------


def _accepted(nodes: list, seq: list, s: int) -> int:
    """Draft tokens the verify accepts: from the root (the last verified token, position s),
    the child whose token is the target's next token, as long as there is one. ``nodes``:
    (token, parent node or -1) of the tree's draft tokens."""
    cur, a = -1, 0
    while s + 1 + a < len(seq):
        nxt = [i for i, (tok, par) in enumerate(nodes) if par == cur and tok == seq[s + 1 + a]]
        if not nxt:
            break
        cur, a = nxt[0], a + 1
    return a


class _Tree:
    """sglang's bookkeeping of a round's draft tree (``select_top_k_tokens``,
    ``organize_draft_results``): every candidate's token, score (product of the draft's
    probabilities along its path) and parent, by sglang's flat candidate index."""

    def __init__(self, k: int):
        self.k, self.tokens, self.parents, self.scores, self.depth = k, [], [], [], 0

    def first(self, topk_p, topk_index) -> tuple:
        """The draft extend's topk ([k]): the first candidates; returns (the k branches' input
        ids, the branch whose hidden state each reads)."""
        self.score, self.sel = topk_p, list(range(self.k))
        self.tokens += topk_index.tolist()
        self.parents += [-1] * self.k
        self.scores.append(topk_p)
        return topk_index, [0] * self.k

    def expand(self, topk_p, topk_index) -> tuple:
        """One draft decode step's topk per branch ([k, k]): k * k candidates, of which the k
        best-scored are the next branches."""
        k = self.k
        self.depth += 1
        base = k + k * k * (self.depth - 1)
        expand = (self.score[:, None] * topk_p).flatten()
        self.tokens += topk_index.flatten().tolist()
        self.parents += [self.sel[b] for b in range(k) for _ in range(k)]
        self.scores.append(expand)
        self.score, cs = expand.topk(k)
        self.sel = [base + int(c) for c in cs]
        return topk_index.flatten()[cs], [int(c) // k for c in cs]

    def chosen(self, draft_tokens: int) -> list:
        """The flat indices of the tree's draft tokens: the draft_tokens - 1 best scores, in order."""
        import torch

        flat = torch.cat(self.scores)
        return sorted(flat.topk(min(draft_tokens - 1, len(flat))).indices.tolist())

    def nodes(self, draft_tokens: int) -> list:
        """(token, parent node or -1: the root) of the tree's draft tokens; a node whose parent
        is not in the tree is unreachable (-2)."""
        chosen = self.chosen(draft_tokens)
        keep = {c: j for j, c in enumerate(chosen)}
        return [(self.tokens[c], -1 if self.parents[c] < 0 else keep.get(self.parents[c], -2)) for c in chosen]


def _eagle(draft: _Draft, seq: list, plen: int, n_out: int, hidden, spec) -> int:
    """Verify steps of one request under ``EAGLEWorker`` (EAGLE3, NEXTN): draft extend over the
    prompt, then rounds of draft decode (a tree for topk > 1), verify, draft extend."""
    import torch

    k, steps = spec.topk, spec.steps
    cache = draft.empty()
    last, out, normed, cache = draft.step(seq[1:plen + 1], hidden[:plen], range(plen), range(plen), cache)
    carry = out if draft.kind == "eagle3" else normed
    s, gen, verifies = plen, 1, 0
    while gen < n_out:
        tree = _Tree(k)
        ids, picks = tree.first(*last.softmax(-1).topk(k))
        hiddens = [carry] * k
        slots = [draft.empty() for _ in range(k)]
        for i in range(steps - 1):
            outs_l, outs_h = [], []
            for b in range(k):
                # RoPE position seq_len + 1 + i, cache index seq_len + i: the branch's slot i, read
                # with the branch's earlier slots of the round (by slot, not by lineage)
                lg, o, nm, both = draft.step([int(ids[b])], hiddens[b][None], [s + 1 + i], [s + i],
                                             _Cache(*(torch.cat([c, d]) for c, d in zip(cache, slots[b]))), decode=True)
                slots[b] = _Cache(*(t[len(cache.idx):] for t in both))
                outs_l.append(lg)
                outs_h.append(o if draft.kind == "eagle3" else nm)
            ids, picks = tree.expand(*torch.stack(outs_l).softmax(-1).topk(k, dim=-1))
            hiddens = [outs_h[b] for b in picks]
        nodes = tree.nodes(spec.draft_tokens)
        a = _accepted(nodes, seq, s)
        verifies, gen = verifies + 1, gen + a + 1
        if gen >= n_out:
            break
        new = range(s, s + a + 1)  # entries s .. s + a: token j + 1, the target's hidden state of j
        last, out, normed, cache = draft.step(seq[s + 1:s + a + 2], hidden[s:s + a + 1], new, new, cache)
        carry = out if draft.kind == "eagle3" else normed
        s += a + 1
    return verifies


def _multi_layer(drafts: list, seq: list, plen: int, n_out: int, hidden, spec) -> int:
    """Verify steps of one request under ``MultiLayerEagleWorker`` (topk 1): every step k an
    extend of MTP layer k over the new positions, its input ids shifted once more, the previous
    step's prediction appended; Step3.5's steps chained (``chain_mtp_hidden_states``: step k
    reads the residual step k - 1 left at the same positions, step 0 the target's)."""
    caches = [d.empty() for d in drafts]
    chained = "shared_head.output.weight" in drafts[0].w

    def extend(ids: list, span: range) -> list:
        chain, h = [], hidden[span.start:span.stop]
        for k, d in enumerate(drafts):
            logits, _, _, caches[k] = d.step(ids, h, span, span, caches[k])
            chain.append(int(logits.argmax()))
            ids = ids[1:] + [chain[-1]]
            h = d.outputs if chained else h
        return chain

    chain = extend(seq[1:plen + 1], range(plen))
    s, gen, verifies = plen, 1, 0
    while gen < n_out:
        nodes = [(t, j - 1) for j, t in enumerate(chain[:spec.draft_tokens - 1])]
        a = _accepted(nodes, seq, s)
        verifies, gen = verifies + 1, gen + a + 1
        if gen >= n_out:
            break
        chain = extend(seq[s + 1:s + a + 2], range(s, s + a + 1))
        s += a + 1
    return verifies
