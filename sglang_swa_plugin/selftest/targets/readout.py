"""Shared pieces of the readout targets (``gptoss``, ``llama4``, ``gemma4`` in this package):
RoPE score profiles from a linear program, the class codes and votes, prompts, and greedy
decoding of a transformers model in float32 with the whole sequence recomputed every step.

A readout target's tokens belong to one of 64 classes; a token's embedding is its class's
Hadamard code (+-1) on hidden coordinates 0-63 and 1 on 64-71. Its attention layers read q and
k from coordinate 64 only, so each layer's score is a fixed function of the distance between
query and key, set through RoPE (``qk``); each layer writes the attended token's code on its own
64 coordinates, and the lm_head turns the codes into votes.

The every-layer design (``design_layer``, ``vocab(g, layers)``): every layer votes, and the
output token names every vote's choice at once. A local (sliding or chunked) layer reads the
oldest key its window or chunk allows (vote A) or the previous token (vote B); a full layer
reads the first token (vote C: a RoPE ramp over 300 positions), or, without RoPE (Llama 4's
global layers), the key whose token id is the one the first layer read. Token t = a + 16 (b +
16 c) + FIRST is the choice (a, b, c): each vote's class maps to one component of its digit
(COMPONENTS), and the lm_head adds the votes (``vote_rows``). No vote outweighs another, so a
wrong read of any of them at any step, a window off by one, a wrong slot read as the oldest key
or as the previous token, or a full layer reading another request's keys, changes the token
there unless both classes share the component (1 in 16, about 1 in 7 for C), and with it the rest of
the output (``check``); the smallest relative logit margin is about a third. Every query head copies
its own slice of the code: every tensor-parallel rank's heads decide (head counts 8 or 16).
The EAGLE3 draft (``design_draft``) gives the target's token at its first step (A from a
lookahead read by half of layer 0's heads) and B and C at the next ones, guessing A there.
"""

from __future__ import annotations

import contextlib
import functools
import math

HD = 64
THETA = 10000.0
STEP, PEAK = 12.0, 16.0  # score gaps (after the 1/sqrt(64) scaling)
RAMP_SPAN, PEAK_SPAN = 40, 300
FIRST_STEP, FIRST_SPAN = 6.0, 300  # a full layer's ramp: the first token of sequences up to 300 tokens
H, V = 448, 2048
CODE, CONST, PA, PB = slice(0, 64), 64, slice(128, 192), slice(192, 256)  # hidden coordinates
ID, NID, SCRATCH = slice(72, 83), 11, slice(88, 99)  # token id bits; a layer's copy of the attended ones
LOOK = slice(384, 448)  # the every-layer design's lookahead for the EAGLE3 draft (no vote)
REPR = 1000  # the two-vote design: class k's output token is REPR + k
VOTE_A, VOTE_B, SCALES = 0.8, 1.0, (0.675, 1.0)  # the two-vote design (``vocab(g)``)
LOGIT = 0.1  # lm_head scale
RMS = (math.sqrt(72 / H), math.sqrt((72 + 64) / H))  # residual rms entering the two deciding layers
# The every-layer design (``design_layer``): the output token names every vote's choice at once.
# Token t = FIRST + a + 16 (b + 16 c) is the choice (a, b, c) of components (COMPONENTS; no
# output below FIRST: pad, bos and eos stay out); a class (0-63) maps to one component per vote
# (a random 4-to-1 or about 9-to-1 map), and the lm_head scores t by the sum over votes of [the
# vote's class maps to t's component] * WEIGHT[v]: no vote outweighs another, every vote decides
# every token, and a read of another class changes the token unless both classes share the
# component (1 in 16 for A and B, about 1 in 7 for C, whose wrong reads differ from step to step).
COMPONENTS, FIRST = {"A": 16, "B": 16, "C": 7}, 16
WEIGHT = {"A": 1.0, "B": 1.0, "C": 1.0}
MARGIN_FLOOR = 0.05  # smallest relative logit margin a target may have (bf16 must not flip a choice)


def area(i: int) -> slice:
    """The 64 hidden coordinates layer ``i`` writes in the every-layer design."""
    return slice(128 + 64 * i, 192 + 64 * i)


