"""CPU scenario of ``flashinfer_swa_prefill``: a real FlashInferAttnBackend (two wrappers, window
7) over a real SWAKVPool, a prefill (EXTEND) batch without a cached prefix whose prompts are
longer and shorter than the window, forward metadata built by sglang, and flashinfer's ragged
prefill wrapper recorded (plans and runs: ``window_left`` at plan time, which chooses the
kernel's window mask, and at run time). sglang's ``forward_extend`` runs for a sliding layer
and a full layer. Then the same batch is planned for paged-only prefill (``use_paged``, the
path of piecewise CUDA graphs). Right: the sliding layer's ragged prefill is planned and run
with the window (7), the full layer's with none (-1); the paged plans likewise.
``python -m sglang_swa_plugin.check.flashinfer_swa_prefill`` prints one JSON line."""

from __future__ import annotations

import functools

from . import Outcome, print_outcome

WINDOW = 7
PROMPTS = (20, 5, 13)  # longer than, shorter than, longer than the window
PREFIXED = ((20, 4), (6, 3), (13, 9))  # (tokens, of them extended): cached prefixes of 16, 3 and 4


class RaggedRecorder:
    """Stand-in for flashinfer's ``BatchPrefillWithRaggedKVCacheWrapper`` (its constructor and
    kernels need CUDA): records each plan's and run's ``window_left`` and returns zeros."""

    def __init__(self, *args, **kwargs):
        self.plans, self.runs = [], []

    def begin_forward(self, *args, window_left: int = -1, causal: bool = False, **kwargs):
        self.plans.append({"window_left": window_left, "causal": causal})

    plan = begin_forward

    def forward(self, q, k, v, causal: bool = False, window_left: int = -1, **kwargs):
        planned = self.plans[-1]["window_left"] if self.plans else None
        self.runs.append({"window_left": window_left, "planned": planned})
        return q.new_zeros(q.shape)

    def forward_return_lse(self, q, k, v, causal: bool = False, window_left: int = -1, **kwargs):
        out = self.forward(q, k, v, causal=causal, window_left=window_left)
        return out, q.new_zeros(q.shape[:-1])


def _cached_prefix_plan(backend, runner, alloc, rtt, sliding_plans) -> dict:
    """A ragged prefill with cached prefixes (PREFIXED: prompt and extend lengths): the sliding
    wrapper's paged plan as flashinfer gets it (kv ids, optional mask), turned into the (query,
    key) positions it lets each request's extend queries read, against the model's: keys of
    the prefix (written; the extend's own keys come from the ragged part) within the window."""
    import torch

    from . import testbed as tb

    tokens = [tb.alloc_tokens(alloc, n) for n, _ in PREFIXED]
    rows, _ = tb.fill_requests(rtt, tokens)
    fb = tb.make_forward_batch(runner, "extend", seq_lens=[n for n, _ in PREFIXED], req_pool_indices=rows,
                               extend_seq_lens=[e for _, e in PREFIXED],
                               out_cache_loc=torch.cat([t[n - e:] for t, (n, e) in zip(tokens, PREFIXED)]),
                               attn_backend=backend)
    sliding_plans.clear()
    backend.init_forward_metadata(fb)
    if not backend.forward_metadata.use_ragged or not sliding_plans:
        return {"error": {"right": False, "why": "no ragged prefill with a paged sliding plan"}}
    args, kwargs = sliding_plans[-1]
    kv_indptr, kv_indices, mask = args[1].tolist(), args[2].tolist(), kwargs.get("custom_mask")
    out, at = {}, 0
    for i, ((n, e), row) in enumerate(zip(PREFIXED, rows.tolist())):
        prefix = n - e
        position = {int(tb.translate(runner.token_to_kv_pool, rtt.req_to_token[row, j:j + 1])): j for j in range(n)}
        keys = [position.get(x, -1) for x in kv_indices[kv_indptr[i]:kv_indptr[i + 1]]]
        block = [1] * (e * len(keys)) if mask is None else mask[at:at + e * len(keys)].tolist()
        at += 0 if mask is None else e * len(keys)
        read = {(q, k) for qi, q in enumerate(range(prefix, n)) for ki, k in enumerate(keys) if block[qi * len(keys) + ki]}
        want = {(q, k) for q in range(prefix, n) for k in range(prefix) if k >= q - WINDOW}
        out[f"r{i}"] = {"right": read == want, "keys": keys[:3] + (["..."] if len(keys) > 3 else []),
                        "masked": mask is not None, "unwritten_keys_read": sorted({k for _, k in read - want if k >= prefix})}
    return out


