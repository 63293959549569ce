"""triton: Llama 4's chunked ("local") layers attend their own chunk, not the whole context.
Bug
    Llama 4's chunked layers have ``use_irope`` and no window; triton picks keys by the window
    only: they attend the whole context (hybrid pool: SWA buffer, full-pool ids). Llama 4 on
    triton, 0.5.11 and 0.5.17: 0/32 requests equal to the float32 model past the first chunk.
    Fix: a chunked layer's decode reads its chunk's keys; its extend and a chain's verify run
    as virtual requests cut at chunk boundaries (as fa3's local batches), ids in the layer's
    pool space, in fixed-size device ops (CUDA graphs). A tree's verify (topk > 1): preview
    ``triton_local_attn_tree`` (tree mask re-laid per chunk; run through sglang's kernel on a
    CPU, not yet on a GPU). Not covered (one warning names it): a unified pool (0.5.23's
    translating ids), decode context parallelism, deterministic inference.
Upstream PRs
    None: no release's triton reads ``use_irope`` (fa3's local attention: #5092).
Affected versions
    0.5.10-0.5.23. Status by release: applied 0.5.10+.
Detection
    Structural: ``forward_decode``/``forward_extend`` pick keys by ``layer.sliding_window_size``
    and the module never reads ``use_irope``: needed; a module that reads it: not needed.
Delete when
    sglang's triton backend handles chunked layers in every supported release.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import logging

from sglang_swa_plugin.fix import Detection, Fix, around, hookimpl
from sglang_swa_plugin.probe import function_tree, is_attribute, module_tree, nodes, optional_module, own_function

NAME = "triton_local_attn"
MODULE = "sglang.srt.layers.attention.triton_backend"
BACKEND = MODULE + ".TritonAttnBackend"
INIT, DECODE, EXTEND = (BACKEND + m for m in (".__init__", ".forward_decode", ".forward_extend"))
CHUNK = "_sglang_swa_plugin_attention_chunk"  # on the backend: the runner's attention_chunk_size
GATHER = "create_flashinfer_kv_indices_triton"  # sglang's req_to_token gather, where each release keeps it
GATHER_MODULES = (MODULE, "sglang.kernels.ops.attention.kv_indices", "sglang.kernels.ops.kvcache.kv_indices",
                  "sglang.srt.layers.attention.utils")
TREE = "triton_local_attn_tree"  # the preview: a tree's verify (topk > 1)
RAIL = "_sglang_swa_plugin_chunk_rail"  # on the backend: (metadata, seq_lens, (SWA ids, in capture), metadata)
logger = logging.getLogger("sglang.srt.plugins.swa_plugin")
_warned: set = set()


def _remember_chunk(original, self, model_runner, *args, **kwargs):
    """Around ``TritonAttnBackend.__init__``: the backend keeps its runner's chunk size."""
    result = original(self, model_runner, *args, **kwargs)
    vars(self)[CHUNK] = getattr(model_runner, "attention_chunk_size", None)
    return result


def _uncovered(path: str) -> None:
    """One warning per process and path: a chunked layer that this fix leaves as sglang runs it."""
    if path not in _warned:
        _warned.add(path)
        logger.warning("sglang-swa-plugin: %s: %s: the chunked (local) layers of this model attend over the whole "
                       "context (tokens differ from the model past the first chunk); not corrected", NAME, path)


def _chunked(self, layer) -> "int | None":
    """The chunk of a chunked layer (``use_irope``, no window) of a backend built for a chunked model."""
    chunk = vars(self).get(CHUNK)
    if chunk and getattr(layer, "use_irope", False) and getattr(layer, "sliding_window_size", None) in (None, -1):
        return chunk
    return None


def _chunk_of(self, layer) -> "int | None":
    """The chunk a chunked layer attends, on the forms this fix covers (the others: one warning)."""
    chunk = _chunked(self, layer)
    if chunk is None or getattr(self, "forward_metadata", None) is None:
        return None
    translating = (getattr(self, "_translate_kv_loc", None) is not None  # req_to_token: virtual ids
                   or getattr(getattr(self, "kv_index_translator", None), "is_translating", False))
    path = next((p for p, on in (("decode context parallelism", getattr(self, "dcp_size", 1) > 1),
                                 ("deterministic inference", getattr(self, "enable_deterministic", False)),
                                 ("a translating KV index space (unified pool)", translating)) if on), None)
    if path is not None:
        _uncovered(path)
        return None
    return chunk


def _gather():
    return next(f for f in (getattr(optional_module(m), GATHER, None) for m in GATHER_MODULES) if f is not None)


