"""Shared part of the ``tests/interpreted_*.py`` scripts: a fix's paths run through sglang's own
Triton kernels on the CPU (Triton's interpreter, ``TRITON_INTERPRET=1`` set before sglang is
imported) on a real TritonAttnBackend over a real SWAKVPool (float32), stock and with the fix,
each output row held against the model's attention computed here in torch. Each script prints
one JSON line per seed (``SEEDS``, comma list) and path: the largest difference from the model,
stock and fixed; tests/test_*.py run them in a child process (:func:`run_script`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sglang_swa_plugin.check.testbed import ancestors, tree_inputs  # the scripts' and tests' trees


class Batch:
    """Requests' cached keys (random, written at their SWA slots) and new tokens: per new token its
    request, its position and the new tokens it may attend (causal or a tree's ancestors, itself
    included); ``visible(p, t)``: whether the model lets a query at position ``p`` attend position
    ``t``."""

    def __init__(self, runner, rows, pool, layer, cached_lens, new, visible):
        import torch

        self.layer, self.new, self.visible, self.cached = layer, new, visible, []
        kv_heads, dim = layer.tp_k_head_num, layer.qk_head_dim
        k_buf, v_buf = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
        for b, m in enumerate(cached_lens):
            slots = pool.translate_loc_from_full_to_swa(runner.req_to_token_pool.req_to_token[int(rows[b]), :m].long())
            k_buf[slots.long()], v_buf[slots.long()] = torch.randn(m, kv_heads, dim), torch.randn(m, kv_heads, dim)
            self.cached.append((k_buf[slots.long()].clone(), v_buf[slots.long()].clone()))
        self.q = torch.randn(len(new), layer.tp_q_head_num * dim)
        self.k, self.v = torch.randn(len(new), kv_heads, dim), torch.randn(len(new), kv_heads, dim)

    def model(self):
        import torch

        heads, dim = self.layer.tp_q_head_num, self.layer.qk_head_dim
        group = heads // self.layer.tp_k_head_num
        out = torch.zeros(len(self.new), heads, dim)
        for r, (b, p, seen) in enumerate(self.new):
            keep = [t for t in range(len(self.cached[b][0])) if self.visible(p, t)]
            rows = [s for s in seen if self.visible(p, self.new[s][1])]
            keys = torch.cat([self.cached[b][0][keep], self.k[rows]])
            values = torch.cat([self.cached[b][1][keep], self.v[rows]])
            query = self.q[r].view(heads, dim)
            for h in range(heads):
                weights = torch.softmax(keys[:, h // group] @ query[h] * self.layer.scaling, dim=0)
                out[r, h] = weights @ values[:, h // group]
        return out

    def error(self, out) -> float:
        """The largest difference of the backend's output from the model's."""
        return float((out.view(len(self.new), -1, self.layer.qk_head_dim) - self.model()).abs().max())


def tree_verify_error(env, layer, lens, parents, visible, out_cache_loc=None) -> float:
    """A target verify of the EAGLE tree ``parents`` (topk 1 where it is a chain) after requests of
    ``lens`` cached keys on ``env``'s backend (a check module's ``build()``), ``layer`` written and
    read: the largest difference of its output from the model's (``visible``: see Batch)."""
    from sglang_swa_plugin.check.fa3_spec_translate import verify_input

    n = len(parents)
    mask, positions = tree_inputs(parents)(lens)
    new = [(b, int(positions[b * n + i]), [b * n + a for a in sorted(ancestors(parents, i))])
           for b in range(len(lens)) for i in range(n)]
    batch = Batch(env.runner, env.rows, env.pool, layer, lens, new, visible)
    topk = 1 if list(parents) == [-1] + list(range(n - 1)) else 2
    fb = env.tb.make_forward_batch(env.runner, "target_verify", req_pool_indices=env.rows[: len(lens)],
                                   seq_lens=list(lens), num_tokens_per_req=n, attn_backend=env.backend,
                                   spec_info=verify_input(mask, list(lens), topk, n, positions),
                                   **({} if out_cache_loc is None else {"out_cache_loc": out_cache_loc}))
    fb.positions = positions  # as sglang's ForwardBatch takes the verify input's
    env.backend.init_forward_metadata(fb)
    return batch.error(env.backend.forward_extend(batch.q, batch.k, batch.v, layer, fb, save_kv_cache=True))


def main(fix, methods: dict, paths: dict) -> None:
    """Per seed and path (``paths``: name -> ``run(seed) -> error``), the error stock (sglang's
    methods alone) and fixed (``fix`` installed), one JSON line each.
    sglang's SWA pools are float32 here."""
    import torch

    from sglang_swa_plugin.check import testbed

    from helpers import fixed_alone, methods_alone

    make = testbed.make_swa_pool
    testbed.make_swa_pool = lambda *a, **kw: make(*a, **{**kw, "dtype": torch.float32})
    for seed in (int(s) for s in os.environ.get("SEEDS", "0").split(",")):
        for name, run in paths.items():
            got = {}
            for side, block in (("stock", methods_alone), ("fixed", fixed_alone)):
                torch.manual_seed(seed)
                with block(fix, methods):
                    got[side] = run()
            print(json.dumps({"seed": seed, "path": name, **got}), flush=True)


def run_script(name: str, seeds: "list[str]") -> list:
    """``tests/<name>`` in a child process under Triton's interpreter: its JSON lines (asserted
    to be one per seed and path, the child's exit status 0)."""
    from helpers import HERE, child_env

    proc = subprocess.run([sys.executable, str(HERE / name)], capture_output=True, text=True, timeout=600,
                          env=child_env(PYTHONPATH=str(HERE), TRITON_INTERPRET="1", SEEDS=",".join(seeds)))
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and rows, proc.stdout + proc.stderr[-3000:]
    return rows