def scenario() -> Outcome:
    """The ragged prefill of a sliding and a full layer of a real FlashInferAttnBackend, on a
    prefill without a cached prefix: the window it is planned and run with. ``seen``: per
    layer, the window_left of the plan and of the run, or an error."""
    import torch

    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.probe import optional_module, swapped

    from . import testbed as tb
    from .flashinfer_swa_verify import kernel_twins

    module = "sglang.srt.layers.attention.flashinfer_backend"
    fi = optional_module(module)
    if fi is None or not hasattr(fi, "FlashInferAttnBackend"):
        raise ScenarioUnavailable(f"this sglang has no {module}.FlashInferAttnBackend")
    pool = tb.make_swa_pool(size=256, size_swa=128)
    alloc = tb.make_swa_allocator(pool)
    tb.diverge(alloc, 11)
    rtt = tb.make_req_to_token_pool(size=8, max_context_len=64)
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtt, sliding_window_size=WINDOW,
                                  attention_backend="flashinfer")
    made = []

    def recorder(*args, **kwargs):
        made.append(RaggedRecorder(*args, **kwargs))
        return made[-1]

    with kernel_twins(), tb.cpu_backend_patches(), swapped(fi, "BatchPrefillWithRaggedKVCacheWrapper", recorder):
        backend = fi.FlashInferAttnBackend(runner)
        paged_plans, sliding_plans = {0: [], 1: []}, []

        def record(*a, _wid, **k):
            paged_plans[_wid].append(k.get("window_left", -1))
            if _wid == 0:
                sliding_plans.append((a, k))

        for wid, w in enumerate(backend.prefill_wrappers_paged):
            w.begin_forward = functools.partial(record, _wid=wid)
        tokens = [tb.alloc_tokens(alloc, n) for n in PROMPTS]
        rows, _ = tb.fill_requests(rtt, tokens)
        fb = tb.make_forward_batch(runner, "extend", seq_lens=list(PROMPTS), req_pool_indices=rows,
                                   extend_seq_lens=list(PROMPTS), out_cache_loc=torch.cat(tokens), attn_backend=backend)
        backend.init_forward_metadata(fb)
        if not backend.forward_metadata.use_ragged:
            raise ScenarioUnavailable(f"this prefill does not take {module}'s ragged path here")
        seen = {}
        n = sum(PROMPTS)
        for name, layer in (("sliding", tb.swa_layer(pool, runner)), ("full", tb.full_layer(pool, runner))):
            heads, dim = layer.tp_q_head_num, layer.head_dim
            q = torch.randn(n, heads * dim)
            k = torch.randn(n, layer.tp_k_head_num, dim)
            v = torch.randn(n, layer.tp_v_head_num, dim)
            before = {id(r): len(r.runs) for r in made}
            try:
                backend.forward_extend(q, k, v, layer, fb)
            except Exception as e:  # noqa: BLE001 - a crash is an outcome
                seen[name] = {"error": f"{type(e).__name__}: {e}"}
                continue
            runs = [r.runs[-1] for r in made if len(r.runs) > before[id(r)]]
            seen[name] = runs[0] if len(runs) == 1 else {"error": f"{len(runs)} ragged runs"}
        seen["prefix"] = _cached_prefix_plan(backend, runner, alloc, rtt, sliding_plans)
        # paged-only prefill (what piecewise CUDA graphs and SGLANG_FLASHINFER_USE_PAGED take;
        # 0.5.10 has no use_paged: deterministic inference takes the same path)
        setattr(backend, "use_paged" if hasattr(backend, "use_paged") else "enable_deterministic", True)
        for plans in paged_plans.values():
            plans.clear()
        backend.init_forward_metadata(fb)
        seen["paged_plan"] = {"sliding": paged_plans[0][-1:], "full": paged_plans[1][-1:],
                              "use_ragged": backend.forward_metadata.use_ragged}
    want = {"sliding": WINDOW, "full": -1}
    bug = any("error" in seen[k] or seen[k]["window_left"] != w or seen[k]["planned"] != w for k, w in want.items())
    bug |= seen["paged_plan"]["sliding"] != [WINDOW] or seen["paged_plan"]["full"] != [-1]
    bug |= not all(r["right"] for r in seen["prefix"].values())
    return Outcome(bug, seen)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