def _pool(self, forward_batch):
    """The KV pool: the backend's (0.5.13+), else the batch's."""
    pool = getattr(self, "token_to_kv_pool", None)
    return pool if pool is not None else forward_batch.token_to_kv_pool


def _in_layer_space(pool, layer) -> bool:
    """Whether ``layer`` sits in the hybrid pool's SWA part (its ids need translating)."""
    mapping = getattr(pool, "layers_mapping", None)
    return bool(mapping and mapping.get(layer.layer_id, (None, False))[1])


def _slots(self, forward_batch, rows, lens, starts, size: int, swa: bool):
    """Per request ``req_to_token[rows[i], starts[i]:][:lens[i]]``, packed (sglang's own gather,
    ``create_flashinfer_kv_indices_triton``) into ``size`` ids; SWA ids where ``swa``."""
    import torch

    indptr = torch.zeros(lens.shape[0] + 1, dtype=torch.int32, device=lens.device)
    indptr[1:] = torch.cumsum(lens, dim=0)
    indices = torch.zeros(size, dtype=torch.int64, device=lens.device)
    _gather()[(lens.shape[0],)](
        self.req_to_token, rows, lens, indptr, starts, indices, self.req_to_token.stride(0))
    return indptr, (_pool(self, forward_batch).translate_loc_from_full_to_swa(indices) if swa else indices)


def _decode_fields(self, forward_batch, chunk: int, swa: bool) -> dict:
    """Decode: a request of ``L`` keys reads the ``(L - 1) % C + 1`` from its chunk's start. Device
    ops of a fixed size (``bs * C`` ids), so that a CUDA graph captures them."""
    import torch

    seq_lens = forward_batch.seq_lens
    lens = torch.minimum((seq_lens - 1) % chunk + 1, seq_lens).to(torch.int32)
    indptr, indices = _slots(self, forward_batch, forward_batch.req_pool_indices, lens, seq_lens - lens,
                             seq_lens.shape[0] * chunk, swa)
    return {"kv_indptr": indptr, "kv_indices": indices}


def virtual_requests(prefix_lens, extend_lens, chunk: int) -> list:
    """Each request's new tokens cut at chunk boundaries, in token order: per virtual request
    ``(request, chunk start, keys before its first query, queries)``."""
    out = []
    for b, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
        first = p
        while first < p + e:
            start = first // chunk * chunk
            end = min(start + chunk, p + e)
            out.append((b, start, first - start, end - first))
            first = end
    return out


def _extend_fields(self, forward_batch, chunk: int, swa: bool) -> dict:
    """Extend: virtual requests whose queries share a chunk; each reads its chunk's keys before
    its first query from the cache, then its own queries' keys causally (as fa3's local batches).
    Split on the host from the batch's CPU lengths, one copy to the device."""
    import torch

    split = virtual_requests(forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu, chunk)
    if not split:  # no new token in the batch: nothing to attend
        return {}
    req, start, pre, queries = torch.tensor(split, dtype=torch.int64).T.to(self.req_to_token.device)
    qo_indptr = torch.zeros(len(split) + 1, dtype=torch.int32, device=pre.device)
    qo_indptr[1:] = torch.cumsum(queries, dim=0)
    indptr, indices = _slots(self, forward_batch, forward_batch.req_pool_indices[req], pre.to(torch.int32), start,
                             sum(s[2] for s in split), swa)
    return {"qo_indptr": qo_indptr, "kv_indptr": indptr, "kv_indices": indices,
            "max_extend_len": max(s[3] for s in split)}


def _verify_fields(self, forward_batch, chunk: int, swa: bool) -> dict:
    """Target verify of a chain (topk 1, ``n <= C`` draft tokens after ``L`` keys): per request two
    virtual requests, the drafts in ``L``'s chunk (its ``L % C`` keys before them) and those past
    the next boundary (none before them); causal, no custom mask. Device ops of a fixed size."""
    import torch

    seq_lens, n = forward_batch.seq_lens, forward_batch.spec_info.draft_token_num
    before = seq_lens % chunk
    first = torch.clamp(chunk - before, max=n)
    queries = torch.stack([first, n - first], dim=1).flatten()
    qo_indptr = torch.zeros(queries.shape[0] + 1, dtype=torch.int32, device=seq_lens.device)
    qo_indptr[1:] = torch.cumsum(queries, dim=0)
    lens = torch.stack([before, torch.zeros_like(before)], dim=1).flatten().to(torch.int32)
    starts = torch.stack([seq_lens - before, seq_lens], dim=1).flatten()
    indptr, indices = _slots(self, forward_batch, forward_batch.req_pool_indices.repeat_interleave(2), lens, starts,
                             seq_lens.shape[0] * chunk, swa)
    return {"qo_indptr": qo_indptr, "kv_indptr": indptr, "kv_indices": indices, "max_extend_len": n,
            "custom_mask": None}


