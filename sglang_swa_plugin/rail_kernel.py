"""Triton kernels that lay out the rails of ``triton_rail`` inside the captured graphs, one launch
each in place of many small device ops: a tree verify's (``tree_rail``: per request its kept
keys' count, first position and offsets, per draft row the mask cells over the kept keys and the
request's drafts; some thirty ops before) and a decode's chunk rail (``chunk_slots``: per request
the keys of its chunk and their offsets; about ten). ``triton_rail`` holds the same layouts in
torch ops (the CPU form); the tests hold the two equal (Triton's interpreter). Also
``triton_swa_draft``'s draft-step window rail (``window_of_rail_layout``) and its draft-extend
translation (``translate_head``), whose torch forms that hook keeps. Imported on first
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


@triton.jit
def _window_of_rail_kernel(indptr_ptr, ids_ptr, n_ids, mapping_ptr, limit, out_indptr_ptr, out_ptr, bs, window,
                           MAPPED: tl.constexpr, BS_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)  # one program per request: its window's slots, then its share of the zero tail
    every = tl.arange(0, BS_BLOCK)
    starts = tl.load(indptr_ptr + every, mask=every < bs, other=0).to(tl.int64)
    ends = tl.load(indptr_ptr + 1 + every, mask=every < bs, other=0).to(tl.int64)
    kept_all = tl.minimum(tl.maximum(ends - starts, 0), window)
    before = tl.sum(tl.where(every < r, kept_all, 0), axis=0)
    total = tl.sum(kept_all, axis=0)
    kept = tl.sum(tl.where(every == r, kept_all, 0), axis=0)
    end = tl.sum(tl.where(every == r, ends, 0), axis=0)
    tl.store(out_indptr_ptr + 1 + r, (before + kept).to(out_indptr_ptr.dtype.element_ty))
    tail = total + r * window - before  # slots past the rail, the deficits of the requests before r
    for c0 in range(0, window, BLOCK):
        s = c0 + tl.arange(0, BLOCK)
        src = end - kept + s
        valid = (s < kept) & (src >= 0) & (src < n_ids)
        ids = tl.load(ids_ptr + src, mask=valid, other=0).to(tl.int64)
        if MAPPED:  # the pool's full->SWA mapping; ids outside it read slot 0
            valid &= (ids >= 0) & (ids < limit)
            ids = tl.load(mapping_ptr + ids, mask=valid, other=0).to(tl.int64)
        tl.store(out_ptr + before + s, tl.where(valid, ids, 0).to(out_ptr.dtype.element_ty), mask=s < kept)
        tl.store(out_ptr + tail + s, tl.zeros_like(s).to(out_ptr.dtype.element_ty), mask=s < window - kept)


def window_of_rail_layout(kv_indptr, kv_indices, mapping, bs: int, window: int, out_indptr, out_ids) -> None:
    """A draft step's window rail, one launch (``hooks.triton_swa_draft.window_rails``' torch
    form): per request the last ``min(L, window)`` keys of its full rail (``kv_indptr``,
    ``kv_indices``), through ``mapping`` (the pool's full->SWA ids; None: kept), packed into
    ``out_ids[:bs * window]`` (zeros after them) with their end offsets at ``out_indptr[1 : bs + 1]``.
    A key past ``kv_indices`` or outside ``mapping`` reads 0."""
    limit = mapping.shape[0] if mapping is not None else 0
    _window_of_rail_kernel[(bs,)](
        kv_indptr, kv_indices, kv_indices.shape[0], mapping if mapping is not None else kv_indices, limit,
        out_indptr, out_ids, bs, window, MAPPED=mapping is not None, BS_BLOCK=triton.next_power_of_2(bs),
        BLOCK=min(BLOCK, triton.next_power_of_2(window)))


@triton.jit
def _translate_head_kernel(out_ptr, indptr_ptr, bs, n, mapping_ptr, limit, BLOCK: tl.constexpr):
    s = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = s < tl.minimum(tl.load(indptr_ptr + bs).to(tl.int64), n)
    ids = tl.load(out_ptr + s, mask=keep, other=0).to(tl.int64)
    ids = tl.where(ids < 0, ids + limit, ids)  # as torch indexes: -1 reads the mapping's last entry
    swa = tl.load(mapping_ptr + ids, mask=keep, other=0)
    tl.store(out_ptr + s, swa.to(out_ptr.dtype.element_ty), mask=keep)


def translate_head(out, indptr, bs: int, n: int, mapping) -> None:
    """``out[:indptr[bs]]`` (at most ``n`` slots; full-pool ids) into ``mapping[ids]`` in place,
    one launch over ``n`` slots (``hooks.triton_swa_draft.translate_window``' torch form); the
    slots after them kept."""
    grid = (triton.cdiv(n, BLOCK),)
    _translate_head_kernel[grid](out, indptr, bs, n, mapping, mapping.shape[0], BLOCK=BLOCK)
