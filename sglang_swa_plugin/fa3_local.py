"""Chunked ("local", Llama 4) attention pieces shared by the FA3 fixes
(``fa3_local_attn_pages``, ``fa3_local_attn_verify``, ``fa3_local_attn_tree_verify``):
sglang's own virtual-batch splitter with the chunk size kept as configured, the class of its
local-attention metadata, and the FA3 backend's CUDA-graph metadata API."""

from __future__ import annotations

import functools
import inspect

from .probe import optional_module

FA3_MODULE = "sglang.srt.layers.attention.flashattention_backend"
BUILDER_MODULE = "sglang.srt.layers.attention.local_attention"  # 0.5.22+
SPLITTER = "make_local_attention_virtual_batches"
FA3_CLASS = FA3_MODULE + ".FlashAttentionBackend"
GRAPH_STATE = FA3_CLASS + ".init_cuda_graph_state"
GRAPH_CAPTURE = FA3_CLASS + ".init_forward_metadata_capture_cuda_graph"  # up to 0.5.12
GRAPH_REPLAY = FA3_CLASS + ".init_forward_metadata_replay_cuda_graph"  # up to 0.5.12
OUT_GRAPH = FA3_CLASS + ".init_forward_metadata_out_graph"  # 0.5.13+
GRAPH_PARAMS = {
    GRAPH_STATE: ("self", "max_bs"), OUT_GRAPH: ("self", "forward_batch", "in_capture"),
    GRAPH_CAPTURE: ("self", "bs", "num_tokens", "req_pool_indices", "seq_lens", "encoder_lens", "forward_mode",
                    "spec_info"),
    GRAPH_REPLAY: ("self", "bs", "req_pool_indices", "seq_lens", "seq_lens_sum", "encoder_lens", "forward_mode",
                   "spec_info", "seq_lens_cpu")}
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


@functools.lru_cache(maxsize=None)
def kept_chunk(chunk: int, page_size: int) -> int:
    """The chunk ``local_batches`` splits by: as configured where the splitter preserves it;
    else the splitter's own rounding down to whole pages (``local_batches`` keeps the longest
    sequence at least one chunk long)."""
    if PRESERVE in inspect.signature(splitter()).parameters:
        return chunk
    return max(chunk // page_size * page_size, page_size)


def verify_local_batches(chunk: int, page_size: int, prefix_lens, draft_tokens: int, page_table, bs: int,
                         per_request: int, cu_q_out, k_out, blocks_out) -> None:
    """``local_batches`` of ``bs`` verify requests of ``draft_tokens`` query tokens each over
    ``prefix_lens`` keys before them, computed on the device with fixed shapes (no host-device
    sync; capturable): the ``bs * per_request`` virtual requests packed as the splitter packs
    them, the unused ones with no query tokens, no keys and page 0. Writes ``cu_q_out[: v + 1]``,
    ``k_out[:v]`` and ``blocks_out[:v]`` (``v = bs * per_request``); the same values as
    ``local_batches`` over ``page_table[:bs, : cdiv(max(prefix_lens) + draft_tokens, page_size)]``."""
    import torch

    c, n, ps, v = kept_chunk(chunk, page_size), int(draft_tokens), page_size, bs * per_request
    lens = prefix_lens[:bs].to(torch.int64) + n  # keys up to and including the draft tokens
    q_first = torch.clamp(c - (lens - n) % c, max=n)  # query tokens in the request's first chunk
    last = (lens - 1) % c + 1  # keys in its last chunk
    blocks = (n + 2 * c - 1 - q_first) // c  # its virtual requests: 1 + cdiv(n - q_first, c)
    ends = torch.cumsum(blocks, 0)
    slot = arange_once(v, lens.device)
    req = torch.clamp_(torch.searchsorted(ends, slot, right=True), max=bs - 1)
    # the request's values per virtual request, in one gather
    first, q0, last_k, total, end = torch.stack((ends - blocks, q_first, last, lens, ends))[:, req].unbind(0)
    valid = slot < ends[-1]
    # query tokens up to the end of chunk j of a request: min(n, q_first + c * j), after the
    # requests before it (n each); unused virtual requests at the total
    cu_q_out[:1] = 0
    cu_q_out[1 : v + 1] = torch.where(valid, req * n + torch.clamp(q0 + c * (slot - first), max=n), bs * n)
    keys = (end - 1 - slot) * c + last_k  # keys from the chunk's first one to the request's last
    k_out[:v] = torch.where(valid, torch.clamp(keys, max=c), 0)
    start = torch.clamp_(total - keys, min=0)  # the chunk's first key
    pages = c // ps
    cols = torch.clamp((lens.max() - 1) // ps, max=page_table.shape[1] - 1)  # the splitter's clip
    idx = torch.minimum((start if ps == 1 else start // ps)[:, None] + arange_once(pages, lens.device), cols)
    blocks_out[:v, :pages] = torch.where(valid[:, None], page_table[req[:, None], idx], 0)
    if blocks_out.shape[1] > pages:
        blocks_out[:v, pages:] = 0


@functools.lru_cache(maxsize=None)
def arange_once(n: int, device, every: int = 1):
    """``arange(n) // every`` on ``device``, made once and kept for good (a captured CUDA graph
    reads it by address): a constant of the fixed-shape fills."""
    import torch

    got = torch.arange(n, device=device)
    return got if every == 1 else got // every


def local_metadata_class(metadata):
    """The ``LocalAttentionMetadata`` class FA3 reads (nested in ``FlashAttentionMetadata``;
    0.5.22+: the local-attention module)."""
    cls = getattr(type(metadata), "LocalAttentionMetadata", None)
    if cls is None:
        cls = getattr(optional_module(BUILDER_MODULE), "LocalAttentionMetadata")
    return cls


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def graph_api(cls) -> str:
    """``out_graph`` (0.5.13+: ``init_forward_metadata_out_graph``) or ``capture_replay``."""
    from .probe import own_function

    return "out_graph" if own_function(cls, "init_forward_metadata_out_graph") is not None else "capture_replay"
