"""Check side, shared by the scenarios and the tests: recorders for the flashinfer kernels a
trtllm_mha backend calls, CPU stand-ins for its Triton/sgl_kernel helpers (page tables,
fused graph metadata, FP8 query quantization), and the real trtllm_mha extend bench on
diverged full/SWA pools that the routing and XQA scenarios run."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Iterator, List, Optional, Sequence

from ..probe import optional_module, swapped
from ..trtllm_mha import MODULE


@dataclass
class KernelCall:
    """One recorded flashinfer call from ``forward_extend``."""

    kernel: str  # "decode" or "context"
    layer_id: int
    q_rows: int
    q_dtype: Any
    q_len_per_req: Optional[int]  # decode: per-request query length; context: None
    batch_size: Optional[int]  # context: its batch_size argument; decode: None
    seq_lens: List[int]
    cu_seqlens_q: Optional[List[int]]  # context only
    page_table: Any  # block_tables as passed (a CPU tensor)
    mask: Any = None  # decode: the spec-decode mask passed (XQA), or None
    window_left: Optional[int] = None  # as passed (-1: full attention)
    q_dense: bool = True  # the query's rows are laid out densely (XQA reads them so)

    def breaks_decode_contract(self) -> bool:
        """A decode call whose query rows are not ``len(seq_lens) * q_len_per_req``: the kernel
        would infer a different batch size and read page-table rows past the batch."""
        return self.kernel == "decode" and self.q_rows != len(self.seq_lens) * (self.q_len_per_req or 1)


def kernel_recorders(calls: List[KernelCall], layer_ids: List[int]) -> SimpleNamespace:
    """A stand-in for the ``flashinfer`` name of the trtllm_mha module whose two entry points
    record their arguments and return zeros of the output shape."""
    import torch

    def output(query, out, out_dtype):
        return out if out is not None else torch.zeros(query.shape, dtype=out_dtype or torch.bfloat16)

    def decode(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, *a,
               q_len_per_req=1, out=None, out_dtype=None, mask=None, **kw):
        calls.append(KernelCall("decode", layer_ids[-1], query.shape[0], query.dtype, q_len_per_req, None,
                                seq_lens.tolist(), None, block_tables.clone(), mask, kw.get("window_left"),
                                query.is_contiguous()))
        return output(query, out, out_dtype)

    def context(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len,
                bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv, *a,
                out=None, out_dtype=None, **kw):
        calls.append(KernelCall("context", layer_ids[-1], query.shape[0], query.dtype, None, batch_size,
                                seq_lens.tolist(), cum_seq_lens_q.tolist(), block_tables.clone(),
                                window_left=kw.get("window_left")))
        return output(query, out, out_dtype)

    def fmha_v2(qkv, input_layout, workspace_buffer, seq_lens, max_q_len, max_kv_len, bmm1_scale, bmm2_scale,
                batch_size, cum_seq_lens_q, cum_seq_lens_kv, block_tables, *a, out=None, out_dtype=None, **kw):
        # Hopper/sm120 prefill (0.5.19+): block_tables [batch, pages] over K/V pages stacked, or
        # [batch, 2, pages], K's pages then V's (0.5.23)
        query = qkv[0]
        pages = block_tables[:, 0] if block_tables.dim() == 3 else block_tables
        calls.append(KernelCall("context", layer_ids[-1], query.shape[0], query.dtype, None, batch_size,
                                seq_lens.tolist(), cum_seq_lens_q.tolist(), pages.clone(),
                                window_left=kw.get("window_left")))
        return output(query, out, out_dtype)

    return SimpleNamespace(decode=SimpleNamespace(trtllm_batch_decode_with_kv_cache=decode),
                           prefill=SimpleNamespace(trtllm_batch_context_with_kv_cache=context,
                                                   trtllm_fmha_v2_prefill=fmha_v2))


def page_table_on_cpu(req_to_token, req_pool_indices, cache_seqlens, page_table, page_size,
                      swa_page_table=None, full_to_swa=None, **_):
    """What the Triton ``build_trtllm_mha_page_table`` (0.5.14+) writes, in torch: the same
    gather of exactly the tables and full->SWA mapping the backend hands it."""
    for i, (row, n) in enumerate(zip(req_pool_indices.tolist(), cache_seqlens.tolist())):
        pages = -(-int(n) // page_size)
        slots = req_to_token[row, : pages * page_size : page_size].long()
        page_table[i, :pages] = (slots // page_size).to(page_table.dtype)
        if swa_page_table is not None and full_to_swa is not None:
            swa_page_table[i, :pages] = (full_to_swa[slots] // page_size).to(swa_page_table.dtype)


def graph_metadata_on_cpu(*, req_pool_indices, seq_lens, req_to_token, cache_seqlens, cu_seqlens_k,
                          page_table, bs, seqlen_offset, page_size, swa_mapping=None,
                          swa_page_table=None, skip_page_table=False, **_):
    """What the fused Triton graph-metadata kernel (0.5.15+) writes, decode part only."""
    cache_seqlens[:bs] = seq_lens[:bs] + seqlen_offset
    cu_seqlens_k[1 : bs + 1] = cache_seqlens[:bs].cumsum(0)
    if not skip_page_table:
        page_table_on_cpu(req_to_token, req_pool_indices[:bs], cache_seqlens[:bs], page_table,
                          page_size, swa_page_table, swa_mapping)


def fp8_quant_on_cpu(x, scale=None, *args, **kwargs):
    """What sgl_kernel's per-tensor ``scaled_fp8_quant`` returns, in torch."""
    import torch

    scale = x.abs().amax().float().clamp(min=1e-12) / torch.finfo(torch.float8_e4m3fn).max
    return (x.float() / scale).to(torch.float8_e4m3fn), scale.reshape(1)


