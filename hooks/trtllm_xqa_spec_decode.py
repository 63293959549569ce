"""trtllm_mha on XQA hardware: multi-token decode-kernel calls get a bf16 query and the spec-decode mask.

Bug
    On sm90/sm120 XQA runs TARGET_VERIFY (and DRAFT_EXTEND_V2 from 0.5.14); it asserts
    without a spec-decode mask or with an FP8 query: the first verify step fails. Fix, as
    0.5.22: around ``forward_extend`` on XQA, the causal mask, a dense bf16 query, V2 shown
    as TARGET_VERIFY; sliding-window layers get one single-token request per draft row.
Upstream PRs
    #32269 (mask for TARGET_VERIFY, 0.5.21), #28241 (V2 to the decode kernel), flashinfer
    #4137 (windowed multi-token XQA).
Affected versions
    0.5.10-0.5.20: no mask; 0.5.14-0.5.21: DRAFT_EXTEND_V2 with FP8 query. Not Blackwell.
    Status by release: applied 0.5.10-0.5.21; not needed 0.5.22+.
Detection
    Syntax tree of ``forward_extend``: a multi-token decode call without ``mask=``, a mask or
    bf16 query keyed on ``is_target_verify()`` alone while V2 is routed there: needed.
Delete when
    0.5.22 (with a flashinfer that carries #4137) is the oldest supported sglang.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

from sglang_swa_plugin import state
from sglang_swa_plugin.fix import Detection, Fix, TargetMissing, argument, around
from sglang_swa_plugin.graphed import capturing
from sglang_swa_plugin.probe import callee, optional_module, own_function, swapped
from sglang_swa_plugin.trtllm_mha import CLASS as CLASS  # the tests read it here
from sglang_swa_plugin.trtllm_mha import (DECODE_KERNELS, FORWARD_EXTEND as TARGET, FORWARD_EXTEND_PARAMS,
                                          MODULE, V2_TEST, XQA_FLAG, ModuleView, backend_class, flashinfer_view, has,
                                          PerPass, exact_query, nodes, one_token_rows, routes_v2_to_decode,
                                          tests_v2, syntax, v2_flags, with_decode_entry)

TARGET_VERIFY_TEST = "is_target_verify"
VIEW, STATE = "xqa_flashinfer", "xqa_state"  # in the backend's state: its flashinfer view, an _XqaState


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


class _XqaState:
    """Per backend: what the hook derives on the device, kept so that it is exact under CUDA
    graphs (sglang captures a forward pass after running it eagerly on the same static
    buffers, and at replay no Python runs):
    - spec-decode masks per query length, grown on demand; a mask made eagerly is reused
      anywhere (its values never change) and stays referenced for good (a captured graph
      reads it at every replay); a mask made during a capture holds values only inside that
      graph, so it is never handed out again;
    - the single-token rows of the sliding-window layers, derived from ``seq_lens`` and the
      SWA page table once per forward pass (``trtllm_mha.PerPass``)."""

    def __init__(self) -> None:
        self.by_len: Dict[Tuple[int, Any], Any] = {}
        self.kept: List[Any] = []
        self.layer_id: int = -1  # the layer the hook is running
        self.rows = PerPass()

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
        own (``trtllm_mha.one_token_rows``), once per forward pass (``trtllm_mha.PerPass``)."""
        return self.rows.get(self.layer_id, (seq_lens, block_tables), q_len,
                             lambda: one_token_rows(seq_lens, block_tables, q_len))


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
    decode = flashinfer.decode.trtllm_batch_decode_with_kv_cache

    def trtllm_batch_decode_with_kv_cache(*args: Any, **kwargs: Any) -> Any:
        q_len = kwargs.get("q_len_per_req") or 1
        if q_len > 1 and not args and {"query", "seq_lens", "block_tables"} <= kwargs.keys():
            query = kwargs["query"] = exact_query(kwargs["query"], kwargs.get("out_dtype"))
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
        mod, view = flashinfer_view(self, VIEW, lambda fi: _masking_flashinfer(
            fi, state.of(self).setdefault(STATE, _XqaState())))
        q, layer = argument(original, "q", args, kwargs), argument(original, "layer", args, kwargs)
        state.get(self, STATE).layer_id = layer.layer_id
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
    wraps = ("trtllm_extend_routing",)
    targets = (TARGET,)
    target_params = {TARGET: FORWARD_EXTEND_PARAMS}
    check_module = "sglang_swa_plugin.check.trtllm_xqa_spec_decode"

    def detect(self) -> Detection:
        return classify()


FIX = TrtllmXqaSpecDecodeFix()
