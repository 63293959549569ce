"""``triton_swa_tree_verify`` under deterministic inference, through sglang's own Triton kernels
(its unified 1-stage extend kernel) on the CPU (run with ``TRITON_INTERPRET=1``; harness:
tests/interpreted.py): a sliding-window layer (window 7) on a real TritonAttnBackend built with
``--enable-deterministic-inference`` over a real SWAKVPool whose index spaces differ, the target
verify of a chain (topk 1) and of two EAGLE trees (topk 2) after requests longer and shorter
than the window. The model: a draft at position ``p`` attends the keys ``t`` with
``p - t <= window`` among the cached keys and its tree ancestors (itself included). The fix's
preview for it (``triton_swa_tree_verify_deterministic``) is on."""

from __future__ import annotations

import importlib
import os

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402

from sglang_swa_plugin.check.triton_bench import WINDOW  # noqa: E402
from sglang_swa_plugin.check.triton_swa_tree_verify import build_deterministic  # noqa: E402
from sglang_swa_plugin.hooks import triton_swa_tree_verify as fix  # noqa: E402

from interpreted import main, tree_verify_error  # noqa: E402

LENS = (21, 6, 14)  # longer than, shorter than, longer than the window
TREES = {"verify-chain": (-1, 0, 1, 2), "verify-tree-depth2": (-1, 0, 0, 1), "verify-tree-depth3": (-1, 0, 0, 1, 2, 3)}


def verify(parent) -> float:
    n = len(parent)
    env = build_deterministic(n)
    rtt = env.runner.req_to_token_pool.req_to_token  # each draft's key goes to its own slot
    loc = torch.cat([rtt[int(r), m:m + n] for r, m in zip(env.rows, LENS)]).long()
    return tree_verify_error(env, env.swa_layer, LENS, parent, lambda p, t: 0 <= p - t <= WINDOW, loc)


if __name__ == "__main__":
    fix.FIX.previews_on = frozenset({fix.DETERMINISTIC})  # this child's fix: its deterministic preview on
    methods = {importlib.import_module(fix.MODULE).TritonAttnBackend: ("forward_extend",)}
    main(fix.FIX, methods, {name: (lambda parent=parent: verify(parent)) for name, parent in TREES.items()})
