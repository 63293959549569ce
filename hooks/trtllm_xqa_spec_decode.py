"""trtllm_mha on XQA hardware: multi-token decode-kernel calls get a bf16 query and the spec-decode mask.

Bug
    On sm90/sm120 (``is_xqa_impl``) ``flashinfer.decode.trtllm_batch_decode_with_kv_cache``
    runs the XQA kernel. For more than one query token per request (``q_len_per_req > 1``:
    TARGET_VERIFY and, from 0.5.14, DRAFT_EXTEND_V2 in ``forward_extend``) XQA needs
    (a) a causal spec-decode mask, or it asserts "Mask is required for speculative decoding";
    (b) a bf16 query even with an FP8 KV cache, or it asserts "Output and query must have the
        same dtype" (its JIT has no FP8-query variant).
    0.5.10-0.5.20 never pass the mask. 0.5.14-0.5.21 quantize the query to FP8 for XQA on
    every mode but TARGET_VERIFY (0.5.14 ``force_fp8=not is_target_verify()``, 0.5.15-0.5.21
    ``not self.is_xqa_impl or not is_target_verify()``), so DRAFT_EXTEND_V2 with an FP8 KV
    cache hands XQA an FP8 query. 0.5.21 passes its mask for TARGET_VERIFY only. 0.5.22 keys
    both choices on "uses the decode kernel" (``uses_decode_kernel``: the mask choice and the
    FP8-query test in ``forward_extend``).
    So with trtllm_mha for decode on Hopper and ``--speculative-attention-mode decode`` (or
    ``--speculative-draft-attention-backend trtllm_mha``) the first verify or draft-extend step
    fails. Loud, never wrong numbers; seen on an H100 with flashinfer's real XQA kernel
    (``tests/gpu/fp8_xqa_probe.py``, tests/gpu/RESULTS.md).
    The fix does what 0.5.22 does (except on sliding-window layers, below), around
    ``forward_extend`` and only where ``is_xqa_impl``:
    - a DRAFT_EXTEND_V2 batch whose query rows are ``batch * max_seq_len_q`` (the decode
      kernel's contract; see trtllm_extend_routing) is shown to the method as TARGET_VERIFY,
      which runs the same decode-kernel branch on the same metadata, with the release's own
      bf16-query rule (ENCODER_ONLY layers, which TARGET_VERIFY treats differently, are left
      alone);
    - for the call, the module's ``flashinfer`` name is a view of flashinfer whose decode
      entry point adds the causal mask when ``q_len_per_req > 1`` and none was given. The mask
      is 0.5.22's (row r of a request's draft attends to draft rows 0..r; uint16 words), kept
      per backend and per query length, and never freed while a CUDA graph may point at it;
    - the query goes to XQA dense: models hand over q as a view of their fused qkv
      projection (rows strided by q+k+v), and XQA reads its rows as if dense (every
      flashinfer measured, 0.6.8-0.7.2: relative error 0.68-1.30 for a strided query, 0.003
      dense; on a real 0.5.11 server 0/32 bf16 outputs equal the no-spec ones without the
      copy, 32/32 with it). An FP8 query was already a fresh tensor, so FP8 KV caches never
      showed this.
    Host-side decisions only (forward mode, tensor shapes, ints): no device-to-host copy.
    Under CUDA graphs (sglang's default) every derived tensor is made inside the pass that
    uses it: sglang runs a batch size's pass eagerly, then captures it on the same static
    buffers, and replays it with no Python; rows derived in the eager run would be stale
    at every replay (6b08c25 did that: wrong tokens from the first verify step).

    Sliding-window layers get no mask but one single-token request per draft row, on
    purpose. Measured on an H100 with flashinfer 0.6.12's real XQA kernel
    (tests/gpu/xqa_window_semantics.py, tests/gpu/RESULTS.md): with the mask and
    ``window_left`` 16 or 31, a 4-token call differs from windowed causal attention by
    73-95 % (relative max error) whichever way the window is anchored, while the same call
    without a window, and every single-token windowed call, match (0.3-2.7 %). 0.5.22 passes
    the mask for SWA layers too; on a real 0.5.11 server, giving every layer the mask made
    0 of 8 greedy outputs equal those of the same server without speculative decoding.
    Row r of a request whose ``seq_lens`` (after the draft's K/V) is S sees keys
    ``S - q_len + r`` and before, within the window: exactly causal attention.

Upstream PRs
    #32269 "Support XQA backend for SpecDec verify" (the mask, TARGET_VERIFY; in 0.5.21), then
    0.5.22's change keying the query dtype and the mask on ``uses_decode_kernel`` (PR number
    not found). #28241 (DRAFT_EXTEND_V2 to the decode kernel, 0.5.14) made the draft-extend
    half reachable. flashinfer #4137 "ragged Q and per-row sliding-window masking for
    speculative decode" (merged 2026-07) is the kernel-side change that the windowed
    multi-token XQA path measured below lacks (flashinfer 0.6.12).

Affected versions
    0.5.10-0.5.20: TARGET_VERIFY through trtllm_mha on XQA (no mask). 0.5.14-0.5.21:
    DRAFT_EXTEND_V2 through it (FP8 query with an FP8 KV cache; no mask). 0.5.22+: mask and
    query dtype fixed, and their flashinfer (0.7.1, 0.7.2) computes the windowed multi-token
    call exactly (measured); from 0.5.19 ``forward_extend`` copies the query on XQA hardware
    (``use_fmha_v2``, set from the same sm90/sm120 test as ``is_xqa_impl``), so the query is
    dense there too (single-token XQA calls before that: trtllm_xqa_dense_query).
    Blackwell (sm100, trtllm-gen kernel) is not affected and the hook does nothing there.
    Status by release: applied 0.5.10-0.5.21; not needed 0.5.22+.

Detection
    Structure of the installed ``forward_extend`` (its syntax tree, shared with
    trtllm_extend_routing; never a version string). Multi-token decode calls are those
    reached for TARGET_VERIFY, and for DRAFT_EXTEND_V2 where the method routes it to the
    decode kernel. Needed when one of them gets no ``mask=``, or a mask chosen on
    ``is_target_verify()`` alone while DRAFT_EXTEND_V2 is routed there too, or when the query
    is made FP8 under a test of ``is_target_verify()`` that does not cover DRAFT_EXTEND_V2.
    ``tests/test_trtllm_xqa_spec_decode.py`` checks on every matrix version that this verdict
    equals what the real backend does (``reproduce``: a real backend with ``is_xqa_impl`` set
    and an FP8 KV dtype, kernels recorded).

Delete when
    0.5.22 (with a flashinfer that carries #4137) is the oldest supported sglang.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from sglang_swa_plugin.fix import Detection, Fix, TargetMissing, argument, around, hookimpl
from sglang_swa_plugin.probe import callee, optional_module, own_function, swapped
from sglang_swa_plugin.trtllm_mha import (CLASS, DECODE_KERNELS, FORWARD_EXTEND as TARGET, FORWARD_EXTEND_PARAMS,
                                          MODULE, V2_TEST, XQA_FLAG, ModuleView, backend_class, flashinfer_view, has,
                                          nodes, routes_v2_to_decode, tests_v2, syntax, v2_flags, with_decode_entry)

TARGET_VERIFY_TEST = "is_target_verify"


# ---------------------------------------------------------------------------- the mask


def spec_decode_mask(q_len: int, batch: int, device: Any = None) -> Any:
    """0.5.22's XQA spec-decode mask: ``[batch, q_len, words]`` uint16, where row r has bits
    0..r set (row r of a request's draft attends to draft rows 0..r and, through
    ``seq_lens``, to the whole prefix). Built with device-side ops only."""
    import torch

    words = (q_len + 31) // 32 * 2
    row = torch.arange(q_len, dtype=torch.int32, device=device)[:, None]
    word = torch.arange(words, dtype=torch.int32, device=device)[None, :]
    bits = (row + 1 - 16 * word).clamp(0, 16)
    mask = ((1 << bits) - 1).to(torch.uint16)
    return mask.unsqueeze(0).expand(batch, -1, -1).contiguous()


def capturing() -> bool:
    """True while the current CUDA stream is being captured into a graph (host-side query,
    no sync); False on a machine without CUDA."""
    import torch

    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except (RuntimeError, AssertionError, AttributeError):
        return False


class _Rows(NamedTuple):
    """The single-token rows of one forward pass and what they were derived from."""

    layer_id: int  # the last layer that used them
    seq_lens: Any
    block_tables: Any
    q_len: int
    capturing: bool
    lens: Any  # per row: S - q_len + 1 + r
    table: Any  # per row: the request's page-table row


class _XqaState:
    """Per backend: what the hook derives on the device, kept so that it is exact under CUDA
    graphs (sglang captures a forward pass after running it eagerly on the same static
    buffers, and at replay no Python runs):
    - spec-decode masks per query length, grown on demand; a mask made eagerly is reused
      anywhere (its values never change) and stays referenced for good (a captured graph
      reads it at every replay); a mask made during a capture holds values only inside that
      graph, so it is never handed out again;
    - the single-token rows of the sliding-window layers, derived from ``seq_lens`` and the
      SWA page table. They are reused only by a later layer of the same forward pass: a
      layer id that does not grow starts a new pass (a warm-up run, then the capture, then
      the next batch), as do other tensors or a change of capture state, so a captured pass
      records its own derivation from the graph's static buffers and replays it."""

    def __init__(self) -> None:
        self.by_len: Dict[Tuple[int, Any], Any] = {}
        self.kept: List[Any] = []
        self.layer_id: int = -1  # the layer the hook is running
        self.rows: Optional[_Rows] = None

    def mask(self, q_len: int, batch: int, device: Any) -> Any:
        key = (q_len, device)
        mask = self.by_len.get(key)
        if mask is not None and mask.shape[0] >= batch:
            return mask[:batch]
        mask = spec_decode_mask(q_len, max(batch, 2 * (mask.shape[0] if mask is not None else 0)), device)
        self.kept.append(mask)
        if not capturing():
            self.by_len[key] = mask
        return mask[:batch]

    def single_token_rows(self, seq_lens: Any, block_tables: Any, q_len: int) -> Tuple[Any, Any]:
        """Row r of a request with ``seq_lens`` S (after the draft's K/V) as a request of its
        own: ``seq_lens`` S - q_len + 1 + r (at least 1: padded graph rows), the request's
        page-table row."""
        import torch

        now, rows = capturing(), self.rows
        if (rows is None or self.layer_id <= rows.layer_id or rows.seq_lens is not seq_lens
                or rows.block_tables is not block_tables or rows.q_len != q_len or rows.capturing != now):
            offsets = torch.arange(1 - q_len, 1, device=seq_lens.device, dtype=seq_lens.dtype)
            lens = (seq_lens[:, None] + offsets[None, :]).reshape(-1).clamp_(min=1)
            rows = _Rows(self.layer_id, seq_lens, block_tables, q_len, now, lens,
                         block_tables.repeat_interleave(q_len, dim=0))
        self.rows = rows._replace(layer_id=self.layer_id)
        return rows.lens, rows.table


