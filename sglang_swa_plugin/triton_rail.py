"""Rails for sglang's Triton attention kernels, shared by the triton fixes that hand a layer
other keys than sglang picks (``triton_local_attn``: Llama 4's chunks; ``triton_swa_tree_verify``:
a tree's window): requests' key ids gathered by sglang's own kernel, in the layer's pool space;
an EAGLE tree's mask re-laid for those keys; and the call of a backend method with the rail in
place of the backend's metadata. Device ops of fixed sizes, so that a CUDA graph captures them;
runtime only."""

from __future__ import annotations

import dataclasses
import functools

from .probe import optional_module

GATHER = "create_flashinfer_kv_indices_triton"  # sglang's req_to_token gather, where each release keeps it
GATHER_MODULES = ("sglang.srt.layers.attention.triton_backend", "sglang.kernels.ops.attention.kv_indices",
                  "sglang.kernels.ops.kvcache.kv_indices", "sglang.srt.layers.attention.utils")


def unsupported(self) -> "str | None":
    """The backend form a rail does not cover (None: covered): decode context parallelism,
    deterministic inference (sglang's unified kernel), a translating KV index space (0.5.23's
    unified pool: req_to_token holds virtual ids)."""
    translating = (getattr(self, "_translate_kv_loc", None) is not None
                   or getattr(getattr(self, "kv_index_translator", None), "is_translating", False))
    return next((p for p, on in (("decode context parallelism", getattr(self, "dcp_size", 1) > 1),
                                 ("deterministic inference", getattr(self, "enable_deterministic", False)),
                                 ("a translating KV index space (unified pool)", translating)) if on), None)


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
    import torch

    indptr = torch.zeros(lens.shape[0] + 1, dtype=torch.int32, device=lens.device)
    indptr[1:] = torch.cumsum(lens, dim=0)
    indices = torch.zeros(size, dtype=torch.int64, device=lens.device)
    _gather()[(lens.shape[0],)](
        self.req_to_token, rows, lens, indptr, starts, indices, self.req_to_token.stride(0))
    return indptr, (pool(self, forward_batch).translate_loc_from_full_to_swa(indices) if swa else indices)


def tree_verify(forward_batch) -> bool:
    """A target verify of an EAGLE tree (topk > 1) with its mask."""
    spec = getattr(forward_batch, "spec_info", None)
    return (forward_batch.forward_mode.is_target_verify() and (getattr(spec, "topk", None) or 1) > 1
            and getattr(spec, "draft_token_num", 0) > 0)


def tree_rail(self, forward_batch, keys, first_seen, draft_seen, capacity: int, swa: bool) -> dict:
    """A tree verify's rail (``n`` drafts per request after its ``L`` keys): per request its last
    ``keys[b]`` cached keys (at most ``capacity``), and sglang's tree mask re-laid for them (rows
    of ``keys[b] + n`` cells; the cached keys' cells read too: call the kernel with
    ``skip_prefix_custom_mask=False``). Draft row ``r`` sees cached key ``j`` (0 = the oldest
    kept) iff ``j >= first_seen[r]``, and draft ``k`` of its request iff sglang's mask lets it and
    ``draft_seen[r, k]``. Returns the metadata fields ``kv_indptr``, ``kv_indices``,
    ``custom_mask``, ``mask_indptr``; fixed sizes (``bs * n * (capacity + n)`` cells, int32)."""
    import torch

    md, n = self.forward_metadata, forward_batch.spec_info.draft_token_num
    seq, dev = forward_batch.seq_lens.to(torch.int64), forward_batch.seq_lens.device
    bs, keys = seq.shape[0], keys.to(torch.int64)
    indptr, indices = slots(self, forward_batch, forward_batch.req_pool_indices, keys.to(torch.int32), seq - keys,
                            bs * capacity, swa)
    row = torch.arange(bs * n, device=dev)
    b, cached = row // n, keys.repeat_interleave(n)
    row_start = torch.zeros(bs * n + 1, dtype=torch.int32, device=dev)
    row_start[1:] = torch.cumsum(cached + n, dim=0)
    stock = md.custom_mask  # sglang's rows of L + n cells
    at = (md.mask_indptr[b].to(torch.int64) + (row % n) * (seq[b] + n) + seq[b])[:, None] + torch.arange(n, device=dev)
    sees_draft = (stock[at.clamp_(0, stock.numel() - 1)].bool() & draft_seen).flatten()
    # per mask cell: its row, its column, then what that row sees there
    cell = torch.arange(bs * n * (capacity + n), dtype=torch.int32, device=dev)
    r = torch.searchsorted(row_start[1:], cell, right=True, out_int32=True).clamp_(max=bs * n - 1)
    col = cell - row_start[r]
    kept = cached[r]
    seen = torch.where(col < kept, col >= first_seen[r], sees_draft[r * n + (col - kept).clamp_(0, n - 1)])
    seen &= cell < row_start[-1]
    return {"kv_indptr": indptr, "kv_indices": indices, "custom_mask": seen.to(stock.dtype),
            "mask_indptr": row_start[::n].to(md.mask_indptr.dtype)}


def capturing() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def call_with_rail(original, self, store: str, swa: bool, build, kernel_args: dict, q, k, v, layer, forward_batch,
                   *args, **kwargs):
    """``original`` (a backend method) with the batch's rail (``build(self, forward_batch, swa)``'s
    metadata fields) in place of the backend's metadata, built once per forward and pool part
    (kept on the backend under ``store``) and shared by the layers; ``kernel_args``: arguments
    the extend kernel takes for the call in place of sglang's (e.g. ``skip_prefix_custom_mask``).
    The backend's metadata and kernel are put back after the call."""
    metadata, key = self.forward_metadata, (swa, capturing())
    rail = vars(self).get(store)
    # a CUDA graph's warm-up runs share the capture's metadata: the capture builds its own rail
    if rail is None or rail[0] is not metadata or rail[1] is not forward_batch.seq_lens or rail[2] != key:
        rail = vars(self)[store] = (metadata, forward_batch.seq_lens, key,
                                    dataclasses.replace(metadata, **build(self, forward_batch, swa)))
    self.forward_metadata = rail[3]
    kernel = self.extend_attention_fwd if kernel_args else None
    if kernel is not None:
        self.extend_attention_fwd = kernel_with(kernel, kernel_args)
    try:
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    finally:
        self.forward_metadata = metadata
        if kernel is not None:
            self.extend_attention_fwd = kernel


def kernel_with(kernel, kernel_args: dict):
    """``kernel`` called with ``kernel_args`` in place of the caller's (sglang passes
    ``sliding_window_size`` and ``window_kv_offsets`` itself)."""
    return functools.partial(_with_args, kernel, kernel_args)


def _with_args(kernel, kernel_args, *args, **kwargs):
    return kernel(*args, **{**kwargs, **kernel_args})