def vocab(g, layers=None) -> dict:
    """Classes and votes (torch generator ``g``): every token's class, the embedding and the
    lm_head.

    ``layers`` None (the two-vote design): token REPR + k has class perm[k] (generated text
    walks a permutation instead of collapsing); the next token is REPR + k for the class k with
    the larger vote s_k * w, w = VOTE_A for the class written on PA, VOTE_B for PB (equal
    classes add up); every other token scores below zero. ``layers`` (the every-layer design): a
    (vote, read) pair per layer; every token draws its class; layer i writes its read's code on
    ``area(i)`` and the lm_head scores it with ``vote_rows`` of its vote, shared among the
    layers of that vote; a vote no layer casts keeps its component 0 (``maps``: per vote, the
    component of each class)."""
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
    voc = {"had": had, "perm": perm, "cls": cls, "scale": scale, "emb": emb, "head": head, "rep": rep,
           "layers": layers}
    if layers is None:
        head[rep, PA] = LOGIT * VOTE_A * scale[:, None] * had
        head[rep, PB] = LOGIT * VOTE_B * scale[:, None] * had
        return voc
    voc["cls"] = torch.randint(0, 64, (V,), generator=g)  # every token a class of its own draw
    emb[:, CODE] = had[voc["cls"]]
    if any(read == "lookup" for _, read in layers):  # the token's id bits, +-1
        emb[:, ID] = 1.0 - 2.0 * ((torch.arange(V)[:, None] >> torch.arange(NID)) & 1).float()
    voc["maps"] = {v: torch.randperm(64, generator=g) % k for v, k in COMPONENTS.items()}
    head[:, CONST:CONST + 8] = -LOGIT * 64 * (~product_tokens()).float()[:, None]
    for i, (vote, _) in enumerate(layers):
        if vote is not None:
            head[:, area(i)] = vote_rows(voc, vote) / sum(v == vote for v, _ in layers)
    for vote in COMPONENTS:  # a vote no layer casts: its component 0, the others below it
        if all(v != vote for v, _ in layers):
            head[:, CONST:CONST + 8] -= LOGIT * 8 * (component(vote) != 0).float()[:, None]
    return voc


def product_tokens():
    """[V] bool: the tokens that name a choice (FIRST .. FIRST + 16 * 16 * 7 - 1)."""
    import torch

    t = torch.arange(V) - FIRST
    return (t >= 0) & (t < math.prod(COMPONENTS.values()))