def _masking_flashinfer(flashinfer: Any, state: _XqaState) -> ModuleView:
    """``flashinfer`` whose decode entry point makes a multi-token call one that XQA computes
    exactly:
    - a query the release made FP8 (0.5.10-0.5.13 cast it for every extend mode) is handed
      over in the output dtype; the FP8 scale, if any, is already in ``bmm1_scale``, so this
      computes what the FP8 query would on Blackwell;
    - full attention (``window_left < 0``): the causal spec-decode mask where none was given;
    - a sliding window: every draft row becomes its own one-token request (page-table row
      repeated, ``seq_lens`` = that row's position + 1), because XQA's multi-token path is not
      exact with a window (see Bug). Device-side ops only, so it is CUDA-graph safe."""
    import torch

    decode = flashinfer.decode.trtllm_batch_decode_with_kv_cache

    def trtllm_batch_decode_with_kv_cache(*args: Any, **kwargs: Any) -> Any:
        q_len = kwargs.get("q_len_per_req") or 1
        if q_len > 1 and not args and {"query", "seq_lens", "block_tables"} <= kwargs.keys():
            query = kwargs["query"]
            if query.dtype == torch.float8_e4m3fn:
                query = query.to(kwargs.get("out_dtype") or torch.bfloat16)
            # The model hands over q as a view of its fused qkv projection (rows strided by
            # q+k+v); XQA's multi-token path reads rows as if dense (see Bug).
            query = kwargs["query"] = query.contiguous()
            window = kwargs.get("window_left")
            if window is not None and window >= 0:
                kwargs["seq_lens"], kwargs["block_tables"] = state.single_token_rows(
                    kwargs["seq_lens"], kwargs["block_tables"], q_len)
                kwargs["q_len_per_req"] = 1
                kwargs.pop("mask", None)
            elif kwargs.get("mask") is None:
                kwargs["mask"] = state.mask(q_len, kwargs["seq_lens"].shape[0], query.device)
        return decode(*args, **kwargs)

    return with_decode_entry(flashinfer, trtllm_batch_decode_with_kv_cache)


