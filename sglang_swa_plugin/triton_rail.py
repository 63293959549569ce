"""Rails for sglang's Triton attention kernels, shared by the triton fixes that hand a layer
other keys than sglang picks (``triton_local_attn``: Llama 4's chunks; ``triton_swa_tree_verify``:
a tree's window): requests' key ids gathered by sglang's own kernel, in the layer's pool space;
an EAGLE tree's mask re-laid for those keys; and the call of a backend method with the rail in
place of the backend's metadata. Device ops of fixed sizes, so that a CUDA graph captures them;
on a GPU each layout is one Triton kernel (``rail_kernel``), its torch form here for CPUs;
runtime only."""

from __future__ import annotations

import dataclasses
import functools
import os

from . import state
from .graphed import capturing
from .probe import optional_module

GATHER = "create_flashinfer_kv_indices_triton"  # sglang's req_to_token gather, where each release keeps it
GATHER_MODULES = ("sglang.srt.layers.attention.triton_backend", "sglang.kernels.ops.attention.kv_indices",
                  "sglang.kernels.ops.kvcache.kv_indices", "sglang.srt.layers.attention.utils")


UNIFIED = "extend_attention_fwd_unified"  # deterministic inference's extend kernel (sglang's unified 1-stage)


def unsupported(self, unified: bool = False) -> "str | None":
    """The backend form a rail does not cover (None: covered): decode context parallelism,
    deterministic inference (sglang's unified kernel; covered where ``unified`` and the backend
    has that kernel), a translating KV index space (0.5.23's unified pool: req_to_token holds
    virtual ids)."""
    translating = (getattr(self, "_translate_kv_loc", None) is not None
                   or getattr(getattr(self, "kv_index_translator", None), "is_translating", False))
    deterministic = deterministic_kernel(self) and not (unified and hasattr(self, UNIFIED))
    return next((p for p, on in (("decode context parallelism", getattr(self, "dcp_size", 1) > 1),
                                 ("deterministic inference", deterministic),
                                 ("a translating KV index space (unified pool)", translating)) if on), None)


def deterministic_kernel(self) -> bool:
    """Whether the backend's extends run sglang's unified kernel (deterministic inference)."""
    return bool(getattr(self, "enable_deterministic", False))


def offsets(lens, dtype=None):
    """``[0, lens[0], lens[0] + lens[1], ...]``: the packed offsets of ``lens`` (int32 unless
    ``dtype``)."""
    import torch

    out = torch.zeros(lens.shape[0] + 1, dtype=dtype or torch.int32, device=lens.device)
    out[1:] = torch.cumsum(lens, dim=0)
    return out


def missing_gather() -> "str | None":
    """Why a rail cannot be gathered on this sglang (None: sglang's gather is there)."""
    if any(hasattr(optional_module(m), GATHER) for m in GATHER_MODULES):
        return None
    return f"sglang's {GATHER} is in none of " + ", ".join(GATHER_MODULES)


def _gather():
    return next(f for f in (getattr(optional_module(m), GATHER, None) for m in GATHER_MODULES) if f is not None)


def pool(self, forward_batch):
    """The KV pool: the backend's (0.5.13+), else the batch's."""
    kv = getattr(self, "token_to_kv_pool", None)
    return kv if kv is not None else forward_batch.token_to_kv_pool


def in_swa_part(kv_pool, layer) -> bool:
    """Whether ``layer`` sits in the hybrid pool's SWA part (its ids need translating)."""
    mapping = getattr(kv_pool, "layers_mapping", None)
    return bool(mapping and mapping.get(layer.layer_id, (None, False))[1])


def slots(self, forward_batch, rows, lens, starts, size: int, swa: bool):
    """Per request ``req_to_token[rows[i], starts[i]:][:lens[i]]``, packed (sglang's own gather)
    into ``size`` ids; SWA ids where ``swa``. Returns ``(indptr, ids)``."""
    indptr = offsets(lens)
    return indptr, packed(self, forward_batch, rows, lens, indptr, starts, size, swa)