def component(vote: str):
    """Every token's component for ``vote`` (t = FIRST + a + 16 (b + 16 c); tokens outside the
    product: component 0, and the heads keep them below every product token)."""
    import torch

    below = math.prod(k for v, k in COMPONENTS.items() if v < vote)
    return torch.where(product_tokens(), (torch.arange(V) - FIRST) // below % COMPONENTS[vote], 0)


def vote_rows(voc: dict, vote: str):
    """[V, 64]: the lm_head rows that score ``vote``'s code (a class's +-1 code, as a layer copies
    it): LOGIT * WEIGHT * 64 for the tokens whose component the class maps to, 0 for the others
    (the codes are orthogonal)."""
    import torch

    maps, had = voc["maps"][vote], voc["had"]
    per = torch.stack([had[maps == c].sum(0) for c in range(COMPONENTS[vote])])
    return LOGIT * WEIGHT[vote] * per[component(vote)]


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


def _look(read: str):
    """(base read, lookahead delta or None) of a read name ("ramp/look14": the ramp, and half
    of the layer's heads reading delta 14 for the draft)."""
    base, _, look = read.partition("/look")
    return base, (int(look) if look else None)


def units(i: int, layers) -> int:
    """How many hidden coordinates hold +-1 in the residual entering layer ``i`` of the
    every-layer design: the embedding's code and constant, its id bits (where a layer looks up
    ids), 64 per earlier layer, and what earlier layers copy beside their vote (the id bits a
    lookup needs, the draft's lookahead on LOOK)."""
    lookup = any(read == "lookup" for _, read in layers)
    look = any(_look(read or "")[1] is not None for _, read in layers[:i])
    return 72 + (2 * NID if lookup and i > 0 else NID if lookup else 0) + 64 * i + (64 if look else 0)


def design_layer(i: int, layers, nh: int, nkv: int, neox: bool, theta: float = THETA) -> dict:
    """q, k, v, o weights (float32, [out, in]) of layer ``i`` of the every-layer design: every
    query head scores by the layer's read (``qk``: "ramp" the oldest key its window allows,
    "peak" delta 1, "recent" delta 1 else 2, "first" the first token; "lookup" the key whose id
    bits equal the ones an earlier ramp layer copied, no RoPE needed) and copies its own slice
    of the attended token's code onto ``area(i)``: every head, and every KV group, carries part
    of the layer's vote, so every tensor-parallel rank's shard decides. "ramp/lookN": the second
    half of the heads (and groups) read delta N instead and write LOOK (not a vote: the
    EAGLE3 draft's lookahead, ``design_draft``). A lookup design's ramp layer also copies the
    attended token's id bits onto SCRATCH (KV group 0, head 0)."""
    import torch

    read = layers[i][1]
    if read is None:  # a layer that adds nothing (the blind targets of the checks' tests)
        return {"q": torch.zeros(nh * HD, H), "k": torch.zeros(nkv * HD, H), "v": torch.zeros(nkv * HD, H),
                "o": torch.zeros(H, nh * HD)}
    base, look = _look(read)
    rms = math.sqrt(units(i, layers) / H)
    lookup = any(r == "lookup" for _, r in layers)
    parts = [(base, area(i))] + ([(f"look{look}", LOOK)] if look is not None else [])
    assert nh % (nkv * 1) == 0 and nkv % len(parts) == 0 and 64 % (nh // len(parts)) == 0, (nh, nkv)
    ph, pg = nh // len(parts), nkv // len(parts)  # heads and groups of a part
    wh, wg, hpg = 64 // ph, 64 // pg, nh // nkv
    wq, wk, wv, wo = torch.zeros(nh * HD, H), torch.zeros(nkv * HD, H), torch.zeros(nkv * HD, H), torch.zeros(H, nh * HD)
    for n, (kind, out) in enumerate(parts):
        heads, groups = range(n * ph, (n + 1) * ph), range(n * pg, (n + 1) * pg)
        if kind == "lookup":
            for h in heads:
                wq[h * HD:h * HD + NID, SCRATCH] = torch.eye(NID) * rms * 8 * math.sqrt(HD)  # score 8 per agreeing bit
            for grp in groups:
                wk[grp * HD:grp * HD + NID, ID] = torch.eye(NID) * rms
        else:
            profile_of = {"ramp": ("ramp", 0), "peak": ("peak", 1), "first": ("first", 0), "recent": ("recent", 0)}
            q, k = qk(*(profile_of.get(kind) or ("look", int(kind[4:]))), neox=neox, theta=theta)
            for h in heads:
                wq[h * HD:(h + 1) * HD, CONST] = q * rms
            for grp in groups:
                wk[grp * HD:(grp + 1) * HD, CONST] = k * rms
        for j, grp in enumerate(groups):
            wv[grp * HD:grp * HD + wg, CODE.start + j * wg:CODE.start + (j + 1) * wg] = torch.eye(wg)
        for j, h in enumerate(heads):
            u = h % hpg  # the head's place in its group's slice
            start = out.start + j * wh
            wo[start:start + wh, h * HD + u * wh:h * HD + (u + 1) * wh] = torch.eye(wh) * rms
    if lookup and base == "ramp" and i == 0:
        wv[wg:wg + NID, ID] = torch.eye(NID)
        wo[SCRATCH, wg:wg + NID] = torch.eye(NID) * rms
    return {"q": wq, "k": wk, "v": wv, "o": wo}


def freqs(theta: float = THETA):
    import numpy as np

    return theta ** (-np.arange(0, HD, 2) / HD)


@functools.lru_cache(maxsize=None)
def profile(kind: str, delta: int = 0, theta: float = THETA):
    """Per RoPE pair j: (amplitude A_j, phase psi_j) of score(d) = sum_j A_j cos(d w_j + psi_j),
    from a linear program (least total amplitude, which bounds bf16's error): 'ramp' rises by
    STEP per position over 0..RAMP_SPAN; 'peak' is PEAK above every other d in 0..PEAK_SPAN.
    Solved once per process (every model of a target reads the same few profiles); the arrays
    are shared: read them, never write them."""
    import numpy as np
    from scipy.optimize import linprog

    w = freqs(theta)
    n = 2 * len(w)

    def basis(ds):
        ds = np.asarray(ds, dtype=float)[:, None]
        return np.concatenate([np.cos(ds * w), np.sin(ds * w)], 1)

    if kind == "ramp":
        b = basis(range(RAMP_SPAN + 1))
        g, margin = b[1:] - b[:-1], STEP
    elif kind == "look":  # delta ``delta``, else the oldest key up to it (one key at every position)
        b = basis(range(PEAK_SPAN + 1))
        g = np.vstack([b[1:delta + 1] - b[:delta], b[delta][None, :] - b[delta + 1:]])
        margin = np.concatenate([STEP * np.ones(delta), PEAK * np.ones(PEAK_SPAN - delta)])[:, None]
    elif kind == "first":  # a ramp over every position of a sequence
        b = basis(range(FIRST_SPAN + 1))
        g, margin = b[1:] - b[:-1], FIRST_STEP
    elif kind == "recent":  # delta 1 first, delta 2 second, each PEAK above what follows
        b = basis(range(PEAK_SPAN + 1))
        g, margin = np.vstack([b[1] - b[2], b[2][None, :] - np.delete(b, [1, 2], 0)]), PEAK
    else:
        b = basis(range(PEAK_SPAN + 1))
        g, margin = b[delta][None, :] - np.delete(b, delta, 0), PEAK
    eye = np.eye(n)
    a_ub = np.vstack([np.hstack([-g, np.zeros_like(g)]), np.hstack([eye, -eye]), np.hstack([-eye, -eye])])
    b_ub = np.concatenate([-(margin * np.ones((len(g), 1))).ravel(), np.zeros(2 * n)])
    res = linprog(np.concatenate([np.zeros(n), np.ones(n)]), A_ub=a_ub, b_ub=b_ub,
                  bounds=[(None, None)] * n + [(0, None)] * n, method="highs")
    assert res.status == 0, res.message
    c = res.x[:n]
    cos, sin = c[: len(w)], c[len(w):]
    return np.hypot(cos, sin), np.arctan2(-sin, cos)


def qk(kind: str, delta: int = 0, neox: bool = False, theta: float = THETA):
    """(q, k), 64 dims each, whose RoPE'd dot product times 1/sqrt(64) is the profile's score.
    Llama 4 (HF) pairs dims (2j, 2j+1); Llama's neox layout pairs (j, j + 32)."""
    import torch

    amp, psi = profile(kind, delta, theta)
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


def greedy(model, prompts: list, max_new: int, cache: bool = False) -> tuple:
    """Greedy continuation of equal-length prompts, the whole sequence recomputed every step (no
    cache; the checks' form: ``kv_perturbed`` acts on whole-sequence reads), or with ``cache``
    one new token a step through the model's own KV cache (transformers' ``past_key_values``;
    a model that takes none is recomputed): the same tokens about 30 times faster
    (``command.reference`` holds the two equal on the checks' requests). Returns (outputs,
    smallest relative logit margin of each request)."""
    import torch

    ids = torch.tensor(prompts)
    margins = torch.full((len(prompts),), float("inf"))
    cache = cache and takes_cache(model)
    past, feed, out = None, ids, []
    with torch.no_grad():
        for _ in range(max_new):
            if cache:
                step = model(input_ids=feed, past_key_values=past, use_cache=True, logits_to_keep=1)
                past = step.past_key_values
            else:
                step = model(input_ids=torch.cat([ids, *out], 1))
            logits = step.logits[:, -1].float()
            top = logits.topk(2, dim=-1).values
            margins = torch.minimum(margins, (top[:, 0] - top[:, 1]) / top[:, 0].abs().clamp_min(1e-9))
            feed = logits.argmax(-1, keepdim=True)
            out.append(feed)
    return (torch.cat(out, 1).tolist() if out else [[] for _ in prompts]), margins.tolist()


class OwnForward:
    """A target's own float32 forward (where transformers has no class for it) as a model
    ``greedy``, ``check`` and the acceptance emulation can call: ``forward(sd, ids, window,
    kv_hook, cache) -> (logits, hidden)`` on the weights ``sd`` (their dtype and device; the
    logits come back on the CPU). ``model(input_ids=...)`` recomputes; with ``use_cache`` it
    takes the ids after those of ``past_key_values`` (a list of per-layer caches, ``extend``),
    as transformers' models do. ``config.layer_types`` and ``kv_hook`` as ``check`` reads and
    sets them, ``state_dict`` as the acceptance emulation reads it."""

    def __init__(self, forward, sd: dict, window: int, layer_types):
        from types import SimpleNamespace

        self.own, self.sd, self.window, self.kv_hook = forward, sd, window, None
        self.config = SimpleNamespace(layer_types=list(layer_types))

    def __call__(self, input_ids, past_key_values=None, use_cache=False, logits_to_keep=0):
        from types import SimpleNamespace

        cache = (past_key_values if past_key_values is not None else []) if use_cache else None
        logits = self.own(self.sd, input_ids, self.window, self.kv_hook, cache)[0]
        return SimpleNamespace(logits=logits[:, -logits_to_keep:].cpu(), past_key_values=cache)

    def state_dict(self) -> dict:
        return dict(self.sd)


def layer_cache(cache, i: int):
    """Layer ``i``'s cache in ``OwnForward``'s list (created on first use), or None."""
    if cache is None:
        return None
    while len(cache) <= i:
        cache.append({})
    return cache[i]


def past_len(cache) -> int:
    """How many positions a layer's cache holds (its keys: [B, heads, positions, dims])."""
    return cache["k"].shape[2] if cache else 0


def extend(cache, k, v) -> tuple:
    """The layer's keys and values ([B, heads, positions, dims]) after the cached ones, which
    ``cache`` then holds (None: no cache, k and v as they are)."""
    import torch

    if cache is None:
        return k, v
    if cache:
        k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
    cache["k"], cache["v"] = k, v
    return k, v


def window_mask(start: int, t: int, window, device=None):
    """[t, start + t] bool: which keys the queries at positions start .. start + t - 1 may read
    (the cached ones first): causal, the last ``window`` keys (None: all)."""
    import torch

    d = torch.arange(start, start + t, device=device)[:, None] - torch.arange(start + t, device=device)[None, :]
    return (d >= 0) & (d < window) if window else d >= 0


def takes_cache(model) -> bool:
    """The model's forward takes transformers' KV cache arguments."""
    import inspect

    try:
        params = inspect.signature(getattr(model, "forward", model)).parameters
    except (TypeError, ValueError):
        return False
    return {"past_key_values", "use_cache", "logits_to_keep"} <= set(params)


def prompts(n: int, length: int, seed: int) -> list:
    """``n`` prompts of ``length`` token ids, the same for a seed everywhere (the first k of n
    are the k prompts of the same seed)."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(10, 2000) for _ in range(length)] for _ in range(n)]


D_PB, D_PA = slice(0, 64), slice(64, 128)  # the EAGLE3 draft's hidden coordinates
D_PC = slice(64, 128)  # (design_draft: the carried first-token vote)


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


def design_draft(voc: dict, g, ff: int) -> dict:
    """``eagle3_draft`` for a target of the every-layer design (``voc["layers"]``; 8 heads, 8 KV
    groups): its first step (the draft extend's last position) gives the target's own token, A
    from the target's lookahead (LOOK, or layer 0's read where the layer has none: a chunk
    start), B from its own read of the previous token (as ``eagle3_draft``), C (where a layer
    among the captured ones, 0-2, reads the first token) carried from the target's hidden state
    by ``fc``, or from A's code (a full layer that looks up the token layer 0 read); its decode
    steps give B and C and guess A's component 0 (A is then beyond what the target's hidden
    state holds: right 1 in 16).

    The hidden state it carries holds +-1 on 256 coordinates at every step (its norm is the same
    at the extend and at each decode step): D_PB (B), D_PC (C, or a constant where no C), D_A
    (A's code half, or a constant on its other half: no vote) and D_S (the staged lookahead, or
    a constant). The layer's heads 0-1 read the previous token's code; heads 2-7 attend delta 0
    and move D_S into D_A, cancel the carried B and put the constant into D_S."""
    import torch

    layers = voc["layers"]
    nh = nkv = 8
    c_layer = next((i for i, (vote, read) in enumerate(layers[:3]) if read == "first"), None)
    look = _look(layers[0][1])[1] is not None
    e_units = 72 + (NID if any(read == "lookup" for _, read in layers) else 0)
    rms_e, rms_h = math.sqrt(e_units / H), math.sqrt(256 / H)
    d_a, d_s = slice(128, 256), slice(256, 384)  # code half, constant half each
    ca, cs = slice(d_a.start, d_a.start + 64), slice(d_s.start, d_s.start + 64)
    na, ns = slice(d_a.start + 64, d_a.stop), slice(d_s.start + 64, d_s.stop)
    dq, dk, dv, do = torch.zeros(nh * HD, 2 * H), torch.zeros(nkv * HD, 2 * H), torch.zeros(nkv * HD, 2 * H), torch.zeros(H, nh * HD)
    for h in range(nh):
        q, k = qk("recent" if h < 2 else "peak", 0, neox=True)
        dq[h * HD:(h + 1) * HD, CONST] = q * rms_e
        dk[h * HD:(h + 1) * HD, CONST] = k * rms_e
    rows = []  # (v row over [embed | hidden] (already normalised), output coordinate, o scale)

    def hid(c):
        return {H + c: 1.0}
    for j in range(64):
        rows.append((hid(D_PB.start + j), D_PB.start + j, -rms_h))  # cancel the carried B
    for j in range(128):  # D_A += D_S - D_A
        rows.append(({H + d_s.start + j: 1.0, H + d_a.start + j: -1.0}, d_a.start + j, rms_h))
    for j in range(64):  # D_S: code half cleared, constant half set to 1
        rows.append((hid(cs.start + j), cs.start + j, -rms_h))
        rows.append(({H + ns.start + j: -1.0, CONST: rms_e / rms_h}, ns.start + j, rms_h))
    for h in range(2):  # the previous token's code onto D_PB, 32 coordinates each
        for j in range(32):
            c = h * 32 + j
            dv[h * HD + j, CODE.start + c] = 1.0
            do[D_PB.start + c, h * HD + j] = rms_e
    for n, (row, out, scale) in enumerate(rows):
        h, j = 2 + n % 6, n // 6
        for col, w in row.items():
            dv[h * HD + j, col] = w
        do[out, h * HD + j] = scale
    fc = torch.zeros(H, 3 * H)
    const = torch.full((64, 8), 1 / 8)  # 1 from the constant coordinates (aux block 0)
    src = LOOK if look else area(0)
    fc[cs, src] = torch.eye(64)
    fc[na, CONST:CONST + 8] = const
    fc[D_PB, CONST:CONST + 8] = const
    if c_layer is not None:
        fc[D_PC, c_layer * H + area(c_layer).start:c_layer * H + area(c_layer).stop] = torch.eye(HD)
    else:
        fc[D_PC, CONST:CONST + 8] = const
    dhead = torch.zeros(V, H)
    dhead[:, ca] = vote_rows(voc, "A")
    dhead[:, D_PB] = vote_rows(voc, "B")
    c_read = next((read for vote, read in layers if vote == "C"), None)
    if c_layer is not None:
        dhead[:, D_PC] = vote_rows(voc, "C")
    elif c_read == "lookup":  # a full layer that looks up the token layer 0 read: C from A's code
        dhead[:, ca] += vote_rows(voc, "C")
    # Where the carried hidden state holds no A (the decode steps: D_A's constant half is 1), the
    # draft guesses A's component 0 (and C's where C comes from A), 1/8 of a vote above the rest.
    guess = (component("A") == 0).float() + (c_read == "lookup") * (component("C") == 0).float()
    dhead[:, na] = LOGIT * 8 / 64 * guess[:, None]
    dhead[~product_tokens()] = 0.0  # below the draft's choice, which B and C always raise
    return {"fc.weight": fc, "embed_tokens.weight": voc["emb"], "lm_head.weight": dhead, "norm.weight": torch.ones(H),
            "midlayer.input_layernorm.weight": torch.ones(H), "midlayer.hidden_norm.weight": torch.ones(H),
            "midlayer.post_attention_layernorm.weight": torch.ones(H),
            "midlayer.self_attn.q_proj.weight": dq, "midlayer.self_attn.k_proj.weight": dk,
            "midlayer.self_attn.v_proj.weight": dv, "midlayer.self_attn.o_proj.weight": do,
            "midlayer.mlp.gate_proj.weight": torch.randn(ff, H, generator=g) * 0.1,
            "midlayer.mlp.up_proj.weight": torch.randn(ff, H, generator=g) * 0.1,
            "midlayer.mlp.down_proj.weight": torch.zeros(H, ff)}


DRAFT_HEADS = 8  # design_draft's query heads and KV groups (its config: eagle3_config(ff, 8, 8))


def eagle3_config(ff: int, nh: int, nkv: int) -> dict:
    """config.json of ``eagle3_draft``'s checkpoint (``LlamaForCausalLMEagle3``)."""
    return dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", vocab_size=V, draft_vocab_size=V,
                hidden_size=H, target_hidden_size=H, intermediate_size=ff, num_hidden_layers=1,
                num_attention_heads=nh, num_key_value_heads=nkv, head_dim=HD, max_position_embeddings=4096,
                rms_norm_eps=1e-5, rope_theta=THETA, rope_parameters={"rope_theta": THETA, "rope_type": "default"},
                hidden_act="silu", tie_word_embeddings=False, torch_dtype="bfloat16",
                eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})


