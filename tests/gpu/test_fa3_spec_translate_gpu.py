"""fa3_spec_translate on a GPU: sglang's real ``prepare_swa_spec_page_table_triton`` and real
FA3 attention (``sgl_kernel.flash_attn``) over the EAGLE3 topk>1 TARGET_VERIFY metadata of a
real ``FlashAttentionBackend`` on a real ``SWAKVPool`` whose index spaces diverge (every
full-pool index of the requests lies beyond the SWA pool), compared with attention computed
in torch over the same KV: a sliding layer (reads the SWA pool through the SWA spec page table)
and a full layer (cascade attention over the full-pool tables, which the fix must leave alone).

With the plugin the outputs match. Without it (only where sglang lacks the translation) the
case runs in a child process, so that a CUDA fault cannot poison this one; the test reports
what happened (fault, or indices past the SWA pool and wrong attention) and fails if the bug
did not show. Set ``OUT`` to also get ``$OUT/fa3_spec_translate_gpu.json``.

    python -m pytest -q -m gpu tests/gpu/test_fa3_spec_translate_gpu.py
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64  # FA3 needs a head_dim it has kernels for
SWA_LAYER, FULL_LAYER = 0, 1  # layers 0, 2 slide; 1, 3 are full
WINDOW = 127  # wider than every request here: the reference attends to all its tokens
PREFIX_LENS = (5, 3)
FULL_ONLY = 30  # full indices 31..46, SWA indices 1..16, SWA pool 33 rows
TOL = 2e-2


def _needs_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("FA3 needs sm90+")
    try:
        from sgl_kernel.flash_attn import flash_attn_with_kvcache  # noqa: F401
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no FA3 kernels: {e}")


def _cuda_bench():
    """The CPU scenario's objects (fa3_check.verify_bench), built on the GPU."""
    from sglang.srt.layers.radix_attention import RadixAttention

    from sglang_swa_plugin.check import testbed as tb
    from sglang_swa_plugin.check import fa3_spec_translate as fa3_check

    cls = tb.swa_classes()
    kw = dict(
        size=64, size_swa=32, page_size=1, dtype=torch.bfloat16, head_num=KV_HEADS,
        head_dim=HEAD_DIM, swa_attention_layer_ids=[0, 2], full_attention_layer_ids=[1, 3],
        device="cuda",
    )
    if "enable_kvcache_transpose" in inspect.signature(cls.SWAKVPool.__init__).parameters:
        kw["enable_kvcache_transpose"] = False
    pool = cls.SWAKVPool(**kw)
    alloc = cls.SWATokenToKVPoolAllocator(
        size=64, size_swa=32, page_size=1, dtype=torch.bfloat16, device="cuda", kvcache=pool,
        need_sort=False,
    )
    tb.diverge(alloc, FULL_ONLY)
    req_to_token = cls.ReqToTokenPool(size=4, max_context_len=64, device="cuda", enable_memory_saver=False)
    num_draft = len(fa3_check.TREE)
    runner = tb.make_model_runner(
        kv_pool=pool, allocator=alloc, req_to_token_pool=req_to_token, spec_algorithm="EAGLE3",
        topk=2, num_steps=max(len(t) for t in fa3_check.TREE) - 1, num_draft_tokens=num_draft,
        attention_backend="fa3",
    )
    runner.device = "cuda"
    backend = tb.build_fa3_backend(runner)
    prefixes = [tb.alloc_tokens(alloc, n).cuda() for n in PREFIX_LENS]
    drafts = [tb.alloc_tokens(alloc, num_draft).cuda() for _ in PREFIX_LENS]
    rows, _ = tb.fill_requests(req_to_token, [torch.cat(pd) for pd in zip(prefixes, drafts)])
    draft_mask = torch.zeros(num_draft, num_draft, dtype=torch.bool)
    for i, attends in enumerate(fa3_check.TREE):
        draft_mask[i, list(attends)] = True
    custom_mask = torch.cat([
        torch.cat([torch.ones(num_draft, n, dtype=torch.bool), draft_mask], dim=1).flatten()
        for n in PREFIX_LENS
    ]).cuda()
    batch = tb.make_forward_batch(
        runner, "target_verify", req_pool_indices=rows, seq_lens=list(PREFIX_LENS),
        out_cache_loc=torch.cat(drafts).cpu(),
        spec_info=fa3_check.verify_input(custom_mask, list(PREFIX_LENS), 2, num_draft),
    )
    for name in ("req_pool_indices", "seq_lens", "out_cache_loc", "positions", "input_ids", "orig_seq_lens"):
        if getattr(batch, name, None) is not None:
            setattr(batch, name, getattr(batch, name).cuda())
    layers = {
        lid: RadixAttention(HEADS, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS, lid,
                            sliding_window_size=WINDOW if lid == SWA_LAYER else -1)
        for lid in (SWA_LAYER, FULL_LAYER)
    }
    return pool, backend, batch, layers, prefixes, drafts


