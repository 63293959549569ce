"""Triton kernels that lay out the rails of ``triton_rail`` inside the captured graphs, one launch
each in place of many small device ops: a tree verify's (``tree_rail``: per request its kept
keys' count, first position and offsets, per draft row the mask cells over the kept keys and the
request's drafts; some thirty ops before) and a decode's chunk rail (``chunk_slots``: per request
the keys of its chunk and their offsets; about ten). ``triton_rail`` holds the same layouts in
torch ops (the CPU form); the tests hold the two equal (Triton's interpreter). Imported on first
use (Triton is needed only where a rail runs)."""

from __future__ import annotations

import triton
import triton.language as tl

WINDOW, CHUNK = 0, 1  # the rules, as ``triton_rail.RULES`` names them
BLOCK = 1024  # mask cells a program writes per iteration


@triton.jit
def _tree_rail_kernel(seq_ptr, pos_ptr, stock_ptr, stock_indptr_ptr, stock_cells,
                      kv_indptr_ptr, keys_ptr, starts_ptr, mask_ptr, mask_indptr_ptr,
                      bs, size, N: tl.constexpr, RULE: tl.constexpr, BS_BLOCK: tl.constexpr,
                      BLOCK: tl.constexpr):
    r = tl.program_id(0)  # one program per draft row: request b, its i-th draft
    b, i = r // N, r % N
    every = tl.arange(0, BS_BLOCK)
    seqs = tl.load(seq_ptr + every, mask=every < bs, other=0).to(tl.int64)
    if RULE == 0:
        kept_all = tl.minimum(seqs, size)
    else:
        kept_all = seqs % size
    before = tl.sum(tl.where(every < b, kept_all, 0), axis=0)  # kept keys of the requests before b
    seq = tl.load(seq_ptr + b).to(tl.int64)
    if RULE == 0:
        kept = tl.minimum(seq, size)
    else:
        kept = seq % size
    start = seq - kept  # the oldest kept key's position
    pos = tl.load(pos_ptr + r).to(tl.int64)
    if RULE == 0:  # a key at t is seen iff pos - t <= size
        first_seen = tl.maximum(pos - size - start, 0)
    else:  # the kept keys are seq's chunk: seen iff pos is in it
        first_seen = tl.where(pos // size == seq // size, 0, kept)
    request_cells = N * before + N * N * b
    row_start = request_cells + i * (kept + N)
    if i == 0:
        tl.store(kv_indptr_ptr + b, before.to(kv_indptr_ptr.dtype.element_ty))
        tl.store(keys_ptr + b, kept.to(keys_ptr.dtype.element_ty))
        tl.store(starts_ptr + b, start.to(starts_ptr.dtype.element_ty))
        tl.store(mask_indptr_ptr + b, request_cells.to(mask_indptr_ptr.dtype.element_ty))
    if r == bs * N - 1:
        tl.store(kv_indptr_ptr + bs, (before + kept).to(kv_indptr_ptr.dtype.element_ty))
        tl.store(mask_indptr_ptr + bs, (request_cells + N * (kept + N)).to(mask_indptr_ptr.dtype.element_ty))
    # sglang's row for this draft: L + N cells, the drafts' cells after the L cached ones
    stock_row = tl.load(stock_indptr_ptr + b).to(tl.int64) + i * (seq + N) + seq
    for c0 in range(0, kept + N, BLOCK):
        col = c0 + tl.arange(0, BLOCK)
        k = col - kept  # the draft a cell past the kept keys stands for
        is_draft = (k >= 0) & (col < kept + N)
        at = tl.minimum(tl.maximum(stock_row + k, 0), stock_cells - 1)
        allowed = tl.load(stock_ptr + at, mask=is_draft, other=0) != 0
        other = tl.load(pos_ptr + b * N + k, mask=is_draft, other=0).to(tl.int64)
        if RULE == 0:
            near = pos - other <= size
        else:
            near = other // size == pos // size
        seen = tl.where(k < 0, col >= first_seen, allowed & near)
        tl.store(mask_ptr + row_start + col, seen.to(mask_ptr.dtype.element_ty), mask=col < kept + N)


def tree_rail_layout(seq_lens, positions, stock, stock_indptr, rule: int, size: int, n: int, mask_indptr_dtype):
    """The kernel's outputs for a batch: ``(kv_indptr, keys, starts, custom_mask, mask_indptr)``;
    ``custom_mask`` holds ``bs * n * (size + n)`` cells (those past the last row are never read:
    the extend kernel reads each row from ``mask_indptr``)."""
    import torch

    bs, dev = seq_lens.shape[0], seq_lens.device
    kv_indptr = torch.empty(bs + 1, dtype=torch.int32, device=dev)
    keys = torch.empty(bs, dtype=torch.int32, device=dev)
    starts = torch.empty(bs, dtype=torch.int64, device=dev)
    mask = torch.empty(bs * n * (size + n), dtype=stock.dtype, device=dev)
    mask_indptr = torch.empty(bs + 1, dtype=mask_indptr_dtype, device=dev)
    def cells(t):  # a bool mask as its bytes (what the kernel loads and stores)
        return t.view(torch.uint8) if t.dtype == torch.bool else t

    _tree_rail_kernel[(bs * n,)](
        seq_lens, positions, cells(stock), stock_indptr, stock.numel(), kv_indptr, keys, starts, cells(mask),
        mask_indptr, bs, size, N=n, RULE=rule, BS_BLOCK=triton.next_power_of_2(bs), BLOCK=BLOCK)
    return kv_indptr, keys, starts, mask, mask_indptr


@triton.jit
def _chunk_rail_kernel(seq_ptr, indptr_ptr, lens_ptr, starts_ptr, bs, chunk, BS_BLOCK: tl.constexpr):
    every = tl.arange(0, BS_BLOCK)
    seq = tl.load(seq_ptr + every, mask=every < bs, other=0).to(tl.int64)
    lens = tl.where(seq > 0, (seq - 1) % chunk + 1, 0)  # the keys of the last token's chunk
    tl.store(lens_ptr + every, lens.to(lens_ptr.dtype.element_ty), mask=every < bs)
    tl.store(starts_ptr + every, (seq - lens).to(starts_ptr.dtype.element_ty), mask=every < bs)
    tl.store(indptr_ptr + 1 + every, tl.cumsum(lens, axis=0).to(indptr_ptr.dtype.element_ty), mask=every < bs)
    tl.store(indptr_ptr + every, 0, mask=every == 0)


def chunk_rail_layout(seq_lens, chunk: int):
    """A decode's chunk rail, one program: per request the ``(L - 1) % C + 1`` keys of its chunk
    (``L`` keys cached, the new one among them), their first position and offsets; returns
    ``(indptr, lens, starts)`` (int32, int32, int64)."""
    import torch

    bs, dev = seq_lens.shape[0], seq_lens.device
    indptr = torch.empty(bs + 1, dtype=torch.int32, device=dev)
    lens = torch.empty(bs, dtype=torch.int32, device=dev)
    starts = torch.empty(bs, dtype=torch.int64, device=dev)
    _chunk_rail_kernel[(1,)](seq_lens, indptr, lens, starts, bs, chunk, BS_BLOCK=triton.next_power_of_2(bs))
    return indptr, lens, starts