def save_draft(root: str, target: str, draft: dict, ff: int, nh: int, nkv: int) -> str:
    """Writes ``target``'s EAGLE3 draft under ``root``, in a directory of its own: the selftest saves
    every target into one root, and a draft another target overwrote accepts nothing."""
    import json
    import os

    import torch
    from safetensors.torch import save_file

    path = os.path.join(root, f"{target}_eagle3_draft")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(eagle3_config(ff, nh, nkv), f, indent=1)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in draft.items()}, os.path.join(path, "model.safetensors"))
    return path


def layer_kinds(model) -> list:
    """Per decoder layer: "local" (a sliding window or a chunk) or "full", from the model's
    config (``layer_types``)."""
    return ["full" if t == "full_attention" else "local" for t in model.config.layer_types]


@contextlib.contextmanager
def kv_perturbed(model, fn):
    """Inside: every decoder layer's key and value projections (before RoPE and norms, [batch,
    positions, heads * dims]) pass through ``fn(layer, out) -> out``. transformers' models
    through forward hooks on ``layers.N.self_attn.{k,v}_proj``; a model of a target's own
    forward through its ``kv_hook`` attribute."""
    import re

    if hasattr(model, "kv_hook"):
        model.kv_hook = fn
        try:
            yield
        finally:
            model.kv_hook = None
        return
    handles = []
    for name, mod in model.named_modules():
        m = re.search(r"(?:^|\.)layers\.(\d+)\.self_attn$", name)
        if m:
            layer = int(m.group(1))
            for proj in (mod.k_proj, getattr(mod, "v_proj", None)):
                if proj is not None:
                    handles.append(proj.register_forward_hook(lambda _m, _i, out, layer=layer: fn(layer, out)))
    assert handles, "no attention projections found"
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def wrong_slot(kinds: list, prompt_len: int, size: int, max_new: int, n: int, seed: int, chunked: bool = False):
    """Check (b)'s fault: request r's keys and values at one position p_r are another token's
    (those of a random earlier prompt position) in every local layer, for every query: a cache
    slot written or read wrong. p_r is drawn from the slots a decode step reads (from
    prompt_len - size, or the first decode step's chunk start, to prompt_len + max_new - 3),
    less those no decode step weighs: the oldest key of a window is weighed by the step that
    has it oldest (none after the last), a chunk's first key by its chunk's steps, every key
    from the last prompt token on by the step after it (the previous token)."""
    import random

    rng = random.Random(seed)
    last = prompt_len + max_new - 2  # the last decode step's position
    lo = (prompt_len - 1) // size * size if chunked else prompt_len - size
    weighed = [p for p in range(max(lo, 1), last) if p >= prompt_len - 1 or (p % size == 0 if chunked else p + size - 1 <= last)]
    slots = [rng.choice(weighed) for _ in range(n)]
    sources = [rng.randrange(0, max(prompt_len - size, 1)) for _ in range(n)]

    def fn(layer, out):
        if kinds[layer] != "local":
            return out
        out = out.clone()
        for r, (p, src) in enumerate(zip(slots, sources)):
            if p < out.shape[1]:
                out[r, p] = out[r, src]
        return out
    return fn