def _write_kv(pool, layer, prefixes, drafts, gen):
    """Random K/V for every token of every request, through the pool's real write path."""
    from sglang_swa_plugin.check import testbed as tb

    loc = torch.cat([torch.cat(pd) for pd in zip(prefixes, drafts)])
    k = torch.randn(len(loc), KV_HEADS, HEAD_DIM, generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn(len(loc), KV_HEADS, HEAD_DIM, generator=gen, device="cuda").to(torch.bfloat16)
    params = inspect.signature(pool.set_kv_buffer).parameters
    if "loc_info" in params:
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        pool.set_kv_buffer(layer, KVWriteLoc(loc, swa_loc=tb.translate(pool, loc)), k, v)
    elif "swa_loc" in params:
        pool.set_kv_buffer(layer, loc, k, v, swa_loc=tb.translate(pool, loc))
    else:
        pool.set_kv_buffer(layer, loc, k, v)


def _reference(pool, layer, q, prefixes, drafts):
    """Per draft row: softmax attention in float32 over the row's tokens (prefix, then the
    draft tokens the tree lets it see), read from the layer's own pool at the right slots."""
    from sglang_swa_plugin.check import testbed as tb
    from sglang_swa_plugin.check import fa3_spec_translate as fa3_check

    k_buf, v_buf = pool.get_kv_buffer(layer.layer_id)
    is_swa = layer.sliding_window_size > -1
    out = []
    for r, (prefix, draft) in enumerate(zip(prefixes, drafts)):
        for i, attends in enumerate(fa3_check.TREE):
            full = torch.cat([prefix, draft[list(attends)]])
            slots = tb.translate(pool, full).cuda() if is_swa else full
            k = k_buf[slots].float().repeat_interleave(HEADS // KV_HEADS, dim=1)  # (L, H, D)
            v = v_buf[slots].float().repeat_interleave(HEADS // KV_HEADS, dim=1)
            qm = q[r * len(fa3_check.TREE) + i].view(HEADS, HEAD_DIM).float()
            p = torch.softmax(torch.einsum("hd,lhd->hl", qm, k) * layer.scaling, dim=-1)
            out.append(torch.einsum("hl,lhd->hd", p, v).reshape(-1))
    return torch.stack(out)


def run_case(with_plugin: bool) -> dict:
    """One verify forward on both layers. Returns what happened, as plain data."""
    from sglang_swa_plugin.core import temporarily_installed
    from sglang_swa_plugin.fix import Verdict
    from sglang_swa_plugin.hooks import fa3_spec_translate as fa3
    from sglang_swa_plugin.check import fa3_spec_translate as fa3_check

    gen = torch.Generator(device="cuda").manual_seed(0)
    pool, backend, batch, layers, prefixes, drafts = _cuda_bench()
    for layer in layers.values():
        _write_kv(pool, layer, prefixes, drafts, gen)
    needed = fa3.FIX.detect().verdict is Verdict.NEEDED
    install = [fa3.FIX] if with_plugin and needed else []
    n_q = len(PREFIX_LENS) * len(fa3_check.TREE)
    q = torch.randn(n_q, HEADS * HEAD_DIM, generator=gen, device="cuda").to(torch.bfloat16)
    result = {"with_plugin": with_plugin, "fix_needed": needed, "swa_pool_rows": pool.get_key_buffer(SWA_LAYER).shape[0]}
    with temporarily_installed(*install):
        backend.init_forward_metadata(batch)
        table = backend.forward_metadata.swa_spec_metadata.page_table
        lens = backend.forward_metadata.swa_spec_metadata.cache_seqlens_int32
        used = torch.cat([table[m, : int(lens[m])] for m in range(n_q)])
        result["swa_spec_table_max"] = int(used.max())
        for name, layer in layers.items():
            out = backend.forward_extend(q, None, None, layer, batch, save_kv_cache=False)
            torch.cuda.synchronize()
            ref = _reference(pool, layer, q, prefixes, drafts)
            err = (out.float().view(n_q, -1) - ref).abs().max().item()
            result[f"layer{name}_max_abs_err"] = err
            result[f"layer{name}_matches"] = err < TOL
    return result


def _report(name, data):
    from helpers import report_json

    report_json("fa3_spec_translate_gpu.json", name, data)


def test_verify_attention_matches_torch_with_the_plugin():
    _needs_gpu()
    res = run_case(with_plugin=True)
    _report("with_plugin", res)
    assert res["swa_spec_table_max"] < res["swa_pool_rows"], res
    assert res[f"layer{SWA_LAYER}_matches"] and res[f"layer{FULL_LAYER}_matches"], res


def test_without_the_plugin_the_swa_layer_reads_outside_the_swa_pool():
    _needs_gpu()
    from sglang_swa_plugin.fix import Verdict
    from sglang_swa_plugin.hooks import fa3_spec_translate as fa3

    if fa3.FIX.detect().verdict is not Verdict.NEEDED:
        pytest.skip("this sglang translates the page tables itself")
    code = (
        "import json, sys; sys.path.insert(0, %r); import test_fa3_spec_translate_gpu as t; "
        "print('RESULT=' + json.dumps(t.run_case(False)))" % str(Path(__file__).parent)
    )
    env = dict(os.environ, SGLANG_SWA_PLUGIN="0")  # and sglang's own loader is never called here
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT=")]
    if lines:
        res = json.loads(lines[0][len("RESULT="):])
        res["outcome"] = "ran"
    else:
        res = {"outcome": "child failed", "returncode": proc.returncode, "stderr_tail": proc.stderr[-3000:]}
    _report("without_plugin", res)
    if res["outcome"] == "ran":
        assert res["swa_spec_table_max"] >= res["swa_pool_rows"], res  # full-pool indices
        assert not res[f"layer{SWA_LAYER}_matches"], res
        assert res[f"layer{FULL_LAYER}_matches"], res  # full layers were never affected
    else:
        assert "CUDA" in res["stderr_tail"] or "illegal" in res["stderr_tail"], res
