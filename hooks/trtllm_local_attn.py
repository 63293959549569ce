"""trtllm_mha: Llama 4's chunked ("local") layers attend their own chunk, not the whole context.
Bug
    Llama 4's chunked layers have ``use_irope`` and no window; trtllm_mha hands its kernels
    ``window_left=layer.sliding_window_size`` (-1): they attend the whole context. trtllm_mha is
    sglang's choice for Llama 4 on Blackwell (sm100). Fix: a chunked layer's decode-kernel rows
    (decode; each draft row of a verify as its own row) read from their chunk's first page; the
    context kernel gets virtual requests cut at chunk boundaries (sglang's fa3 splitter). Device
    ops of a fixed size for the decode kernel (CUDA graphs). Not covered (one warning names it):
    a chunk the page size does not tile, 0.5.17+'s ragged verify, context parallel; the prefill
    part is a preview (not run on a GPU: Blackwell's context kernel; Hopper's fmha_v2, 0.5.19+).
Upstream PRs
    None: no release's trtllm_mha reads ``use_irope`` (fa3's local attention: #5092).
Affected versions
    0.5.10-0.5.23. Status by release: applied 0.5.10+.
Detection
    Structural: ``forward_decode``/``forward_extend`` hand a kernel ``window_left=layer.
    sliding_window_size`` and the module never reads ``use_irope``: needed; reads it: not needed.
Delete when
    sglang's trtllm_mha backend handles chunked layers in every supported release.
"""

from __future__ import annotations

import ast
from typing import Any, Optional

from sglang_swa_plugin import state
from sglang_swa_plugin.chunked import chunk_of, reads_use_irope, remember_chunk_hook
from sglang_swa_plugin.fa3_local import local_batches
from sglang_swa_plugin.fix import Detection, Fix, argument, around
from sglang_swa_plugin.graphed import capturing
from sglang_swa_plugin.log import warn_once
from sglang_swa_plugin.probe import module_tree, optional_class, own_function, swapped
from sglang_swa_plugin.trtllm_mha import (CLASS, FORWARD_DECODE, FORWARD_DECODE_PARAMS, FORWARD_EXTEND,
                                          FORWARD_EXTEND_PARAMS, MODULE, ModuleView, PerPass, exact_query,
                                          flashinfer_view, one_token_lens, syntax)

NAME = "trtllm_local_attn"
PREFILL = "trtllm_local_attn_prefill"  # the preview: the context kernels' virtual requests
INIT = CLASS + ".__init__"
_remember_chunk = remember_chunk_hook()  # around __init__
STATE, VIEW = "chunk_state", "chunk_flashinfer"  # in the backend's state: a _State, its flashinfer view


def _uncovered(path: str) -> None:
    warn_once(NAME, path, "the chunked (local) layers of this model attend over the whole context "
                                      "(tokens differ from the model past the first chunk)")


def chunk_rows(seq_lens: Any, block_tables: Any, q_len: int, chunk: int, page: int):
    """Decode-kernel rows of a chunked layer: each query row (a verify's draft rows one by one) as
    a request of its own that starts at its chunk's first page, ``L - start`` keys for a row of
    ``L`` (``start = (L - 1) // chunk * chunk``, a whole number of pages). Device ops of a fixed size."""
    import torch

    dev, pages = block_tables.device, block_tables.shape[1]
    rows = torch.arange(block_tables.shape[0], device=dev)  # each row's request
    lens, rows = (one_token_lens(seq_lens, q_len), rows.repeat_interleave(q_len)) if q_len > 1 else (seq_lens, rows)
    start = torch.div((lens - 1).clamp(min=0), chunk, rounding_mode="floor") * chunk
    cols = torch.arange(pages, device=dev)[None, :] + torch.div(start, page, rounding_mode="floor")[:, None].long()
    return (lens - start).to(seq_lens.dtype), block_tables[rows[:, None], cols.clamp_(max=pages - 1)]