def wrong_index_space(kinds: list, seed: int):
    """Check (c)'s fault: every full layer reads its keys and values through a wrong index space:
    request r's positions hold another request's (r + 1) keys and values in a shuffled order
    (one permutation per sequence length)."""
    import torch

    def fn(layer, out):
        if kinds[layer] != "full":
            return out
        n, t = out.shape[0], out.shape[1]
        perm = torch.randperm(t, generator=torch.Generator().manual_seed(seed * 100003 + t))
        return out[(torch.arange(n) + 1) % n][:, perm]
    return fn


CHECKS = (
    ("bf16", "bf16 gives float32's tokens on every request"),
    ("margin", f"the smallest relative logit margin is at least {MARGIN_FLOOR}"),
    ("size", "a {label} changed by one changes most outputs"),
    ("slot", "a wrong key and value at one in-{label} slot changes most outputs"),
    ("full", "the full-attention layers' reads decide: read through a wrong index space, most outputs change"),
)


def check_problems(row: dict, n: int, label: str = "window") -> list:
    """The failed checks of one ``check`` row of ``n`` requests, as printable texts (empty: the
    target passes): bf16 = float32 on every request; the smallest margin at or above
    MARGIN_FLOOR; each size off by one, the wrong slot and the wrong index space change more
    than half of the requests (a target without full layers fails the last: it has no full
    layer to prove)."""
    out = []
    if row.get("bf16_equal") != n:
        out.append(f"bf16 = float32 on {row.get('bf16_equal')}/{n} requests (must be all)")
    if not row.get("min_margin", 0) >= MARGIN_FLOOR:
        out.append(f"smallest relative logit margin {row.get('min_margin')} below the floor {MARGIN_FLOOR}")
    for key, value in sorted(row.items()):
        if key.startswith("changed_by_") and not 2 * value > n:
            size = key.rsplit("_", 1)[1]
            out.append(f"{label} {size} changes only {value}/{n} outputs (blind to its {label})")
    if not 2 * row.get("slot_changed", 0) > n:
        out.append(f"a wrong in-{label} slot changes only {row.get('slot_changed')}/{n} outputs")
    full = row.get("full_changed")
    if full is None:
        out.append("no full-attention layer: nothing shows a full layer's reads")
    elif not 2 * full > n:
        out.append(f"full layers read through a wrong index space change only {full}/{n} outputs")
    return out