def packed(self, forward_batch, rows, lens, indptr, starts, size: int, swa: bool):
    """:func:`slots`' ids, for the offsets ``indptr`` of ``lens`` given."""
    import torch

    indices = torch.zeros(size, dtype=torch.int64, device=lens.device)
    _gather()[(lens.shape[0],)](
        self.req_to_token, rows, lens, indptr, starts, indices, self.req_to_token.stride(0))
    return pool(self, forward_batch).translate_loc_from_full_to_swa(indices) if swa else indices


def chunk_slots(self, forward_batch, chunk: int, swa: bool):
    """A decode's chunk rail: per request of ``L`` keys (the new one among them) the
    ``(L - 1) % chunk + 1`` from its chunk's start, packed into ``bs * chunk`` ids (SWA ids where
    ``swa``). Returns ``(indptr, ids)``; on a GPU (or under Triton's interpreter) one kernel lays
    out the offsets (``rail_kernel``), else torch ops."""
    seq = forward_batch.seq_lens
    if kernel_lays_out(seq):
        from .rail_kernel import chunk_rail_layout

        indptr, lens, starts = chunk_rail_layout(seq, chunk)
    else:
        indptr, lens, starts = _chunk_layout(seq, chunk)
    return indptr, packed(self, forward_batch, forward_batch.req_pool_indices, lens, indptr, starts,
                          seq.shape[0] * chunk, swa)


def _chunk_layout(seq, chunk: int):
    """``rail_kernel.chunk_rail_layout`` in torch ops (the CPU form)."""
    import torch

    lens = torch.minimum((seq - 1) % chunk + 1, seq).to(torch.int32)
    return offsets(lens), lens, seq.to(torch.int64) - lens


def tree_verify(forward_batch) -> bool:
    """A target verify of an EAGLE tree (topk > 1) with its mask."""
    spec = getattr(forward_batch, "spec_info", None)
    return (forward_batch.forward_mode.is_target_verify() and (getattr(spec, "topk", None) or 1) > 1
            and getattr(spec, "draft_token_num", 0) > 0)


def masked_verify(self, forward_batch) -> bool:
    """A target verify of EAGLE drafts (any topk) whose metadata carries sglang's mask."""
    spec = getattr(forward_batch, "spec_info", None)
    return (forward_batch.forward_mode.is_target_verify() and getattr(spec, "draft_token_num", 0) > 0
            and getattr(self.forward_metadata, "custom_mask", None) is not None)


RULES = {"window": 0, "chunk": 1}  # a tree rail's rules (rail_kernel's numbers)


def tree_rail(self, forward_batch, rule: str, size: int, swa: bool) -> dict:
    """A tree verify's rail (``n`` drafts per request after its ``L`` keys): per request its last
    ``keys`` cached keys (at most ``size``), and sglang's tree mask re-laid for them (rows of
    ``keys + n`` cells; the cached keys' cells read too: call the kernel with
    ``skip_prefix_custom_mask=False``). ``rule`` "window" (a sliding window of ``size``): the last
    ``min(L, size)`` keys; a draft at ``p`` sees a key or ancestor at ``t`` iff ``p - t <= size``.
    "chunk" (chunks of ``size``): the ``L % size`` keys of ``L``'s chunk; a draft sees them iff
    it is in that chunk, an ancestor iff in the draft's chunk. A draft sees an ancestor only where
    sglang's mask lets it. Returns the metadata fields ``kv_indptr``, ``kv_indices``,
    ``custom_mask``, ``mask_indptr``; fixed sizes (``bs * n * (size + n)`` cells). On a GPU (or
    under Triton's interpreter) one kernel lays them out (``rail_kernel``), else torch ops."""
    md, n = self.forward_metadata, forward_batch.spec_info.draft_token_num
    seq, pos = forward_batch.seq_lens, forward_batch.positions
    if kernel_lays_out(seq):
        from .rail_kernel import tree_rail_layout

        kv_indptr, keys, starts, mask, mask_indptr = tree_rail_layout(
            seq, pos, md.custom_mask, md.mask_indptr, RULES[rule], size, n, md.mask_indptr.dtype)
    else:
        kv_indptr, keys, starts, mask, mask_indptr = _layout(seq, pos, md, rule, size, n)
    indices = packed(self, forward_batch, forward_batch.req_pool_indices, keys, kv_indptr, starts, seq.shape[0] * size,
                     swa)
    return {"kv_indptr": kv_indptr, "kv_indices": indices, "custom_mask": mask, "mask_indptr": mask_indptr}


