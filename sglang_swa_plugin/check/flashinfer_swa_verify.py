"""CPU scenario of ``flashinfer_swa_verify``: a real FlashInferAttnBackend (two wrappers) over a
real SWAKVPool whose full and SWA index spaces differ, a real EAGLE verify batch (chain or
tree mask) with prefixes longer and shorter than the window, forward metadata built by
sglang, the wrappers' plan calls recorded. For every request and draft row it compares the
set of KV slots the kernel would attend to (kv indices where the row's custom-mask bit is
on, mask laid out as flashinfer reads it: q_len x kv_len per request) with what windowed
causal attention needs: the prefix positions ``[p - window, p)`` and the row's tree
ancestors, in SWA space for the sliding wrapper and full space for the full one.

sglang's Triton gather ``create_flashinfer_kv_indices_triton`` and the fix's own mask
kernel cannot run on a CPU (not even under ``TRITON_INTERPRET=1``: the interpreter rejects
their loop bounds), so on CPU the scenario swaps in torch twins of their contracts:
:class:`KvIndicesTwin` (rows of ``req_to_token`` from ``kv_start_idx`` or 0,
``page_kernel_lens`` long, packed at ``kv_indptr``) and :func:`mask_twin` (the re-laid
verify mask, element by element the rule the kernel implements; the GPU tests compare the
two). On a GPU the real kernels run. ``python -m sglang_swa_plugin.check.flashinfer_swa_verify``
prints one JSON line.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys

from . import Outcome
from .testbed import ancestors

WINDOW = 7  # sglang's sliding_window_size (= sliding_window - 1 = flashinfer's window_left)
PREFIXES = (20, 5, 13, 8)  # longer than, shorter than, longer than and just past the window


class KvIndicesTwin:
    """``create_flashinfer_kv_indices_triton[grid](...)`` in torch (CPU only), with the
    translator form's keywords (0.5.22+): a page-granular source table
    (``ENTRY_PAGE_SIZE``) and a fused id remap (``token_mapping``); any token-block
    grid gives the same stream."""

    def __getitem__(self, grid):
        def run(req_to_token, req_pool_indices, page_kernel_lens, kv_indptr, kv_start_idx, kv_indices, stride,
                ENTRY_PAGE_SIZE=1, TOKEN_BLOCK_PARALLEL=False, token_mapping=None):
            import torch

            for b in range(int(grid[0])):
                start = int(kv_start_idx[b]) if kv_start_idx is not None else 0
                n, off = int(page_kernel_lens[b]), int(kv_indptr[b])
                row = req_to_token[int(req_pool_indices[b])]
                pos = torch.arange(start, start + n, device=row.device)
                data = row[pos // ENTRY_PAGE_SIZE].to(torch.int64) * ENTRY_PAGE_SIZE + pos % ENTRY_PAGE_SIZE
                if token_mapping is not None:
                    data = torch.where(data >= 0, token_mapping[data.clamp(min=0)].to(torch.int64), -1)
                kv_indices[off:off + n] = data.to(kv_indices.dtype)
        return run


def mask_twin(tree_mask, prefix_kept, kv_start, draft_token_num: int, window: int, kept_sum: int):
    """``flashinfer_swa_verify.windowed_verify_mask`` (a Triton kernel) in torch ops: the verify
    mask for keys ``[seq_len - L, seq_len + q_len)`` of each request, from sglang's
    full-prefix tree mask (``q_len x (seq_len + q_len)`` per request, flattened).
    ``prefix_kept`` is L per request, ``kv_start`` is ``seq_len - L``, ``kept_sum`` the host
    sum of L. Row i (tree depth d_i) sees prefix column c iff ``c >= L + d_i - window`` and
    draft column j iff its tree bit is set and ``d_j >= d_i - window``."""
    import torch

    n = int(draft_token_num)
    dev = prefix_kept.device
    L = prefix_kept.to(torch.int64)
    P = kv_start.to(torch.int64) + L
    bs = L.numel()
    new_row = L + n
    new_end = torch.cumsum(n * new_row, 0)
    new_off = new_end - n * new_row
    old_row = P + n
    old_off = torch.cumsum(n * old_row, 0) - n * old_row
    flat = tree_mask.reshape(-1)
    ar = torch.arange(n, device=dev)
    # The draft block of the stock mask: [bs, row, draft column].
    idx = old_off.view(-1, 1, 1) + ar.view(1, -1, 1) * old_row.view(-1, 1, 1) + P.view(-1, 1, 1) + ar.view(1, 1, -1)
    if flat.numel() == 0:
        tree = torch.ones(bs, n, n, dtype=torch.bool, device=dev)
    else:
        tree = flat[idx.clamp_(0, flat.numel() - 1)].to(torch.bool)  # padded graph rows: any bits
    depth = tree.sum(-1) - 1
    t = torch.arange(n * kept_sum + n * n * bs, device=dev)
    req = torch.searchsorted(new_end, t, right=True)
    local = t - new_off[req]
    width = new_row[req]
    row = local // width
    col = local - row * width
    kept = L[req]
    d_row = depth[req, row]
    j = (col - kept).clamp(0, n - 1)
    draft_ok = tree[req, row, j] & (depth[req, j] >= d_row - window)
    return torch.where(col < kept, col >= kept + d_row - window, draft_ok)


_GATHER_MODULES = ("sglang.srt.speculative.eagle_info", "sglang.srt.layers.attention.flashinfer_backend",
                   "sglang.srt.mem_cache.kv_index_translator")


def kernel_twins():
    """Swap the Triton gather and the fix's mask kernel for their torch twins where no GPU is present (undone on exit)."""
    import contextlib

    import torch

    from sglang_swa_plugin.probe import optional_module, swapped

    stack = contextlib.ExitStack()
    if not torch.cuda.is_available():
        from sglang_swa_plugin.hooks import flashinfer_swa_verify as fix

        stack.enter_context(swapped(fix, "windowed_verify_mask", mask_twin))
        for name in _GATHER_MODULES:
            mod = optional_module(name)
            if mod is not None and hasattr(mod, "create_flashinfer_kv_indices_triton"):
                stack.enter_context(swapped(mod, "create_flashinfer_kv_indices_triton", KvIndicesTwin()))
    return stack