def check(hf_model, size: int, label: str, seeds, n: int = 32, length: int = 130, max_new: int = 64,
          show=print) -> dict:
    """A readout target's checks, per prompt seed: ``hf_model(size, dtype=None)`` (transformers,
    float32 unless given) as the reference; ``bf16_equal``: requests whose bf16 tokens are the
    float32 ones; ``min_margin``: the smallest relative logit margin (floor MARGIN_FLOOR);
    ``changed_by_<label>_<size>``: requests changed by ``size`` - 1 and + 1 (the window or
    chunk); ``slot_changed``: requests changed by one wrong cached slot each (``wrong_slot``);
    ``full_changed``: requests changed when the full layers read through a wrong index space
    (``wrong_index_space``; None: no full layer); ``distinct`` outputs; ``problems``: the
    failed checks (``check_problems``). ``show`` (None: silent) gets one line per seed."""
    import json

    import torch

    ref32, bf16 = hf_model(size), hf_model(size, dtype=torch.bfloat16)
    near = {w: hf_model(w) for w in (size - 1, size + 1)}
    kinds = layer_kinds(ref32)
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
        with kv_perturbed(ref32, wrong_slot(kinds, length, size, max_new, n, s, chunked=label == "chunk")):
            other, _ = greedy(ref32, ps, max_new)
        row["slot_changed"] = sum(a != b for a, b in zip(ref, other))
        row["full_changed"] = None
        if "full" in kinds:
            with kv_perturbed(ref32, wrong_index_space(kinds, s)):
                other, _ = greedy(ref32, ps, max_new)
            row["full_changed"] = sum(a != b for a, b in zip(ref, other))
        row["problems"] = check_problems(row, n, label)
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