def context_split(forward_batch: Any, block_tables: Any, chunk: int, page: int) -> Optional[dict]:
    """The context kernel's arguments for virtual requests whose queries share a chunk (sglang's
    own splitter, as fa3's local attention), from the batch's CPU lengths; None where the batch
    has none (a CUDA-graph capture). ``block_tables``: ``[B, pages]``, or fmha_v2's ``[B, 2, pages]``
    (K's pages, then V's: each part split alike)."""
    import numpy as np
    import torch

    ext, seq = getattr(forward_batch, "extend_seq_lens_cpu", None), getattr(forward_batch, "seq_lens_cpu", None)
    if ext is None or seq is None or capturing():
        return None
    cu_q = np.zeros(len(ext) + 1, dtype=np.int32)
    cu_q[1:] = np.cumsum(np.asarray(ext, dtype=np.int64))
    lens = np.asarray(seq.tolist() if hasattr(seq, "tolist") else seq, dtype=np.int32)
    tables = [block_tables] if block_tables.dim() == 2 else block_tables.unbind(1)
    parts = [local_batches(chunk, cu_q, lens, t, page) for t in tables]
    q, cu_q_local, k, _ = parts[0]
    blocks = parts[0][3] if block_tables.dim() == 2 else torch.stack([p[3] for p in parts], dim=1)
    k = np.asarray(k, dtype=np.int32)
    host = {"seq_lens": k, "cum_seq_lens_q": np.asarray(cu_q_local, dtype=np.int32),
            "cum_seq_lens_kv": np.concatenate([[0], np.cumsum(k)]).astype(np.int32)}
    return {**{n: torch.from_numpy(np.ascontiguousarray(a)).to(block_tables.device) for n, a in host.items()},
            "block_tables": blocks.to(block_tables.dtype), "batch_size": int(len(k)), "max_q_len": int(q.max()),
            "rows": int(cu_q[-1])}


class _State:
    """Per backend: the layer being run, its chunk and page, the batch, whether a kernel entry of
    this fix ran, and the derivations shared by the layers of one forward pass."""

    def __init__(self) -> None:
        self.layer_id, self.chunk, self.page, self.batch, self.used, self.prefill = -1, 0, 1, None, False, False
        self.rows, self.split = PerPass(), PerPass()


def _chunk_flashinfer(flashinfer: Any, state: _State) -> ModuleView:
    """``flashinfer`` whose decode and context entry points run a chunked layer by chunk."""
    decode = flashinfer.decode.trtllm_batch_decode_with_kv_cache

    def trtllm_batch_decode_with_kv_cache(*args: Any, **kwargs: Any) -> Any:
        if args or not {"query", "seq_lens", "block_tables"} <= kwargs.keys() or kwargs.get("cum_seq_lens_q") is not None:
            return decode(*args, **kwargs)  # a form this fix does not rewrite (ragged verify): warned after
        q_len = kwargs.get("q_len_per_req") or 1
        if q_len > 1:
            kwargs.update(query=exact_query(kwargs["query"], kwargs.get("out_dtype")), q_len_per_req=1)
            kwargs.pop("mask", None)
        seq_lens, table = kwargs["seq_lens"], kwargs["block_tables"]
        kwargs["seq_lens"], kwargs["block_tables"] = state.rows.get(
            state.layer_id, (seq_lens, table), (q_len, state.chunk, state.page),
            lambda: chunk_rows(seq_lens, table, q_len, state.chunk, state.page))
        state.used, kwargs["window_left"] = True, -1
        return decode(**kwargs)

    def by_virtual_requests(rows: int, kwargs: dict) -> Optional[dict]:
        """A context call's keyword arguments with its batch cut into virtual requests; None where
        it cannot be (no CPU lengths, or a part of the batch: context parallel; warned after)."""
        table, fb = kwargs.get("block_tables"), state.batch
        split = None if table is None or fb is None or not state.prefill else state.split.get(
            state.layer_id, (table, fb), (state.chunk, state.page),
            lambda: context_split(fb, table, state.chunk, state.page))
        if split is None or split["rows"] != rows or kwargs.get("batch_size") != len(fb.seq_lens_cpu):
            return None
        kwargs.update({k: v for k, v in split.items() if k != "rows"})
        state.used, kwargs["window_left"] = True, -1
        return kwargs

    context = flashinfer.prefill.trtllm_batch_context_with_kv_cache
    fmha_v2 = getattr(flashinfer.prefill, "trtllm_fmha_v2_prefill", None)  # Hopper and sm120 prefill, 0.5.19+

    def trtllm_batch_context_with_kv_cache(*args: Any, **kwargs: Any) -> Any:
        split = None if args else by_virtual_requests(kwargs["query"].shape[0], dict(kwargs))
        return context(**split) if split is not None else context(*args, **kwargs)

    def trtllm_fmha_v2_prefill(qkv: Any, *args: Any, **kwargs: Any) -> Any:
        split = None if args else by_virtual_requests(qkv[0].shape[0], dict(kwargs))
        return fmha_v2(qkv, **split) if split is not None else fmha_v2(qkv, *args, **kwargs)

    prefill = {"trtllm_batch_context_with_kv_cache": trtllm_batch_context_with_kv_cache}
    if fmha_v2 is not None:
        prefill["trtllm_fmha_v2_prefill"] = trtllm_fmha_v2_prefill
    return ModuleView(flashinfer, decode=ModuleView(flashinfer.decode, trtllm_batch_decode_with_kv_cache=
                                                    trtllm_batch_decode_with_kv_cache),
                      prefill=ModuleView(flashinfer.prefill, **prefill))


