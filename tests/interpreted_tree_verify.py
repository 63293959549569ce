"""A Llama 4 chunked layer's EAGLE tree verify (topk 2) run through sglang's own Triton extend
kernel on the CPU (Triton's interpreter: run with ``TRITON_INTERPRET=1``), on a real
TritonAttnBackend over a real SWAKVPool whose index spaces differ (float32), stock and with
``triton_local_attn`` and its preview ``triton_local_attn_tree`` on. Each output row is held
against the model's attention computed here in torch: a draft at position ``p`` attends the
cached keys of ``p``'s chunk and its tree ancestors in that chunk. Prints one JSON line per seed
(``SEEDS``, comma list) and tree: the largest difference from the model, stock and fixed. Run
by tests/test_triton_local_attn.py in a child process."""

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
LENS = (14, 6, 3, 16)  # drafts from 14 and 6 cross a chunk boundary, from 3 do not, from 16 start one
TREES = {"topk2-depth2": (-1, 0, 0, 1), "topk2-depth3": (-1, 0, 0, 1, 2, 3)}  # parent of each draft (-1: root)


def ancestors(parent, i) -> set:
    out = set()
    while i >= 0:
        out.add(i)
        i = parent[i]
    return out


def depth(parent, i) -> int:
    return len(ancestors(parent, i)) - 1


def float32_pool():
    make = testbed.make_swa_pool
    return lambda *a, **kw: make(*a, **{**kw, "dtype": torch.float32})


def run(parent, seed: int) -> "tuple[torch.Tensor, torch.Tensor]":
    """(the backend's output, the model's) for one tree, on the backend as the block installs it."""
    torch.manual_seed(seed)
    n = len(parent)
    env = sc.build(drafts=n)
    be, layer, pool = env.backend, env.layer, env.pool
    rows = env.rows[: len(LENS)]
    tree = torch.tensor([[k in ancestors(parent, i) for k in range(n)] for i in range(n)])
    mask = torch.cat([torch.cat([torch.ones(n, m, dtype=torch.bool), tree], 1).flatten() for m in LENS])
    positions = torch.cat([torch.tensor([m + depth(parent, i) for i in range(n)]) for m in LENS])
    fb = env.tb.make_forward_batch(env.runner, "target_verify", req_pool_indices=rows, seq_lens=list(LENS),
                                   spec_info=verify_input(mask, list(LENS), 2, n, positions), attn_backend=be,
                                   num_tokens_per_req=n)
    fb.positions = positions  # as sglang's ForwardBatch takes the verify input's
    heads, kv_heads, dim = layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim
    k_buf, v_buf = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
    cached = []
    for b, m in enumerate(LENS):  # the requests' keys, written at their SWA slots
        slots = pool.translate_loc_from_full_to_swa(env.runner.req_to_token_pool.req_to_token[int(rows[b]), :m].long())
        k_buf[slots.long()], v_buf[slots.long()] = torch.randn(m, kv_heads, dim), torch.randn(m, kv_heads, dim)
        cached.append((k_buf[slots.long()].clone(), v_buf[slots.long()].clone()))
    q = torch.randn(len(LENS) * n, heads * dim)
    k, v = torch.randn(len(LENS) * n, kv_heads, dim), torch.randn(len(LENS) * n, kv_heads, dim)
    be.init_forward_metadata(fb)
    out = be.forward_extend(q, k, v, layer, fb, save_kv_cache=True).view(-1, heads, dim)

    model = torch.zeros_like(out)
    group = heads // kv_heads
    for b, m in enumerate(LENS):
        for i in range(n):
            p = m + depth(parent, i)
            keep = [t for t in range(m) if t // C == p // C]
            drafts = [b * n + a for a in sorted(ancestors(parent, i)) if (m + depth(parent, a)) // C == p // C]
            keys = torch.cat([cached[b][0][keep], k[drafts]])
            values = torch.cat([cached[b][1][keep], v[drafts]])
            query = q[b * n + i].view(heads, dim)
            for h in range(heads):
                weights = torch.softmax(keys[:, h // group] @ query[h] * layer.scaling, dim=0)
                model[b * n + i, h] = weights @ values[:, h // group]
    return out, model


def main() -> None:
    testbed.make_swa_pool = float32_pool()
    methods = {importlib.import_module(tla.MODULE).TritonAttnBackend: ("__init__", "forward_decode", "forward_extend")}
    for seed in (int(s) for s in os.environ.get("SEEDS", "0").split(",")):
        for name, parent in TREES.items():
            got = {}
            for side, block in (("stock", methods_alone), ("fixed", fixed_alone)):
                tla.FIX.previews_on = frozenset({tla.TREE} if side == "fixed" else ())  # the preview on
                with block(tla.FIX, methods):
                    out, model = run(parent, seed)
                got[side] = float((out - model).abs().max())
            print(json.dumps({"seed": seed, "tree": name, **got}), flush=True)


if __name__ == "__main__":
    main()