def mtp_agreement(target, seeds, n: int = 8, length: int = 130, max_new: int = 64, window: int = 16,
                  seed: int = 0, outputs=None) -> dict:
    """Per MTP step k of ``target`` (a target module with MTP layers: ``weights``, ``reference``,
    ``forward32``, ``mtp_forward32``, ``MTP_LAYERS``): the fraction of positions (whose token
    after next is a generated one) where the MTP's argmax (mtp_forward32, bf16-rounded weights) is the target's token there, on
    the reference sequences (prompt + float32 greedy output; ``outputs``: {seed: outputs},
    else the emulated reference)."""
    import torch

    sd, mtp = ({k: v.to(torch.bfloat16).float() for k, v in d.items()} for d in target.weights(seed, draft=True))
    outputs = outputs or target.reference(seeds, n, length, max_new, window, seed, emulate=True)
    hit, total = [0] * target.MTP_LAYERS, [0] * target.MTP_LAYERS
    with torch.no_grad():
        for s in seeds:
            seqs = torch.tensor([p + list(o) for p, o in zip(prompts(n, length, s), outputs[s][:n])])
            _, hidden = target.forward32(sd, seqs, window)
            for k in range(target.MTP_LAYERS):
                pred = target.mtp_forward32(sd, mtp, seqs, hidden, k, window).argmax(-1)
                first = length - k - 2  # position j predicts token j + k + 2, the first generated at length
                got = pred[:, first:first + seqs.shape[1] - length]
                hit[k] += int((got == seqs[:, length:]).sum())
                total[k] += got.numel()
    return {f"step_{k}": round(hit[k] / total[k], 4) for k in range(target.MTP_LAYERS)}
