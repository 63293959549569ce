"""``triton_swa_window`` through sglang's own Triton decode kernel on the CPU (run with
``TRITON_INTERPRET=1``; harness: tests/interpreted.py): a sliding-window layer (window 7) on a
real TritonAttnBackend over a real SWAKVPool whose index spaces differ, a decode batch of
requests longer and shorter than the window. The model: a query at position ``p`` attends the
keys ``t`` with ``p - t <= window`` (window + 1 keys, as transformers' sliding masks)."""

from __future__ import annotations

import importlib
import os

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from sglang_swa_plugin.check import triton_swa_window as sc  # noqa: E402
from sglang_swa_plugin.check.triton_bench import WINDOW, build  # noqa: E402
from sglang_swa_plugin.hooks import triton_swa_window as fix  # noqa: E402

from interpreted import Batch, main  # noqa: E402


def decode() -> float:
    env, lens = build(), sc.SEQ_LENS
    batch = Batch(env.runner, env.rows, env.pool, env.swa_layer, [m - 1 for m in lens],
                  [(b, m - 1, [b]) for b, m in enumerate(lens)], lambda p, t: 0 <= p - t <= WINDOW)
    rtt = env.runner.req_to_token_pool.req_to_token  # the new token's key goes to its own slot
    fb = env.tb.make_forward_batch(env.runner, "decode", req_pool_indices=env.rows[: len(lens)], seq_lens=list(lens),
                                   attn_backend=env.backend,
                                   out_cache_loc=[int(rtt[int(r), m - 1]) for r, m in zip(env.rows, lens)])
    env.backend.init_forward_metadata(fb)
    return batch.error(env.backend.forward_decode(batch.q, batch.k, batch.v, env.swa_layer, fb, save_kv_cache=True))


if __name__ == "__main__":
    module = importlib.import_module(fix.MODULE)
    methods = {module: tuple(n for n in fix.BUILDERS if hasattr(module, n)), module.TritonAttnBackend: ("init_cuda_graph_state",)}
    main(fix.FIX, methods, {"decode": decode})