def _tree_fields(self, forward_batch, chunk: int, swa: bool) -> dict:
    """Target verify of a tree (topk > 1, ``n`` draft tokens after ``L`` keys): per request the
    ``L % C`` keys from ``L``'s chunk start, and sglang's tree mask re-laid for them (``n`` rows of
    ``L % C + n`` cells, the cached keys' cells read too): a draft at position ``p`` sees those
    keys iff ``p`` is in ``L``'s chunk, and a tree ancestor iff that one's position is in ``p``'s
    chunk. Device ops of a fixed size (``bs * n * (C + n)`` cells, int32)."""
    import torch

    md, n = self.forward_metadata, forward_batch.spec_info.draft_token_num
    seq, dev = forward_batch.seq_lens.to(torch.int64), forward_batch.seq_lens.device
    bs, before = seq.shape[0], seq % chunk
    indptr, indices = _slots(self, forward_batch, forward_batch.req_pool_indices, before.to(torch.int32),
                             seq - before, bs * chunk, swa)
    # per query row (request b, draft i): its cached keys seen or not, its drafts seen or not
    row = torch.arange(bs * n, device=dev)
    b, cached = row // n, before.repeat_interleave(n)
    row_start = torch.zeros(bs * n + 1, dtype=torch.int32, device=dev)
    row_start[1:] = torch.cumsum(cached + n, dim=0)
    query_chunk = forward_batch.positions.to(torch.int64) // chunk
    sees_cached = query_chunk == (seq // chunk)[b]
    k = torch.arange(n, device=dev)
    stock = md.custom_mask  # sglang's rows of L + n cells
    at = (md.mask_indptr[b].to(torch.int64) + (row % n) * (seq[b] + n) + seq[b])[:, None] + k
    draft_chunk = query_chunk.view(bs, n)[b]  # [row, k]: the chunk of draft k of the row's request
    sees_draft = (stock[at.clamp_(0, stock.numel() - 1)].bool() & (draft_chunk == query_chunk[:, None])).flatten()
    # per mask cell: its row, its column, then what that row sees there
    cell = torch.arange(bs * n * (chunk + n), dtype=torch.int32, device=dev)
    r = torch.searchsorted(row_start[1:], cell, right=True, out_int32=True).clamp_(max=bs * n - 1)
    col = cell - row_start[r]
    keys = cached[r]
    seen = torch.where(col < keys, sees_cached[r], sees_draft[r * n + (col - keys).clamp_(0, n - 1)])
    seen &= cell < row_start[-1]
    return {"kv_indptr": indptr, "kv_indices": indices, "custom_mask": seen.to(stock.dtype),
            "mask_indptr": row_start[::n].to(md.mask_indptr.dtype)}


def _tree_verify(forward_batch) -> bool:
    """A target verify of an EAGLE tree (topk > 1) with its mask."""
    spec = getattr(forward_batch, "spec_info", None)
    return (forward_batch.forward_mode.is_target_verify() and (getattr(spec, "topk", None) or 1) > 1
            and getattr(spec, "draft_token_num", 0) > 0)


def _chain_verify(forward_batch, chunk: int) -> bool:
    """A target verify of a chain of at most ``chunk`` draft tokens (topk 1)."""
    spec = getattr(forward_batch, "spec_info", None)
    return (forward_batch.forward_mode.is_target_verify() and getattr(spec, "topk", None) == 1
            and 0 < getattr(spec, "draft_token_num", 0) <= chunk)


def _with_rail(original, build, self, q, k, v, layer, forward_batch, *args, prefix_mask: bool = False, **kwargs):
    """For a chunked layer, ``original`` runs with the batch's chunk rail (``build``'s fields) in place
    of the whole-context one, built once per forward and pool part and shared by the layers; the
    backend's metadata is put back after the call. ``prefix_mask``: the extend kernel reads the
    rail's mask over the cached keys too (``skip_prefix_custom_mask=False``; a tree's rail hides
    the chunk's keys from drafts past it)."""
    chunk = _chunk_of(self, layer)
    if chunk is None:
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    metadata, key = self.forward_metadata, (_in_layer_space(_pool(self, forward_batch), layer), _capturing())
    rail = vars(self).get(RAIL)
    # a CUDA graph's warm-up runs share the capture's metadata: the capture builds its own rail
    if rail is None or rail[0] is not metadata or rail[1] is not forward_batch.seq_lens or rail[2] != key:
        rail = vars(self)[RAIL] = (metadata, forward_batch.seq_lens, key,
                                   dataclasses.replace(metadata, **build(self, forward_batch, chunk, key[0])))
    self.forward_metadata = rail[3]
    kernel = self.extend_attention_fwd if prefix_mask else None
    if kernel is not None:
        self.extend_attention_fwd = functools.partial(kernel, skip_prefix_custom_mask=False)
    try:
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    finally:
        self.forward_metadata = metadata
        if kernel is not None:
            self.extend_attention_fwd = kernel


def _chunked_decode(original, self, q, k, v, layer, forward_batch, *args, **kwargs):
    """Around ``forward_decode``."""
    return _with_rail(original, _decode_fields, self, q, k, v, layer, forward_batch, *args, **kwargs)


def _chunked_extend(original, self, q, k, v, layer, forward_batch, *args, **kwargs):
    """Around ``forward_extend``: a plain extend, or a chain's target verify (a tree's verify and a
    draft extend are not covered)."""
    chunk, call = vars(self).get(CHUNK), (self, q, k, v, layer, forward_batch, *args)
    if _plain_extend(forward_batch):
        return _with_rail(original, _extend_fields, *call, **kwargs)
    if chunk and _chain_verify(forward_batch, chunk):
        return _with_rail(original, _verify_fields, *call, **kwargs)
    tree = _tree_verify(forward_batch)
    if chunk and tree and TREE in FIX.previews_on:
        return _with_rail(original, _tree_fields, *call, prefix_mask=True, **kwargs)
    if forward_batch.forward_mode.is_target_verify() and _chunked(self, layer):
        _uncovered(f"EAGLE tree verify (topk > 1; topk 1 and the fa3 backend are corrected; the preview "
                   f"SGLANG_SWA_PLUGIN_PREVIEW={TREE} corrects it, not yet run on a GPU)" if tree
                   else "EAGLE verify of more draft tokens than the chunk")
    return original(*call, **kwargs)


def _capturing() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _plain_extend(forward_batch) -> bool:
    """An extend of the target's own tokens (not a verify or a draft extend) with its CPU lengths."""
    return (forward_batch.forward_mode.name in ("EXTEND", "MIXED")
            and getattr(forward_batch, "extend_prefix_lens_cpu", None) is not None
            and getattr(forward_batch, "extend_seq_lens_cpu", None) is not None)


def _reads_use_irope(tree) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "use_irope" for n in ast.walk(tree))


