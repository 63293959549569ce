"""A Llama 4 chunked layer on triton run through sglang's own Triton kernels on the CPU (Triton's
interpreter: run with ``TRITON_INTERPRET=1``), on a real TritonAttnBackend over a real SWAKVPool
whose index spaces differ (float32), stock and with ``triton_local_attn`` (its preview
``triton_local_attn_tree`` on): a plain extend whose requests cross a chunk boundary, a decode
batch, a chain's target verify (topk 1) and an EAGLE tree's (topk 2, two shapes). Each output row
is held against the model's attention computed here in torch: a query at position ``p`` attends
the keys of ``p``'s chunk up to ``p`` (in a tree: its ancestors among the drafts). Prints one JSON
line per seed (``SEEDS``, comma list) and path: the largest difference from the model, stock and
fixed. Run by tests/test_triton_local_attn.py in a child process."""

from __future__ import annotations

import importlib
import json
import os

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402

from sglang_swa_plugin.check import testbed  # noqa: E402
from sglang_swa_plugin.check import triton_local_attn as sc  # noqa: E402
from sglang_swa_plugin.check.fa3_spec_translate import verify_input  # noqa: E402
from sglang_swa_plugin.hooks import triton_local_attn as tla  # noqa: E402

from helpers import fixed_alone, methods_alone  # noqa: E402

C = sc.CHUNK
VERIFY_LENS = (14, 6, 3, 16)  # drafts from 14 and 6 cross a chunk boundary, from 3 do not, from 16 start one
# parent of each draft token (-1: the root, the last verified token); a chain is topk 1
PATHS = {"verify-chain": (-1, 0, 1, 2), "verify-tree-depth2": (-1, 0, 0, 1), "verify-tree-depth3": (-1, 0, 0, 1, 2, 3),
         "extend": None, "decode": None}


def ancestors(parent, i) -> set:
    out = set()
    while i >= 0:
        out.add(i)
        i = parent[i]
    return out


def float32_pool():
    make = testbed.make_swa_pool
    return lambda *a, **kw: make(*a, **{**kw, "dtype": torch.float32})


class Batch:
    """The requests' cached keys (written at their SWA slots), and per new token its request, its
    position and the new tokens it attends besides the cached ones."""

    def __init__(self, env, cached_lens, new):
        self.env, self.cached, self.new = env, [], new  # new: [(request, position, [new token rows seen])]
        layer, pool = env.layer, env.pool
        kv_heads, dim = layer.tp_k_head_num, layer.qk_head_dim
        k_buf, v_buf = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
        for b, m in enumerate(cached_lens):
            row = env.runner.req_to_token_pool.req_to_token[int(env.rows[b]), :m].long()
            slots = pool.translate_loc_from_full_to_swa(row).long()
            k_buf[slots], v_buf[slots] = torch.randn(m, kv_heads, dim), torch.randn(m, kv_heads, dim)
            self.cached.append((k_buf[slots].clone(), v_buf[slots].clone()))
        self.q = torch.randn(len(new), layer.tp_q_head_num * dim)
        self.k, self.v = torch.randn(len(new), kv_heads, dim), torch.randn(len(new), kv_heads, dim)

    def model(self):
        layer = self.env.layer
        heads, dim, group = layer.tp_q_head_num, layer.qk_head_dim, layer.tp_q_head_num // layer.tp_k_head_num
        out = torch.zeros(len(self.new), heads, dim)
        for r, (b, p, seen) in enumerate(self.new):
            keep = [t for t in range(len(self.cached[b][0])) if t // C == p // C]
            rows = [s for s in seen if self.new[s][1] // C == p // C]
            keys = torch.cat([self.cached[b][0][keep], self.k[rows]])
            values = torch.cat([self.cached[b][1][keep], self.v[rows]])
            query = self.q[r].view(heads, dim)
            for h in range(heads):
                weights = torch.softmax(keys[:, h // group] @ query[h] * layer.scaling, dim=0)
                out[r, h] = weights @ values[:, h // group]
        return out


def run(path: str, seed: int):
    """(the backend's output, the model's) for one path, on the backend as the block installs it."""
    torch.manual_seed(seed)
    parent = PATHS[path]
    env = sc.build(drafts=len(parent) if parent else sc.DRAFTS)
    be, tb = env.backend, env.tb
    if path == "extend":
        prefixes, extends = sc.PREFIXES, sc.EXTENDS
        new = [(b, p + i, [j for j in range(sum(extends[:b]), sum(extends[:b]) + i + 1)])
               for b, (p, e) in enumerate(zip(prefixes, extends)) for i in range(e)]
        batch = Batch(env, prefixes, new)
        fb = tb.make_forward_batch(env.runner, "extend", req_pool_indices=env.rows[:3],
                                   seq_lens=[p + e for p, e in zip(prefixes, extends)], extend_seq_lens=list(extends),
                                   attn_backend=be)
        call = "extend"
    elif path == "decode":
        lens = sc.DECODE_LENS
        batch = Batch(env, [m - 1 for m in lens], [(b, m - 1, [b]) for b, m in enumerate(lens)])
        rtt = env.runner.req_to_token_pool.req_to_token
        fb = tb.make_forward_batch(env.runner, "decode", req_pool_indices=env.rows, seq_lens=list(lens), attn_backend=be,
                                   out_cache_loc=[int(rtt[int(r), m - 1]) for r, m in zip(env.rows, lens)])
        call = "decode"
    else:
        n = len(parent)
        depth = [len(ancestors(parent, i)) - 1 for i in range(n)]
        new = [(b, m + depth[i], [b * n + a for a in sorted(ancestors(parent, i))])
               for b, m in enumerate(VERIFY_LENS) for i in range(n)]
        batch = Batch(env, VERIFY_LENS, new)
        tree = torch.tensor([[k in ancestors(parent, i) for k in range(n)] for i in range(n)])
        mask = torch.cat([torch.cat([torch.ones(n, m, dtype=torch.bool), tree], 1).flatten() for m in VERIFY_LENS])
        positions = torch.tensor([p for _, p, _ in new])
        topk = 1 if path == "verify-chain" else 2
        fb = tb.make_forward_batch(env.runner, "target_verify", req_pool_indices=env.rows[: len(VERIFY_LENS)],
                                   seq_lens=list(VERIFY_LENS), num_tokens_per_req=n, attn_backend=be,
                                   spec_info=verify_input(mask, list(VERIFY_LENS), topk, n, positions))
        fb.positions = positions  # as sglang's ForwardBatch takes the verify input's
        call = "extend"
    be.init_forward_metadata(fb)
    out = getattr(be, f"forward_{call}")(batch.q, batch.k, batch.v, env.layer, fb, save_kv_cache=True)
    return out.view(len(batch.new), -1, env.layer.qk_head_dim), batch.model()


def main() -> None:
    testbed.make_swa_pool = float32_pool()
    methods = {importlib.import_module(tla.MODULE).TritonAttnBackend: ("__init__", "forward_decode", "forward_extend")}
    for seed in (int(s) for s in os.environ.get("SEEDS", "0").split(",")):
        for path in PATHS:
            got = {}
            for side, block in (("stock", methods_alone), ("fixed", fixed_alone)):
                tla.FIX.previews_on = frozenset({tla.TREE} if side == "fixed" else ())  # the preview on
                with block(tla.FIX, methods):
                    out, model = run(path, seed)
                got[side] = float((out - model).abs().max())
            print(json.dumps({"seed": seed, "path": path, **got}), flush=True)


if __name__ == "__main__":
    main()
