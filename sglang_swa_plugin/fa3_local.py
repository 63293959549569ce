"""Chunked ("local", Llama 4) attention pieces shared by the FA3 fixes
(``fa3_local_attn_pages``, ``fa3_local_attn_verify``): sglang's own virtual-batch splitter
with the chunk size kept as configured, and the class of its local-attention metadata."""

from __future__ import annotations

import inspect

from .probe import optional_module

FA3_MODULE = "sglang.srt.layers.attention.flashattention_backend"
BUILDER_MODULE = "sglang.srt.layers.attention.local_attention"  # 0.5.22+
SPLITTER = "make_local_attention_virtual_batches"
PRESERVE = "preserve_attn_chunk_size"


def splitter():
    """``make_local_attention_virtual_batches`` where this sglang keeps it (the FA3 backend
    module; 0.5.22+: the local-attention module)."""
    split = getattr(optional_module(FA3_MODULE), SPLITTER, None)
    if split is None:
        split = getattr(optional_module(BUILDER_MODULE), SPLITTER)
    return split


def local_batches(chunk: int, cu_seqlens_q_np, seq_lens_np, page_table, page_size: int):
    """sglang's own splitter with the chunk size kept as configured. Where the splitter
    has no ``preserve_attn_chunk_size`` it shrinks the chunk to the longest sequence; one
    extra request of exactly one chunk keeps it whole, and its virtual request is dropped."""
    import numpy as np

    split = splitter()
    if PRESERVE in inspect.signature(split).parameters:
        return split(chunk, cu_seqlens_q_np, seq_lens_np, page_table, page_size, **{PRESERVE: True})
    if int(seq_lens_np.max()) >= chunk:  # the splitter keeps the chunk (a multiple of the page size)
        return split(chunk, cu_seqlens_q_np, seq_lens_np, page_table, page_size)
    import torch
    cu = np.append(cu_seqlens_q_np, cu_seqlens_q_np[-1] + 1).astype(cu_seqlens_q_np.dtype)
    lens = np.append(seq_lens_np, chunk).astype(seq_lens_np.dtype)
    table = torch.cat([page_table, page_table.new_zeros(1, page_table.shape[1])])
    q, cu_q, k, blocks = split(chunk, cu, lens, table, page_size)
    return q[:-1], cu_q[:-1], k[:-1], blocks[:-1]


def local_metadata_class(metadata):
    """The ``LocalAttentionMetadata`` class FA3 reads (nested in ``FlashAttentionMetadata``;
    0.5.22+: the local-attention module)."""
    cls = getattr(type(metadata), "LocalAttentionMetadata", None)
    if cls is None:
        cls = getattr(optional_module(BUILDER_MODULE), "LocalAttentionMetadata")
    return cls
