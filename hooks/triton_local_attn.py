"""triton: Llama 4's chunked ("local") layers attend their own chunk, not the whole context.
Bug
    Llama 4's chunked layers have ``use_irope`` and no window; triton picks keys by the window
    only: they attend the whole context (hybrid pool: SWA buffer, full-pool ids): wrong tokens
    once a request passes its first chunk.
    Fix: a chunked layer's decode reads its chunk's keys; its extend and a chain's verify run
    as virtual requests cut at chunk boundaries (as fa3's local batches); a tree's verify (topk
    > 1) reads its chunk's keys under sglang's tree mask re-laid per chunk. Ids in the layer's
    pool space, fixed-size device ops (CUDA graphs). Not covered (one warning names it): a
    unified pool (0.5.23's translating ids), decode context parallelism, deterministic inference.
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

from sglang_swa_plugin import state, triton_rail
from sglang_swa_plugin.chunked import CHUNK, chunk_of as _chunked, reads_use_irope, remember_chunk_hook
from sglang_swa_plugin.fix import Detection, Fix, around
from sglang_swa_plugin.log import warn_once
from sglang_swa_plugin.probe import function_tree, is_attribute, module_tree, nodes, optional_class, own_function
from sglang_swa_plugin.triton_rail import slots as _slots, tree_verify as _tree_verify

NAME = "triton_local_attn"
MODULE = "sglang.srt.layers.attention.triton_backend"
BACKEND = MODULE + ".TritonAttnBackend"
INIT, DECODE, EXTEND = (BACKEND + m for m in (".__init__", ".forward_decode", ".forward_extend"))
_remember_chunk = remember_chunk_hook()  # around __init__
RAIL = "chunk_rail"  # in the backend's state: (metadata, seq_lens, (SWA ids, in capture), metadata)


def _uncovered(path: str) -> None:
    """One warning per process and path: a chunked layer that this fix leaves as sglang runs it."""
    warn_once(NAME, path, "the chunked (local) layers of this model attend over the whole context "
                                      "(tokens differ from the model past the first chunk)")


def _chunk_of(self, layer) -> "int | None":
    """The chunk a chunked layer attends, on the forms this fix covers (the others: one warning)."""
    chunk = _chunked(self, layer)
    if chunk is None or getattr(self, "forward_metadata", None) is None:
        return None
    path = triton_rail.unsupported(self)
    if path is not None:
        _uncovered(path)
        return None
    return chunk


def _decode_fields(self, forward_batch, chunk: int, swa: bool) -> dict:
    """Decode: a request of ``L`` keys reads the ``(L - 1) % C + 1`` from its chunk's start. Device
    ops of a fixed size (``bs * C`` ids), so that a CUDA graph captures them."""
    indptr, indices = triton_rail.chunk_slots(self, forward_batch, chunk, swa)
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
    qo_indptr = triton_rail.offsets(queries)
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
    qo_indptr = triton_rail.offsets(queries)
    lens = torch.stack([before, torch.zeros_like(before)], dim=1).flatten().to(torch.int32)
    starts = torch.stack([seq_lens - before, seq_lens], dim=1).flatten()
    indptr, indices = _slots(self, forward_batch, forward_batch.req_pool_indices.repeat_interleave(2), lens, starts,
                             seq_lens.shape[0] * chunk, swa)
    return {"qo_indptr": qo_indptr, "kv_indptr": indptr, "kv_indices": indices, "max_extend_len": n,
            "custom_mask": None}


def _tree_fields(self, forward_batch, chunk: int, swa: bool) -> dict:
    """Target verify of a tree (topk > 1, ``n`` draft tokens after ``L`` keys): per request the
    ``L % C`` keys from ``L``'s chunk start under sglang's tree mask re-laid for them: a draft at
    position ``p`` sees those keys iff ``p`` is in ``L``'s chunk, and a tree ancestor iff that
    one's position is in ``p``'s chunk (``triton_rail.tree_rail``)."""
    return triton_rail.tree_rail(self, forward_batch, "chunk", chunk, swa)


def _chain_verify(forward_batch, chunk: int) -> bool:
    """A target verify of a chain of at most ``chunk`` draft tokens (topk 1)."""
    spec = getattr(forward_batch, "spec_info", None)
    return (forward_batch.forward_mode.is_target_verify() and getattr(spec, "topk", None) == 1
            and 0 < getattr(spec, "draft_token_num", 0) <= chunk)


def _with_rail(original, build, self, q, k, v, layer, forward_batch, *args, kernel_args=None, **kwargs):
    """For a chunked layer, ``original`` runs with the batch's chunk rail (``build``'s fields) in place
    of the whole-context one (``triton_rail.call_with_rail``); ``kernel_args``: the extend kernel's
    arguments for the call (a tree's rail: ``skip_prefix_custom_mask=False``, its mask hides the
    chunk's keys from drafts past it)."""
    chunk = _chunk_of(self, layer)
    if chunk is None:
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    swa = triton_rail.in_swa_part(triton_rail.pool(self, forward_batch), layer)
    return triton_rail.call_with_rail(original, self, RAIL, swa, lambda be, fb, sw: build(be, fb, chunk, sw),
                                      kernel_args or {}, q, k, v, layer, forward_batch, *args, **kwargs)


def _chunked_decode(original, self, q, k, v, layer, forward_batch, *args, **kwargs):
    """Around ``forward_decode``."""
    return _with_rail(original, _decode_fields, self, q, k, v, layer, forward_batch, *args, **kwargs)


def _chunked_extend(original, self, q, k, v, layer, forward_batch, *args, **kwargs):
    """Around ``forward_extend``: a plain extend, a chain's or a tree's target verify (a draft
    extend has no chunked layer: Llama 4's drafts are plain Llama layers)."""
    chunk, call = state.get(self, CHUNK), (self, q, k, v, layer, forward_batch, *args)
    if _plain_extend(forward_batch):
        return _with_rail(original, _extend_fields, *call, **kwargs)
    if chunk and _chain_verify(forward_batch, chunk):
        return _with_rail(original, _verify_fields, *call, **kwargs)
    if chunk and _tree_verify(forward_batch):
        return _with_rail(original, _tree_fields, *call, kernel_args={"skip_prefix_custom_mask": False}, **kwargs)
    if forward_batch.forward_mode.is_target_verify() and _chunked(self, layer):
        _uncovered("EAGLE verify of more draft tokens than the chunk")
    return original(*call, **kwargs)


def _plain_extend(forward_batch) -> bool:
    """An extend of the target's own tokens (not a verify or a draft extend) with its CPU lengths."""
    return (forward_batch.forward_mode.name in ("EXTEND", "MIXED")
            and getattr(forward_batch, "extend_prefix_lens_cpu", None) is not None
            and getattr(forward_batch, "extend_seq_lens_cpu", None) is not None)


def _picks_by_window(cls, name: str) -> bool:
    fn = own_function(cls, name)
    return fn is not None and any(is_attribute(n, "sliding_window_size", "layer") for n in nodes(function_tree(fn)[0]))


def classify() -> Detection:
    tree, cls = module_tree(MODULE), optional_class(f"{MODULE}.TritonAttnBackend")
    if tree is None or cls is None:
        return Detection.not_applicable("this sglang has no triton attention backend")
    plan = (around(INIT, _remember_chunk), around(DECODE, _chunked_decode), around(EXTEND, _chunked_extend))
    if reads_use_irope(tree):
        return Detection.not_needed("triton's backend reads use_irope (chunked layers)", *plan)
    if not all(_picks_by_window(cls, m) for m in ("forward_decode", "forward_extend")):
        return Detection.unknown("triton's forward_decode/forward_extend no longer pick keys by layer.sliding_window_size")
    moved = triton_rail.missing_gather()
    if moved:
        return Detection.target_moved(moved)
    return Detection.needed("triton picks a layer's keys by its window only: a chunked (use_irope) layer "
                            "attends the whole context", *plan)


class TritonLocalAttnFix(Fix):
    name = NAME
    summary = "triton: Llama 4's chunked layers attend their own chunk (decode, extend, verify)"
    upstream_prs = ()
    wraps = ("triton_one_pool_window", "swa_write_loc")
    targets = (INIT, DECODE, EXTEND)
    target_params = {INIT: ("self", "model_runner"), DECODE: ("self", "q", "k", "v", "layer", "forward_batch"),
                     EXTEND: ("self", "q", "k", "v", "layer", "forward_batch")}
    check_module = "sglang_swa_plugin.check.triton_local_attn"

    def detect(self) -> Detection:
        return classify()


FIX = TritonLocalAttnFix()