def kernel_lays_out(seq) -> bool:
    """Whether a rail's layout (:func:`tree_rail`, :func:`chunk_slots`) runs its Triton kernel: on
    a GPU, or under Triton's interpreter (the tests); else its torch form."""
    return seq.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def _layout(seq, pos, md, rule: str, size: int, n: int):
    """``rail_kernel.tree_rail_layout`` in torch ops (the CPU form): ``(kv_indptr, keys, starts,
    custom_mask, mask_indptr)``."""
    import torch

    seq, pos, dev = seq.to(torch.int64), pos.to(torch.int64), seq.device
    bs = seq.shape[0]
    row = torch.arange(bs * n, device=dev)
    b = row // n
    if rule == "window":
        keys = torch.clamp(seq, max=size)
        first_seen = torch.clamp(pos - size - (seq - keys)[b], min=0)
        draft_seen = pos[:, None] - pos.view(-1, n)[b] <= size
    else:
        keys = seq % size
        chunk = pos // size
        first_seen = torch.where(chunk == (seq // size)[b], 0, keys[b])
        draft_seen = chunk.view(-1, n)[b] == chunk[:, None]
    cached = keys.repeat_interleave(n)
    row_start = offsets(cached + n)
    stock = md.custom_mask  # sglang's rows of L + n cells
    at = (md.mask_indptr[b].to(torch.int64) + (row % n) * (seq[b] + n) + seq[b])[:, None] + torch.arange(n, device=dev)
    sees_draft = (stock[at.clamp_(0, stock.numel() - 1)].bool() & draft_seen).flatten()
    # per mask cell: its row, its column, then what that row sees there
    cell = torch.arange(bs * n * (size + n), dtype=torch.int32, device=dev)
    r = torch.searchsorted(row_start[1:], cell, right=True, out_int32=True).clamp_(max=bs * n - 1)
    col = cell - row_start[r]
    kept = cached[r]
    seen = torch.where(col < kept, col >= first_seen[r], sees_draft[r * n + (col - kept).clamp_(0, n - 1)])
    seen &= cell < row_start[-1]
    return (offsets(keys), keys.to(torch.int32), seq - keys, seen.to(stock.dtype),
            row_start[::n].to(md.mask_indptr.dtype))


def call_with_rail(original, self, store: str, swa: bool, build, kernel_args: dict, q, k, v, layer, forward_batch,
                   *args, kernel_name: str = "extend_attention_fwd", **kwargs):
    """``original`` (a backend method) with the batch's rail (``build(self, forward_batch, swa)``'s
    metadata fields) in place of the backend's metadata, built once per forward and pool part
    (kept in the backend's state under ``store``) and shared by the layers; ``kernel_args``: arguments
    the backend's kernel ``kernel_name`` (the extend kernel unless named) takes for the call in
    place of sglang's (e.g. ``skip_prefix_custom_mask``). The backend's metadata and kernel are
    put back after the call."""
    metadata, key = self.forward_metadata, (swa, capturing())
    rail = state.get(self, store)
    # a CUDA graph's warm-up runs share the capture's metadata: the capture builds its own rail
    if rail is None or rail[0] is not metadata or rail[1] is not forward_batch.seq_lens or rail[2] != key:
        rail = state.of(self)[store] = (metadata, forward_batch.seq_lens, key,
                                    dataclasses.replace(metadata, **build(self, forward_batch, swa)))
    self.forward_metadata = rail[3]
    kernel = getattr(self, kernel_name) if kernel_args else None
    if kernel is not None:
        setattr(self, kernel_name, kernel_with(kernel, kernel_args))
    try:
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    finally:
        self.forward_metadata = metadata
        if kernel is not None:
            setattr(self, kernel_name, kernel)


def kernel_with(kernel, kernel_args: dict):
    """``kernel`` called with ``kernel_args`` in place of the caller's (sglang passes
    ``sliding_window_size`` and ``window_kv_offsets`` itself)."""
    return functools.partial(_with_args, kernel, kernel_args)


def _with_args(kernel, kernel_args, *args, **kwargs):
    return kernel(*args, **{**kwargs, **kernel_args})