def _by_chunk(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """Around ``forward_decode``/``forward_extend``: a chunked layer's kernel calls run by chunk."""
    layer = argument(original, "layer", args, kwargs)
    chunk = chunk_of(self, layer)
    if chunk is None:
        return original(self, *args, **kwargs)
    page = int(getattr(self, "page_size", 1) or 1)
    if chunk % page:
        _uncovered(f"a chunk ({chunk}) that is not a multiple of the page size ({page})")
        return original(self, *args, **kwargs)
    st = state.get(self, STATE)
    if st is None:
        st = state.of(self)[STATE] = _State()
    st.layer_id, st.chunk, st.page, st.used = layer.layer_id, chunk, page, False
    st.prefill = PREFILL in FIX.previews_on
    st.batch = argument(original, "forward_batch", args, kwargs)
    mod, view = flashinfer_view(self, VIEW, lambda fi: _chunk_flashinfer(fi, st))
    try:
        with swapped(mod, "flashinfer", view):
            out = original(self, *args, **kwargs)
        if not st.used:
            mode = st.batch.forward_mode
            decode_kernel = mode.is_decode() or mode.is_target_verify()
            _uncovered(f"{mode.name} on a kernel form this fix does not rewrite" if st.prefill or decode_kernel
                       else f"the prefill ({mode.name}; a preview, not run on a GPU: SGLANG_SWA_PLUGIN_PREVIEW={PREFILL})")
        return out
    finally:
        st.batch = None


# ---------------------------------------------------------------------------- detection


def _windows_by_layer(fn: Any) -> bool:
    """Some kernel call of ``fn`` is given ``window_left=layer.sliding_window_size``."""
    for n in ast.walk(syntax(fn)):
        if isinstance(n, ast.keyword) and n.arg == "window_left":
            v = n.value
            if isinstance(v, ast.Attribute) and v.attr == "sliding_window_size":
                return True
    return False


def classify() -> Detection:
    tree, cls = module_tree(MODULE), optional_class(f"{MODULE}.TRTLLMHAAttnBackend")
    if tree is None or cls is None:
        return Detection.not_applicable("this sglang has no trtllm_mha backend")
    plan = (around(INIT, _remember_chunk), around(FORWARD_DECODE, _by_chunk), around(FORWARD_EXTEND, _by_chunk))
    if reads_use_irope(tree):
        return Detection.not_needed("trtllm_mha's backend reads use_irope (chunked layers)", *plan)
    fns = [own_function(cls, m) for m in ("forward_decode", "forward_extend")]
    if not all(fn is not None and _windows_by_layer(fn) for fn in fns):
        return Detection.unknown("trtllm_mha's forward_decode/forward_extend no longer hand a kernel "
                                 "window_left=layer.sliding_window_size")
    return Detection.needed("trtllm_mha hands its kernels the layer's window only: a chunked (use_irope) layer "
                            "attends the whole context", *plan)


class TrtllmLocalAttnFix(Fix):
    name = NAME
    summary = "trtllm_mha: Llama 4's chunked layers attend their own chunk (decode, verify, context)"
    upstream_prs = ()
    wraps = ("trtllm_swa_pool", "trtllm_xqa_dense_query", "trtllm_xqa_spec_decode")
    targets = (INIT, FORWARD_DECODE, FORWARD_EXTEND)
    target_params = {INIT: ("self", "model_runner"), FORWARD_DECODE: FORWARD_DECODE_PARAMS,
                     FORWARD_EXTEND: FORWARD_EXTEND_PARAMS}
    check_module = "sglang_swa_plugin.check.trtllm_local_attn"
    previews = {PREFILL: "the prefill (trtllm_mha's context kernel, Blackwell; fmha_v2, Hopper, 0.5.19+) as virtual "
                         "requests cut at chunk boundaries"}

    def detect(self) -> Detection:
        return classify()


FIX = TrtllmLocalAttnFix()