# ---------------------------------------------------------------------------- the fix


def _uniform(q: Any, forward_batch: Any, metadata: Any) -> bool:
    """Query rows are ``batch * max_seq_len_q``: the decode kernel's contract (host ints)."""
    per_req = getattr(metadata, "max_seq_len_q", None)
    return isinstance(per_req, int) and per_req > 1 and q.shape[0] == forward_batch.batch_size * per_req


def _xqa_multi_token(v2_decode: bool) -> Callable:
    """The AROUND hook on ``forward_extend(self, q, k, v, layer, forward_batch, ...)``.
    ``v2_decode``: the installed method routes DRAFT_EXTEND_V2 to the decode kernel (0.5.14+),
    so showing it as TARGET_VERIFY keeps the kernel and the metadata."""

    def hook(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        forward_batch = argument(original, "forward_batch", args, kwargs)
        mode = forward_batch.forward_mode
        verify = mode.is_target_verify()
        if not getattr(self, XQA_FLAG, False) or not (verify or mode.is_draft_extend_v2()):
            return original(self, *args, **kwargs)
        mod, view = flashinfer_view(self, "_swa_plugin_xqa_flashinfer", lambda fi: _masking_flashinfer(
            fi, self.__dict__.setdefault("_swa_plugin_xqa_state", _XqaState())))
        q, layer = argument(original, "q", args, kwargs), argument(original, "layer", args, kwargs)
        self._swa_plugin_xqa_state.layer_id = layer.layer_id
        shown = mode
        if not verify and v2_decode and _uniform(q, forward_batch, self.forward_metadata) and not _encoder_only(layer):
            shown = type(mode).TARGET_VERIFY
        with swapped(mod, "flashinfer", view), swapped(forward_batch, "forward_mode", shown):
            return original(self, *args, **kwargs)

    return hook


def _encoder_only(layer: Any) -> bool:
    kind = getattr(layer, "attn_type", None)
    return getattr(kind, "name", None) == "ENCODER_ONLY"


# ---------------------------------------------------------------------------- detection


def _mask_values(tree: Any) -> List[Any]:
    """Expressions passed as ``mask=`` to decode-kernel calls, with a local name resolved to
    the expressions assigned to it."""
    import ast

    assigned: Dict[str, List[Any]] = {}
    for node in nodes(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    assigned.setdefault(t.id, []).append(node.value)
    values = []
    for node in nodes(tree):
        if isinstance(node, ast.Call) and callee(node) in DECODE_KERNELS:
            for kw in node.keywords:
                if kw.arg == "mask":
                    v = kw.value
                    values += assigned.get(v.id, [v]) if isinstance(v, ast.Name) else [v]
    return values


def _fp8_query_tests(tree: Any) -> List[Any]:
    """Conditions under which ``forward_extend`` makes the query FP8 for an FP8 KV cache:
    tests mentioning ``data_type`` of ``if``s whose body converts to ``float8_e4m3fn``, and
    ``force_fp8=`` arguments (0.5.14's ``_maybe_quantize_q`` keeps bf16 for XQA unless forced)."""
    import ast

    tests = []
    for node in nodes(tree):
        if (isinstance(node, ast.If) and has(node.test, "attr", "data_type")
                and any(has(s, "attr", "float8_e4m3fn") for s in node.body)):
            tests.append((node.test, False))
        if isinstance(node, ast.keyword) and node.arg == "force_fp8":
            tests.append((node.value, True))
    return tests


def _covers_v2(test: Any, tree: Any) -> bool:
    return has(test, "name", *v2_flags(tree)) or has(test, "call", V2_TEST)


def classify() -> Detection:
    if optional_module(MODULE) is None:
        return Detection.not_applicable("this sglang has no trtllm_mha backend")
    cls = backend_class()
    forward_extend = own_function(cls, "forward_extend")
    if forward_extend is None:
        raise TargetMissing(TARGET)
    try:
        tree = syntax(forward_extend)
        v2_decode = routes_v2_to_decode(forward_extend)
    except (OSError, TypeError, SyntaxError) as e:
        return Detection.unknown(f"source of TRTLLMHAAttnBackend unreadable: {type(e).__name__}: {e}")
    if v2_decode is None:
        return Detection.unknown("forward_extend calls no decode kernel: routing not recognised")
    modes = "TARGET_VERIFY and DRAFT_EXTEND_V2 reach" if v2_decode else "TARGET_VERIFY reaches"
    reasons = []
    masks = _mask_values(tree)
    if not masks:
        reasons.append(f"{modes} the XQA decode kernel with no spec-decode mask")
    elif v2_decode and all(has(m, "call", TARGET_VERIFY_TEST) and not tests_v2(m) for m in masks):
        reasons.append("the spec-decode mask is passed for TARGET_VERIFY only, not DRAFT_EXTEND_V2")
    for test, forced in _fp8_query_tests(tree):
        if not forced and not has(test, "attr", XQA_FLAG):
            reasons.append("an FP8 KV cache makes the multi-token query FP8 for XQA too")
        elif v2_decode and has(test, "call", TARGET_VERIFY_TEST) and not _covers_v2(test, tree):
            reasons.append("DRAFT_EXTEND_V2 gets an FP8 query on XQA (bf16 is kept for TARGET_VERIFY only)")
    plan = around(TARGET, _xqa_multi_token(v2_decode))
    if reasons:
        return Detection.needed("; ".join(dict.fromkeys(reasons)), plan)
    return Detection.not_needed(f"{modes} XQA with the spec-decode mask and a bf16 query", plan)


class TrtllmXqaSpecDecodeFix(Fix):
    name = "trtllm_xqa_spec_decode"
    summary = "trtllm_mha on XQA (sm90/sm120): multi-token decode calls get a bf16 query and the spec-decode mask"
    upstream_prs = ("#32269", "flashinfer #4137", "#28241")
    targets = (TARGET,)
    target_params = {TARGET: FORWARD_EXTEND_PARAMS}
    check_module = "sglang_swa_plugin.check.trtllm_xqa_spec_decode"

    def detect(self) -> Detection:
        return classify()


FIX = TrtllmXqaSpecDecodeFix()


@hookimpl
def sglang_swa_plugin_fixes():
    return [FIX]
