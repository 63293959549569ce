"""CPU scenario of ``swa_index_guard``: real decode steps of a GPT-OSS-like target on diverged
full/SWA pools, and an index-space mix-up the guard must stop before the kernel."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

from ..fix import ScenarioUnavailable
from ..hooks.swa_index_guard import PREFIX, TRT_MODULE
from ..probe import optional_module
from . import Outcome
from . import testbed

def decode_bench(backend_name: str = "trtllm_mha") -> SimpleNamespace:
    """Real objects of one decode step of a GPT-OSS-like target (layers 0, 2 sliding;
    1, 3 full) on a real ``SWAKVPool`` of 64 full / 16 SWA slots whose index spaces
    diverge: one request of 6 tokens whose full-pool indices (41..46) all lie beyond the
    SWA pool (17 slots with the padding slot) and whose SWA slots (1..6) lie inside it;
    the ``backend_name`` backend ("trtllm_mha" or "fa3"), a decode ``ForwardBatch`` and
    the model's layers (``RadixAttention``, sliding window 127 on the SWA layers)."""
    from sglang.srt.layers.radix_attention import RadixAttention

    try:
        pool = testbed.make_swa_pool(size=64, size_swa=16)
        allocator = testbed.make_swa_allocator(pool)
        testbed.diverge(allocator, 40)
        req_to_token = testbed.make_req_to_token_pool()
        tokens = testbed.alloc_tokens(allocator, 6)
        rows, lens = testbed.fill_requests(req_to_token, [tokens])
        runner = testbed.make_model_runner(kv_pool=pool, allocator=allocator, req_to_token_pool=req_to_token,
                                           attention_backend=backend_name)
        build = testbed.build_fa3_backend if backend_name == "fa3" else testbed.build_trtllm_backend
        backend = build(runner)
        batch = testbed.make_forward_batch(runner, "decode", req_pool_indices=rows, seq_lens=lens,
                                           out_cache_loc=tokens[-1:], attn_backend=backend)
    except ImportError as e:  # e.g. no sgl_kernel flash_attn for fa3 on this machine
        raise ScenarioUnavailable(f"cannot build the {backend_name} backend here: {e}") from None
    layers = [
        RadixAttention(num_heads=4, head_dim=8, scaling=1.0, num_kv_heads=2, layer_id=i,
                       sliding_window_size=127 if is_swa else -1)
        for i, (_, is_swa) in sorted(pool.layers_mapping.items())
    ]
    return SimpleNamespace(pool=pool, allocator=allocator, runner=runner, backend=backend, batch=batch,
                           tokens=tokens, rows=rows, lens=lens, layers=layers,
                           swa_layer=next(l for l in layers if l.sliding_window_size > -1),
                           full_layer=next(l for l in layers if l.sliding_window_size == -1))


def trtllm_metadata(bench: SimpleNamespace, width: Optional[int] = None):
    """A real ``TRTLLMMHAMetadata`` for ``bench``'s decode step (page_size 1), as
    ``init_forward_metadata`` fills it: the full-pool page table, the SWA page table (the
    request's SWA slots), the KV lengths and (0.5.14+) the SWA write locations. A
    ``width`` past the length pads each row with an out-of-range value, as the
    uninitialised tail of a 0.5.14+ table may hold."""
    import torch

    mod = optional_module(TRT_MODULE)
    full = bench.tokens.to(torch.int32)[None, :]
    swa = bench.pool.translate_loc_from_full_to_swa(bench.tokens).to(torch.int32)[None, :]
    if width is not None:
        pad = torch.full((1, width - full.shape[1]), 1 << 20, dtype=torch.int32)
        full, swa = torch.cat([full, pad], 1), torch.cat([swa, pad], 1)
    meta = mod.TRTLLMMHAMetadata()
    meta.page_table, meta.swa_page_table = full, swa
    meta.cache_seqlens_int32 = bench.lens.to(torch.int32)
    if hasattr(meta, "swa_out_cache_loc"):  # 0.5.14+: the SWA write locations, translated once
        meta.swa_out_cache_loc = bench.pool.translate_loc_from_full_to_swa(bench.batch.out_cache_loc)
    return meta


def scenario() -> Outcome:
    """trtllm_mha decode whose SWA page table holds full-pool indices beyond the SWA pool: is it
    stopped with a named error before the kernel. (Seed 002 did this on fa3.) The bug shows
    when nothing stops the table; ``seen``: the guard's message, or None."""
    if optional_module(TRT_MODULE) is None:
        raise ScenarioUnavailable(f"this sglang has no module {TRT_MODULE}")
    bench = decode_bench("trtllm_mha")
    meta = trtllm_metadata(bench)
    meta.swa_page_table = meta.page_table  # the index-space mix-up
    bench.backend.forward_metadata = meta
    try:
        bench.backend._get_layer_page_table(bench.swa_layer, bench.batch)
    except RuntimeError as e:
        if PREFIX not in str(e):
            raise
        return Outcome(False, str(e))
    return Outcome(True, None)


def reproduce() -> bool:
    return scenario().bug
