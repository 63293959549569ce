"""flashinfer: EAGLE verify on sliding-window layers attends to its own window (retained keys, re-laid tree mask).

Bug
    The sliding-window wrapper of a TARGET_VERIFY batch is planned over a prefix clipped to
    the window, but EAGLE's builder gathers keys from position 0 with a full-prefix mask:
    wrong keys past the window (0.5.10-0.5.13: a TypeError on ``prefix_lens`` None first).
    Fix: keys ``[seq_len - L, seq_len + q_len)``, the mask re-laid per row's tree depth, an
    own mask buffer for the window wrapper under CUDA graphs.
Upstream PRs
    Issue #22679; #39160 (closed), #39287 (open); #27469 (DFlash's ``kv_start_idx``).
Affected versions
    0.5.10-0.5.13: TypeError; 0.5.14-0.5.23: wrong keys and mask (both builder forms).
    Status by release: applied 0.5.10+.
Detection
    Text: builder and every call pass ``kv_start_idx``: not needed; else the crash or
    wrong-keys form, needed where the builder is the classic or translator form.
Delete when
    The oldest supported sglang carries #39287 (or an equivalent windowed EAGLE verify).
"""

from __future__ import annotations

import inspect
import logging
import re
import threading
from typing import Any, Optional

from sglang_swa_plugin.fix import Detection, Fix, TargetMissing, argument, around, has_parameter, with_argument
from sglang_swa_plugin.probe import compact, normalized_source, optional_module, own_function, target_class

logger = logging.getLogger("sglang.srt.plugins.swa_plugin")

MODULE = "sglang.srt.layers.attention.flashinfer_backend"
UPDATER = MODULE + ".FlashInferIndicesUpdaterPrefill"
UPDATE_SW = UPDATER + ".update_sliding_window"
BEGIN = UPDATER + ".call_begin_forward"
EAGLE_INFO = "sglang.srt.speculative.eagle_info"
VERIFY_INPUT = EAGLE_INFO + ".EagleVerifyInput"
VERIFY_ARGS = VERIFY_INPUT + ".generate_attn_arg_prefill"

CRASH_FORM = "crash"
WRONG_KEYS_FORM = "wrong-keys"
FIXED_FORM = "fixed"
CLASSIC_BUILDER = "req_to_token"
TRANSLATOR_BUILDER = "KV-index-translator"
_SUBTRACTS_PREFIX = "seq_lens-prefix_lens"
_NONE_BRANCH = "ifprefix_lensisNone"
_BUILDER_CALL = re.compile(r"generate_attn_arg_prefill\(")

_active = threading.local()  # .window: (kv_start_idx, window) while wrapper 0 of a verify batch is planned


# ---------------------------------------------------------------------------- the fix


def _verify_input_class() -> Optional[type]:
    mod = optional_module(EAGLE_INFO)
    return getattr(mod, "EagleVerifyInput", None) if mod is not None else None


def is_eagle_verify(spec_info: Any) -> bool:
    cls = _verify_input_class()
    return (cls is not None and isinstance(spec_info, cls)
            and getattr(spec_info, "custom_mask", None) is not None)


def _update_sliding_window(original, self, *args, **kwargs):
    """A verify batch's None ``prefix_lens`` is ``seq_lens`` (the crash form subtracts it)."""
    a = lambda name: argument(original, name, args, kwargs)  # noqa: E731
    if a("prefix_lens") is None and is_eagle_verify(a("spec_info")):
        args, kwargs = with_argument(original, "prefix_lens", a("seq_lens"), args, kwargs)
    return original(self, *args, **kwargs)


def _is_window_wrapper(updater, kv_indptr) -> bool:
    backend = getattr(updater, "attn_backend", None)
    reason = getattr(backend, "dispatch_reason", None)
    return (reason is not None and getattr(reason, "name", "") == "SLIDING_WINDOW"
            and updater.sliding_window_size is not None and kv_indptr is updater.kv_indptr[0])