CPU_KERNELS = {"build_trtllm_mha_page_table": page_table_on_cpu,
               "update_trtllm_mha_graph_metadata": graph_metadata_on_cpu,
               "scaled_fp8_quant": fp8_quant_on_cpu}


@contextlib.contextmanager
def cpu_kernels(module: str = MODULE, launch: Any = None) -> Iterator[None]:
    """The Triton/sgl_kernel entry points ``module`` binds (default: the trtllm_mha backend's;
    the FA3 backend binds ``build_trtllm_mha_page_table`` too, 0.5.18+) replaced by their CPU
    stand-ins for the block; ``launch(stand_in)``, where given, is what is put in place (an
    emulated graph's ``kernel``: a captured pass replays them)."""
    mod = sys.modules.get(module) or optional_module(module)
    with contextlib.ExitStack() as stack:
        for name, stand_in in CPU_KERNELS.items():
            if hasattr(mod, name):
                stack.enter_context(swapped(mod, name, launch(stand_in) if launch else stand_in))
        yield


def record_extend(backend: Any, forward_batch: Any, layers: Sequence[Any]) -> List[KernelCall]:
    """Build ``backend``'s metadata for ``forward_batch`` and run ``forward_extend`` for every
    layer with the flashinfer kernels recorded and the Triton helpers on CPU; return the
    recorded kernel calls."""
    import torch

    calls: List[KernelCall] = []
    layer_ids: List[int] = []
    heads = layers[0].tp_q_head_num * layers[0].head_dim
    rows = forward_batch.input_ids.shape[0]
    with swapped(optional_module(MODULE), "flashinfer", kernel_recorders(calls, layer_ids)), cpu_kernels():
        backend.init_forward_metadata(forward_batch)
        for layer in layers:
            layer_ids.append(layer.layer_id)
            q = torch.randn(rows, heads, dtype=torch.bfloat16)
            backend.forward_extend(q, None, None, layer, forward_batch, save_kv_cache=False)
    return calls


def extend_bench(num_draft_tokens: int = 3, prefix_lens: Sequence[int] = (4, 6)) -> SimpleNamespace:
    """A real trtllm_mha backend (EAGLE target runner over an SWAKVPool whose full and SWA
    index spaces diverge), one SWA and one full RadixAttention layer, and
    ``batch(mode, extend_lens)``: a real ForwardBatch for EXTEND, TARGET_VERIFY or
    DRAFT_EXTEND_V2 of requests holding ``prefix_lens`` tokens. ``seq_lens`` are the totals
    after this step's K/V (before the drafts for TARGET_VERIFY, which adds them itself)."""
    import torch
    from sglang.srt.layers.radix_attention import RadixAttention

    from . import testbed

    pool = testbed.make_swa_pool()
    allocator = testbed.make_swa_allocator(pool)
    testbed.diverge(allocator)
    req_to_token = testbed.make_req_to_token_pool()
    runner = testbed.make_model_runner(kv_pool=pool, allocator=allocator, req_to_token_pool=req_to_token,
                                       spec_algorithm="EAGLE", num_draft_tokens=num_draft_tokens)
    backend = testbed.build_trtllm_backend(runner)
    cfg = runner.model_config
    swa_ids = sorted(i for i, (_, is_swa) in pool.layers_mapping.items() if is_swa)
    full_ids = sorted(i for i, (_, is_swa) in pool.layers_mapping.items() if not is_swa)
    heads, kv_heads = testbed.layer_heads(cfg)
    layers = [RadixAttention(heads, cfg.head_dim, cfg.head_dim ** -0.5, kv_heads,
                             layer_id=i, sliding_window_size=runner.sliding_window_size if i in swa_ids else -1)
              for i in (swa_ids[0], full_ids[0])]
    tokens = [testbed.alloc_tokens(allocator, n + 2 * num_draft_tokens) for n in prefix_lens]
    rows, _ = testbed.fill_requests(req_to_token, tokens)

    def batch(mode: str, extend_lens: Sequence[int]) -> Any:
        verify = mode == "TARGET_VERIFY"
        seq = list(prefix_lens) if verify else [p + e for p, e in zip(prefix_lens, extend_lens)]
        new = torch.cat([t[p:p + e] for t, p, e in zip(tokens, prefix_lens, extend_lens)])
        return testbed.make_forward_batch(runner, mode.lower(), req_pool_indices=rows, seq_lens=seq, out_cache_loc=new,
                                          extend_seq_lens=None if verify else list(extend_lens), attn_backend=backend)

    return SimpleNamespace(runner=runner, backend=backend, layers=layers, pool=pool, allocator=allocator,
                           req_to_token=req_to_token, tokens=tokens, rows=rows, batch=batch)