def _picks_by_window(cls, name: str) -> bool:
    fn = own_function(cls, name)
    return fn is not None and any(is_attribute(n, "sliding_window_size", "layer") for n in nodes(function_tree(fn)[0]))


def classify() -> Detection:
    tree, mod = module_tree(MODULE), optional_module(MODULE)
    cls = getattr(mod, "TritonAttnBackend", None)
    if tree is None or cls is None:
        return Detection.not_applicable("this sglang has no triton attention backend")
    plan = (around(INIT, _remember_chunk), around(DECODE, _chunked_decode), around(EXTEND, _chunked_extend))
    if _reads_use_irope(tree):
        return Detection.not_needed("triton's backend reads use_irope (chunked layers)", *plan)
    if not all(_picks_by_window(cls, m) for m in ("forward_decode", "forward_extend")):
        return Detection.unknown("triton's forward_decode/forward_extend no longer pick keys by layer.sliding_window_size")
    if not any(hasattr(optional_module(m), GATHER) for m in GATHER_MODULES):
        return Detection.target_moved(f"sglang's {GATHER} is in none of " + ", ".join(GATHER_MODULES))
    return Detection.needed("triton picks a layer's keys by its window only: a chunked (use_irope) layer "
                            "attends the whole context", *plan)


class TritonLocalAttnFix(Fix):
    name = NAME
    summary = "triton: Llama 4's chunked layers attend their own chunk (decode and extend)"
    upstream_prs = ()
    previews = {TREE: "Llama 4's EAGLE tree verify (topk > 1) on triton: each draft attends its chunk's cached keys "
                      "and its tree ancestors in that chunk"}
    targets = (INIT, DECODE, EXTEND)
    target_params = {INIT: ("self", "model_runner"), DECODE: ("self", "q", "k", "v", "layer", "forward_batch"),
                     EXTEND: ("self", "q", "k", "v", "layer", "forward_batch")}
    check_module = "sglang_swa_plugin.check.triton_local_attn"

    def detect(self) -> Detection:
        return classify()


FIX = TritonLocalAttnFix()


@hookimpl
def sglang_swa_plugin_fixes():
    return [FIX]