def tree_parents(topk: int, n: int):
    """Parent of each draft row (row 0 is the verified token, the root): a chain for
    topk 1; for topk 2 a tree whose siblings share a depth (rows 1,2 at depth 1; 3,4 under
    row 1 at depth 2; ...), so row index and depth differ."""
    if topk == 1:
        return [-1] + list(range(n - 1))
    parents = [-1]
    frontier = [0]
    while len(parents) < n:
        nxt = []
        for p in frontier:
            for _ in range(topk):
                if len(parents) < n:
                    parents.append(p)
                    nxt.append(len(parents) - 1)
        frontier = nxt[:1]  # EAGLE expands the best branch
    return parents


def build(topk: int, page_size: int = 1):
    import torch

    from . import testbed as tb

    fi = importlib.import_module("sglang.srt.layers.attention.flashinfer_backend")
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    n = 4 if topk == 1 else 6
    num_steps = n - 1 if topk == 1 else 3
    pool = tb.make_swa_pool(size=256, size_swa=128, page_size=page_size)
    alloc = tb.make_swa_allocator(pool)
    tb.diverge(alloc, 11)
    rtt = tb.make_req_to_token_pool(size=8, max_context_len=64)
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtt, spec_algorithm="EAGLE",
                                  topk=topk, num_steps=num_steps, num_draft_tokens=n, sliding_window_size=WINDOW,
                                  attention_backend="flashinfer", page_size=page_size)
    with tb.cpu_backend_patches():
        backend = fi.FlashInferAttnBackend(runner)
    plans = {}
    for wid, w in enumerate(backend.prefill_wrappers_verify):
        def record(qo_indptr, kv_indptr, kv_indices, last_page_len, *a, wid=wid, **kw):
            plans[wid] = dict(qo=qo_indptr.clone(), kv=kv_indptr.clone(), idx=kv_indices.clone(),
                              mask=None if kw.get("custom_mask") is None else kw["custom_mask"].clone())
        w.begin_forward = record
    parents = tree_parents(topk, n)
    tokens, drafts = [], []
    for P in PREFIXES:
        t = tb.alloc_tokens(alloc, P + n)
        tokens.append(t)
        drafts.append(t[P:])
    rows, _ = tb.fill_requests(rtt, tokens)
    seq = torch.tensor(PREFIXES, dtype=torch.int64)
    depth = [len(ancestors(parents, i)) - 1 for i in range(n)]
    parts = []
    for P in PREFIXES:  # sglang's full-prefix tree mask: q_len x (seq_len + q_len) per request
        m = torch.zeros(n, P + n, dtype=torch.bool)
        m[:, :P] = True
        for i in range(n):
            for a in ancestors(parents, i):
                m[i, P + a] = True
        parts.append(m.view(-1))
    required = [f.name for f in dataclasses.fields(EagleVerifyInput)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    values = dict(draft_token=torch.zeros(len(PREFIXES) * n, dtype=torch.int64), custom_mask=torch.cat(parts),
                  positions=torch.cat([P + torch.tensor(depth) for P in PREFIXES]), retrive_index=None,
                  retrive_next_token=None, retrive_next_sibling=None, retrive_cum_len=None, spec_steps=num_steps,
                  topk=topk, draft_token_num=n, capture_hidden_mode=None, seq_lens_sum=int(seq.sum()),
                  seq_lens_cpu=seq.clone())
    fields = {f.name for f in dataclasses.fields(EagleVerifyInput)}
    spec = EagleVerifyInput(**{**dict.fromkeys(required), **{k: v for k, v in values.items() if k in fields}})
    fb = tb.make_forward_batch(runner, "target_verify", seq_lens=seq, req_pool_indices=rows, spec_info=spec,
                               num_tokens_per_req=n, out_cache_loc=torch.cat(drafts), attn_backend=backend)
    return dict(backend=backend, fb=fb, plans=plans, pool=pool, tokens=tokens, parents=parents, depth=depth, n=n)


def seen_and_wanted(s):
    """Per wrapper (0 sliding, 1 full): per request and row, (slots the kernel sees, slots
    windowed causal attention needs)."""
    from . import testbed as tb

    out = {}
    for wid, plan in s["plans"].items():
        qo, kv, idx, mask = plan["qo"].tolist(), plan["kv"].tolist(), plan["idx"], plan["mask"]
        flat = mask.reshape(-1).tolist()
        off = 0
        rows = []
        for b, P in enumerate(PREFIXES):
            q_len, kv_len = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
            keys = idx[kv[b]:kv[b + 1]].tolist()
            toks = s["tokens"][b]
            space = (lambda x: tb.translate(s["pool"], x).tolist()) if wid == 0 else (lambda x: x.tolist())
            for i in range(q_len):
                bits = flat[off + i * kv_len: off + (i + 1) * kv_len]
                seen = sorted(k for k, on in zip(keys, bits) if on)
                p = P + s["depth"][i]
                lo = max(0, p - WINDOW) if wid == 0 else 0
                need = [toks[k] for k in range(lo, P)] + [toks[P + a] for a in ancestors(s["parents"], i)]
                wanted = sorted(space(__import__("torch").stack(need)))
                rows.append((b, i, seen, wanted))
            off += q_len * kv_len
        out[wid] = rows
    return out


def run(topk: int, fix_on: bool, page_size: int = 1) -> dict:
    """{"error": ...} or {"sliding": [bad rows], "full": [bad rows], "rows": total}."""
    from sglang_swa_plugin.core import temporarily_installed
    from sglang_swa_plugin.hooks.flashinfer_swa_verify import FIX

    # Installed before the backend is built, as at server start: the updater binds its
    # ``update`` method in its constructor.
    with kernel_twins(), temporarily_installed(*([FIX] if fix_on else [])):
        s = build(topk, page_size)
        try:
            s["backend"].init_forward_metadata(s["fb"])
        except Exception as e:  # noqa: BLE001 - the crash form
            return {"error": f"{type(e).__name__}: {e}"}
    got = seen_and_wanted(s)
    bad = {name: [(b, i) for b, i, seen, want in got[wid] if seen != want] for wid, name in ((0, "sliding"), (1, "full"))}
    return dict(bad, rows=len(got[0]))


def scenario() -> Outcome:
    """a real FlashInferAttnBackend (two wrappers) over a real SWAKVPool whose index spaces
    differ, an EAGLE tree-verify batch (topk 2) with prefixes past the window: does every
    sliding-window row attend to exactly its window and tree ancestors. ``seen``: the rows
    that do not, or the start-up error."""
    got = run(2, fix_on=False)  # ``check`` installs the fix around this call
    return Outcome(bool(got.get("error") or got.get("sliding") or got.get("full")), got)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    cases = [(1, False), (1, True), (2, False), (2, True)]
    print("RESULT=" + json.dumps({f"topk{k}_{'fix' if f else 'stock'}": run(k, f) for k, f in cases}))
    sys.stdout.flush()
