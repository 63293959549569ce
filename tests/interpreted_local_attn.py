"""``triton_local_attn`` through sglang's own Triton kernels on the CPU (run with
``TRITON_INTERPRET=1``; harness: tests/interpreted.py): a Llama 4 chunked layer on a real
TritonAttnBackend over a real SWAKVPool whose index spaces differ, in a plain extend whose
requests cross a chunk boundary, a decode batch, a chain's target verify (topk 1) and an EAGLE
tree's (topk 2, two shapes). The model: a query at
position ``p`` attends the keys of ``p``'s chunk up to ``p`` (in a tree, of its ancestors)."""

from __future__ import annotations

import importlib
import os

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from sglang_swa_plugin.check import triton_local_attn as sc  # noqa: E402
from sglang_swa_plugin.hooks import triton_local_attn as tla  # noqa: E402

from interpreted import Batch, main, tree_verify_error  # noqa: E402

C = sc.CHUNK
VERIFY_LENS = (14, 6, 3, 16)  # drafts from 14 and 6 cross a chunk boundary, from 3 do not, from 16 start one
TREES = {"verify-chain": (-1, 0, 1, 2), "verify-tree-depth2": (-1, 0, 0, 1), "verify-tree-depth3": (-1, 0, 0, 1, 2, 3)}


def same_chunk(p: int, t: int) -> bool:
    return p // C == t // C


def batch_of(env, cached_lens, new) -> Batch:
    return Batch(env.runner, env.rows, env.pool, env.layer, cached_lens, new, same_chunk)


def extend() -> float:
    env = sc.build()
    prefixes, extends = sc.PREFIXES, sc.EXTENDS
    new = [(b, p + i, list(range(sum(extends[:b]), sum(extends[:b]) + i + 1)))
           for b, (p, e) in enumerate(zip(prefixes, extends)) for i in range(e)]
    batch = batch_of(env, prefixes, new)
    fb = env.tb.make_forward_batch(env.runner, "extend", req_pool_indices=env.rows[:3], attn_backend=env.backend,
                                   seq_lens=[p + e for p, e in zip(prefixes, extends)], extend_seq_lens=list(extends))
    env.backend.init_forward_metadata(fb)
    return batch.error(env.backend.forward_extend(batch.q, batch.k, batch.v, env.layer, fb, save_kv_cache=True))


def decode() -> float:
    env, lens = sc.build(), sc.DECODE_LENS
    batch = batch_of(env, [m - 1 for m in lens], [(b, m - 1, [b]) for b, m in enumerate(lens)])
    rtt = env.runner.req_to_token_pool.req_to_token  # the new token's key goes to its own slot
    fb = env.tb.make_forward_batch(env.runner, "decode", req_pool_indices=env.rows, seq_lens=list(lens),
                                   attn_backend=env.backend,
                                   out_cache_loc=[int(rtt[int(r), m - 1]) for r, m in zip(env.rows, lens)])
    env.backend.init_forward_metadata(fb)
    return batch.error(env.backend.forward_decode(batch.q, batch.k, batch.v, env.layer, fb, save_kv_cache=True))


def verify(parent) -> float:
    env = sc.build(drafts=len(parent))
    return tree_verify_error(env, env.layer, VERIFY_LENS, parent, same_chunk)


if __name__ == "__main__":
    methods = {importlib.import_module(tla.MODULE).TritonAttnBackend: ("__init__", "forward_decode", "forward_extend")}
    paths = {"extend": extend, "decode": decode,
             **{name: (lambda parent=parent: verify(parent)) for name, parent in TREES.items()}}
    main(tla.FIX, methods, paths)