def own_mask_buffer(backend, wrapper, draft_token_num: int, window: int):
    """The sliding-window verify wrapper's own packed-mask buffer (CUDA graphs), made once
    per backend: every request packs at most ``q_len * (window + q_len)`` bits."""
    max_bs = len(backend.kv_indptr[0]) - 1
    need = max_bs * ((draft_token_num * (window + draft_token_num) + 7) // 8) + 16
    buf = getattr(backend, "_swa_verify_mask_buf", None)
    if buf is None or buf.numel() < need:
        import torch

        buf = torch.zeros(need, dtype=torch.uint8, device=wrapper._custom_mask_buf.device)
        backend._swa_verify_mask_buf = buf
    return buf


def _call_begin_forward(original, self, *args, **kwargs):
    a = lambda name: argument(original, name, args, kwargs)  # noqa: E731
    spec_info, start = a("spec_info"), a("kv_start_idx")
    if start is None or not is_eagle_verify(spec_info) or not _is_window_wrapper(self, a("kv_indptr")):
        return original(self, *args, **kwargs)
    wrapper = a("wrapper_paged")
    shared = getattr(self.attn_backend, "cuda_graph_custom_mask", None)
    if shared is not None and getattr(wrapper, "_custom_mask_buf", None) is shared:
        wrapper._custom_mask_buf = own_mask_buffer(self.attn_backend, wrapper, spec_info.draft_token_num,
                                                   self.sliding_window_size)
    _active.window = (start, self.sliding_window_size)
    try:
        return original(self, *args, **kwargs)
    finally:
        _active.window = None


try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - sglang depends on triton
    triton = tl = None

_mask_kernel = None
if triton is not None:

    @triton.jit
    def _windowed_mask_kernel(tree_ptr, tree_numel, kept_ptr, start_ptr, out_ptr, out_numel, window,
                              N: tl.constexpr, NB: tl.constexpr, BS_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
                              EMPTY: tl.constexpr):
        """One program per (request b, draft row i): row i of request b of the re-laid mask
        (``L + N`` columns, uint8 0/1; see ``windowed_verify_mask``)."""
        b = tl.program_id(0)
        i = tl.program_id(1)
        L = tl.load(kept_ptr + b).to(tl.int64)
        P = tl.load(start_ptr + b).to(tl.int64) + L
        # Offsets of request b in the stock mask (rows P + N wide) and in ours (L + N).
        old_acc = tl.zeros([BS_BLOCK], dtype=tl.int64)
        new_acc = tl.zeros([BS_BLOCK], dtype=tl.int64)
        for s0 in range(0, b, BS_BLOCK):
            offs = s0 + tl.arange(0, BS_BLOCK)
            m = offs < b
            kept = tl.load(kept_ptr + offs, mask=m, other=0).to(tl.int64)
            st = tl.load(start_ptr + offs, mask=m, other=0).to(tl.int64)
            add = tl.where(m, N, 0).to(tl.int64)
            old_acc += st + kept + add
            new_acc += kept + add
        old_off = N * tl.sum(old_acc, axis=0)
        new_off = N * tl.sum(new_acc, axis=0)
        old_row = P + N
        new_row = L + N
        # The draft block of the stock mask, every row: [row r, draft column c].
        jj = tl.arange(0, NB)
        r2 = jj[:, None]
        c2 = jj[None, :]
        m2 = (r2 < N) & (c2 < N)
        if EMPTY:
            tree = m2.to(tl.int32)
        else:
            idx = old_off + r2.to(tl.int64) * old_row + P + c2.to(tl.int64)
            idx = tl.minimum(tl.maximum(idx, 0), tree_numel - 1)  # padded graph rows: any bits
            tree = (tl.load(tree_ptr + idx, mask=m2, other=0) != 0).to(tl.int32)
        depth = tl.sum(tree, axis=1) - 1
        d_i = tl.sum(tl.where(jj == i, depth, 0), axis=0)
        tree_i = tl.sum(tl.where(r2 == i, tree, 0), axis=0)
        row_base = new_off + i * new_row
        # Draft columns: the tree bit, and depth d_j >= d_i - window.
        draft_ok = (tree_i != 0) & (depth >= d_i - window) & (jj < N)
        o = row_base + L + jj
        tl.store(out_ptr + o, draft_ok.to(tl.uint8), mask=(jj < N) & (o < out_numel))
        # Prefix columns c: on iff c >= L + d_i - window.
        lo = L + d_i - window
        for s0 in range(0, L.to(tl.int32), BLOCK):
            c = s0 + tl.arange(0, BLOCK).to(tl.int64)
            oc = row_base + c
            tl.store(out_ptr + oc, (c >= lo).to(tl.uint8), mask=(c < L) & (oc < out_numel))

    _mask_kernel = _windowed_mask_kernel


def windowed_verify_mask(tree_mask, prefix_kept, kv_start, draft_token_num: int, window: int, kept_sum: int):
    """The verify mask for keys ``[seq_len - L, seq_len + q_len)`` of each request, from
    sglang's full-prefix tree mask (``q_len x (seq_len + q_len)`` per request, flattened), in
    one Triton launch. ``prefix_kept`` is L per request, ``kv_start`` is ``seq_len - L``,
    ``kept_sum`` the host sum of L. Row i (tree depth d_i) sees prefix column c iff
    ``c >= L + d_i - window`` and draft column j iff its tree bit is set and
    ``d_j >= d_i - window``. (A CUDA kernel: the CPU scenario of ``check`` runs its torch
    twin, ``check.flashinfer_swa_verify.mask_twin``, which the GPU tests compare it with.)"""
    import torch

    n = int(draft_token_num)
    bs = prefix_kept.numel()
    total = n * int(kept_sum) + n * n * bs
    out = torch.empty(total, dtype=torch.uint8, device=prefix_kept.device)
    flat = tree_mask.reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    empty = flat.numel() == 0
    if bs and total:
        _mask_kernel[(bs, n)](out if empty else flat, flat.numel(), prefix_kept, kv_start, out, total, int(window),
                              N=n, NB=max(2, triton.next_power_of_2(n)), BS_BLOCK=256, BLOCK=512,
                              EMPTY=empty)
    return out.view(torch.bool)


def _kv_indices_kernel():
    """sglang's ``create_flashinfer_kv_indices_triton`` (keys ``req_to_token[req, start : start + len]``),
    as the classic builder it stands in for reads it: from its module, at each use."""
    return optional_module(EAGLE_INFO).create_flashinfer_kv_indices_triton


def _windowed_args(spec_info, req_pool_indices, paged_kernel_lens, paged_kernel_lens_sum, req_to_token, start, window):
    """What ``generate_attn_arg_prefill`` returns, for keys ``[start, start + L + q_len)``
    (contiguous in ``req_to_token``: the prefix tail, then the draft tokens)."""
    import torch

    n = spec_info.draft_token_num
    bs = len(req_pool_indices)
    dev = req_pool_indices.device
    total = int(paged_kernel_lens_sum) + n * bs
    qo_indptr = torch.arange(0, (1 + bs) * n, step=n, dtype=torch.int32, device=dev)
    kv_lens = paged_kernel_lens + n
    kv_indptr = torch.zeros((bs + 1,), dtype=torch.int32, device=dev)
    kv_indptr[1:] = torch.cumsum(kv_lens, dim=0)
    kv_indices = torch.empty(total, dtype=torch.int32, device=dev)
    _kv_indices_kernel()[(bs,)](req_to_token, req_pool_indices, kv_lens, kv_indptr, start, kv_indices,
                                req_to_token.shape[1])
    return kv_indices, kv_indptr, qo_indptr, _mask(spec_info, paged_kernel_lens, paged_kernel_lens_sum, start, window)


def _mask(spec_info, prefix_kept, kept_sum, start, window):
    return windowed_verify_mask(spec_info.custom_mask, prefix_kept, start, spec_info.draft_token_num, window,
                                int(kept_sum))


class _ReadFromStart:
    """A ``KVIndexTranslator`` whose ``pack_read_stream`` reads each request's row from
    the sliding-window start: what the translator form of the builder is given instead
    of the translator, so sglang's own gather (table path or kernel) stays in charge of
    id spaces. Everything else is the translator's."""

    __slots__ = ("_translator", "_start")

    def __init__(self, translator, start):
        self._translator, self._start = translator, start

    def pack_read_stream(self, plan, **kwargs):
        kwargs["kv_start_idx"] = self._start
        return self._translator.pack_read_stream(plan, **kwargs)

    def __getattr__(self, name):
        return getattr(self._translator, name)


def _generate_attn_arg_prefill(original, self, *args, **kwargs):
    active = getattr(_active, "window", None)
    if active is None:
        return original(self, *args, **kwargs)
    _active.window = None  # one builder call per plan
    a = lambda name: argument(original, name, args, kwargs)  # noqa: E731
    if has_parameter(original, "req_to_token"):  # classic form: the builder gathers from req_to_token itself
        return _windowed_args(self, a("req_pool_indices"), a("paged_kernel_lens"), a("paged_kernel_lens_sum"),
                              a("req_to_token"), *active)
    # KV-index-translator form (0.5.22+): sglang's builder, its gather started at the window
    start, window = active
    args, kwargs = with_argument(original, "translator", _ReadFromStart(a("translator"), start), args, kwargs)
    kv_indices, kv_indptr, qo_indptr, _ = original(self, *args, **kwargs)
    return kv_indices, kv_indptr, qo_indptr, _mask(self, a("paged_kernel_lens"), a("paged_kernel_lens_sum"), start,
                                                   window)


# ---------------------------------------------------------------------------- detection


def form(updater_cls: type, verify_cls: type) -> "tuple[str, Detection]":
    """(form, verdict) of the installed code: crash / wrong-keys / fixed / ""."""
    builder = own_function(verify_cls, "generate_attn_arg_prefill")
    begin = own_function(updater_cls, "call_begin_forward")
    window = own_function(updater_cls, "update_sliding_window")
    if builder is None or begin is None or window is None:
        return "", Detection.unknown("flashinfer's verify planning has an unrecognised shape")
    params = inspect.signature(builder).parameters
    begin_src = compact(normalized_source(begin))
    calls = [begin_src[m.start():m.start() + 400].split(")", 1)[0] for m in _BUILDER_CALL.finditer(begin_src)]
    if "kv_start_idx" in params and calls and all("kv_start_idx" in c for c in calls):
        return FIXED_FORM, Detection.not_needed("EAGLE verify gets the sliding-window start (fixed form)")
    window_src = compact(normalized_source(window))
    if _NONE_BRANCH in window_src:
        form, why = WRONG_KEYS_FORM, "EAGLE verify on sliding-window layers gathers keys from position 0 with a full-prefix mask"
    elif _SUBTRACTS_PREFIX in window_src:
        form, why = CRASH_FORM, "the window code subtracts verify's None prefix_lens (TypeError)"
    else:
        return "", Detection.unknown("update_sliding_window has an unrecognised shape")
    shape = builder_form(params)
    if not shape:
        return form, Detection.unknown(f"{why}; the EAGLE verify builder has an unrecognised signature")
    return form, Detection.needed(f"{why} ({shape} builder)")


def classify() -> Detection:
    if optional_module(MODULE) is None or optional_module(EAGLE_INFO) is None:
        return Detection.not_applicable("this sglang has no flashinfer backend or EAGLE verify input")
    if _verify_input_class() is None:
        raise TargetMissing(VERIFY_INPUT)
    return form(target_class(UPDATER), target_class(VERIFY_INPUT))[1]


def builder_form(params) -> str:
    """How ``EagleVerifyInput.generate_attn_arg_prefill`` gathers keys: from ``req_to_token``
    (classic) or through a ``KVIndexTranslator`` (``translator``/``plan``/``kind``)."""
    if "req_to_token" in params:
        return CLASSIC_BUILDER
    if {"translator", "plan", "kind"} <= set(params):
        return TRANSLATOR_BUILDER
    return ""


class FlashinferSwaVerifyFix(Fix):
    name = "flashinfer_swa_verify"
    summary = "flashinfer EAGLE verify on sliding-window layers: retained keys and a per-row windowed tree mask"
    upstream_prs = ("#39287", "#39160", "issue #22679")
    targets = (UPDATE_SW, BEGIN, VERIFY_ARGS)
    target_params = {
        UPDATE_SW: ("self", "req_pool_indices", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "prefix_lens"),
        BEGIN: ("self", "wrapper_ragged", "wrapper_paged", "req_pool_indices", "paged_kernel_lens",
                "paged_kernel_lens_sum", "seq_lens", "prefix_lens", "kv_start_idx", "kv_indptr"),
        VERIFY_ARGS: ("self", "req_pool_indices", "paged_kernel_lens", "paged_kernel_lens_sum"),
    }

    check_module = "sglang_swa_plugin.check.flashinfer_swa_verify"

    def detect(self) -> Detection:
        return classify().with_plan(around(UPDATE_SW, _update_sliding_window), around(BEGIN, _call_begin_forward),
                                    around(VERIFY_ARGS, _generate_attn_arg_prefill))


FIX = FlashinferSwaVerifyFix()
