"""trtllm_mha: DRAFT_EXTEND_V2 reaches the decode kernel only where that kernel's contract holds.

Bug
    ``TRTLLMHAAttnBackend.forward_extend`` runs one of two flashinfer kernels.
    ``flashinfer.decode.trtllm_batch_decode_with_kv_cache`` takes one query length for every
    request (``q_len_per_req``; it computes ``batch = query rows // q_len_per_req``) and
    ``seq_lens`` = per-request totals after the new K/V are written.
    ``flashinfer.prefill.trtllm_batch_context_with_kv_cache`` takes ragged query lengths
    (``cum_seq_lens_q``). #24566 sent DRAFT_EXTEND_V2 to the decode kernel while the draft-extend
    metadata was still ragged (``cu_seqlens_q = cumsum(num_accept_tokens)``,
    ``max_seq_len_q = max(num_accept_tokens)``): with requests that accepted different numbers
    of tokens the kernel sees more "requests" than the batch has and reads page-table rows past
    it (CUDA illegal memory access, Qwen3.5-397B + NEXTN). #24856 routed DRAFT_EXTEND_V2 back
    to the context kernel. #25002 then gave DRAFT_EXTEND_V2 uniform-stride metadata (the stride
    is ``num_tokens_per_req``, whatever was accepted) and #28241 re-landed the decode-kernel
    routing on it (+4.7 % at bs=1).
    Where the installed backend routes DRAFT_EXTEND_V2 to the decode kernel without uniform
    metadata, this fix routes it to the context kernel again, as #24856 does: an AROUND hook
    on ``forward_extend`` presents a DRAFT_EXTEND_V2 batch to the original method as a
    (v1) DRAFT_EXTEND batch for the duration of the call (EXTEND where the release has no v1
    mode), so the method's own routing picks the context kernel with the metadata it already
    built. The decision reads the host-side ``forward_mode`` enum only: no tensor is read, no
    device-to-host copy.

    What XQA hardware (sm90/sm120) needs of a multi-token decode call (a bf16 query and the
    spec-decode mask) is a separate fix: ``trtllm_xqa_spec_decode``.

Upstream PRs
    #24566 (V2 to the decode kernel on ragged metadata, the bug), #24856 (V2 back to the
    context kernel, the fix), #25002 (uniform V2 stride in the CUDA-graph metadata), #28241
    (V2 to the decode kernel again, on that metadata), #29843 (fused strided graph metadata).

Affected versions
    No release. The bug lived on main between #24566 (merged by 2026-05-09) and #24856
    (2026-05-13); 0.5.12 already carries #24856's text. 0.5.10-0.5.13 route DRAFT_EXTEND_V2 to
    the context kernel; 0.5.14 and later route it to the decode kernel on uniform metadata.
    Builds of main from that window, and backports of #24566/#28241 onto branches without
    #25002, are affected.

Detection
    Structure, read from the installed code's syntax tree (never a version string).
    ``routes``: in ``forward_extend``, an ``if`` whose test calls ``is_draft_extend_v2()``
    (not negated), directly or through a flag assigned from it (``is_decode_mode``,
    ``uses_decode_kernel``), guards a decode-kernel call (``trtllm_batch_decode_with_kv_cache``
    or ``_run_fixed_q_len_decode``). ``uniform``: the backend's own CUDA-graph metadata
    methods (names containing ``cuda_graph``, defined in its module) have a DRAFT_EXTEND_V2
    branch, and none builds ``cu_seqlens_q`` from a cumsum of ``num_accept_tokens``.
    Not routes: not needed (#24856 form). Routes and uniform: not needed (#28241 on #25002;
    forcing the context kernel would throw away upstream's speed-up). Routes and not uniform:
    needed. A ``forward_extend`` with no decode-kernel call, or unreadable source: unknown.
    Checked on the sources of every release 0.5.10-0.5.23.
    The ``check`` scenario runs a DRAFT_EXTEND_V2 step (2 requests, 3 draft tokens) through the
    real backend over diverged full/SWA pools with the kernels recorded; the CUDA-graph
    metadata cannot run on CPU, so the batch carries the query lengths the installed
    draft-extend metadata gives it (accepted lengths 1 and 3 without a uniform V2 stride, 3
    and 3 with one). The bug shows when a decode-kernel call gets query rows that are not
    ``len(seq_lens) * q_len_per_req``.

Delete when
    No released wheel needs it; it exists for builds of main from 2026-05-09..05-13 and for
    backports of #24566/#28241 onto branches without #25002. Delete it when such builds are
    no longer supported.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Iterator, List, Optional, Sequence

from sglang_swa_plugin.fix import Detection, Fix, ScenarioUnavailable, TargetMissing, hookimpl
from sglang_swa_plugin.probe import function_text, function_tree, optional_module, own_function, swapped, target_class

MODULE = "sglang.srt.layers.attention.trtllm_mha_backend"
CLASS = MODULE + ".TRTLLMHAAttnBackend"
TARGET = CLASS + ".forward_extend"

DECODE_KERNELS = frozenset({"trtllm_batch_decode_with_kv_cache", "_run_fixed_q_len_decode"})
V2_TEST = "is_draft_extend_v2"


# ---------------------------------------------------------------------------- the fix


def _context_mode(forward_mode: Any) -> Any:
    """The mode a DRAFT_EXTEND_V2 batch is shown as: v1 DRAFT_EXTEND, or EXTEND where the
    release dropped v1. Neither passes ``is_target_verify()`` nor ``is_draft_extend_v2()``."""
    modes = type(forward_mode)
    return getattr(modes, "DRAFT_EXTEND", None) or modes.EXTEND


def _v2_to_context_kernel(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``forward_extend(self, q, k, v, layer, forward_batch, ...)``."""
    forward_batch = args[4] if len(args) > 4 else kwargs["forward_batch"]
    mode = forward_batch.forward_mode
    if not mode.is_draft_extend_v2():
        return original(self, *args, **kwargs)
    with swapped(forward_batch, "forward_mode", _context_mode(mode)):
        return original(self, *args, **kwargs)


# ---------------------------------------------------------------------------- detection


def _syntax(fn: Any) -> ast.FunctionDef:
    """Syntax tree of a function or method (decorators and wrappers looked through); parsed
    once per function (trtllm_xqa_spec_decode reads the same ``forward_extend``)."""
    return function_tree(fn)[0]


@functools.lru_cache(maxsize=64)
def _nodes(tree: ast.AST) -> List[ast.AST]:
    """``ast.walk(tree)`` as a list, computed once per (cached) tree."""
    return list(ast.walk(tree))


def _callee(call: ast.Call) -> Optional[str]:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)


def _calls(node: ast.AST, names: frozenset) -> bool:
    return any(isinstance(n, ast.Call) and _callee(n) in names for n in ast.walk(node))


def _tests_v2(expr: ast.AST, flags: frozenset = frozenset()) -> bool:
    """``expr`` is true for DRAFT_EXTEND_V2: it calls ``is_draft_extend_v2()`` or reads a
    flag assigned from such a call, outside any ``not``."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return False
    if isinstance(expr, ast.Call) and _callee(expr) == V2_TEST:
        return True
    if isinstance(expr, ast.Name) and expr.id in flags:
        return True
    return any(_tests_v2(child, flags) for child in ast.iter_child_nodes(expr))


def _v2_branches(tree: ast.AST, flags: frozenset = frozenset()) -> Iterator[List[ast.AST]]:
    """Bodies of the ``if``s (and conditional expressions) taken for DRAFT_EXTEND_V2."""
    for node in _nodes(tree):
        if isinstance(node, (ast.If, ast.IfExp)) and _tests_v2(node.test, flags):
            yield node.body if isinstance(node.body, list) else [node.body]


def routes_v2_to_decode(forward_extend: Any) -> Optional[bool]:
    """Whether ``forward_extend`` runs a decode kernel for DRAFT_EXTEND_V2; None when it
    calls no decode kernel at all (a shape this fix does not know)."""
    tree = _syntax(forward_extend)
    if not any(isinstance(n, ast.Call) and _callee(n) in DECODE_KERNELS for n in _nodes(tree)):
        return None
    flags = frozenset(
        target.id
        for node in _nodes(tree)
        if isinstance(node, ast.Assign) and _tests_v2(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    )
    return any(_calls(stmt, DECODE_KERNELS) for body in _v2_branches(tree, flags) for stmt in body)


def _ragged(body: Sequence[ast.AST]) -> bool:
    """The branch builds query offsets from the accepted lengths: a cumsum over
    ``num_accept_tokens`` (directly or through a local assigned from it)."""
    def mentions_accept(node: ast.AST, names: frozenset) -> bool:
        return any((isinstance(n, ast.Attribute) and n.attr == "num_accept_tokens")
                   or (isinstance(n, ast.Name) and n.id in names) for n in ast.walk(node))

    nodes = [n for stmt in body for n in ast.walk(stmt)]
    accept = frozenset(t.id for n in nodes if isinstance(n, ast.Assign) and mentions_accept(n.value, frozenset())
                       for t in n.targets if isinstance(t, ast.Name))
    return any(isinstance(n, ast.Call) and _callee(n) == "cumsum" and mentions_accept(n, accept) for n in nodes)


def uniform_v2_metadata(cls: type) -> bool:
    """The backend's own CUDA-graph metadata (methods of the classes of its module; the
    flashinfer base class has its own graph path) has a DRAFT_EXTEND_V2 branch, and none of
    them is built from the accepted lengths (#25002)."""
    seen = set()
    branches = []
    for klass in (k for k in cls.__mro__ if k.__module__ == cls.__module__):
        for name, raw in vars(klass).items():
            if "cuda_graph" not in name or name in seen or not inspect.isfunction(getattr(raw, "__func__", raw)):
                continue
            seen.add(name)
            if V2_TEST not in function_text(raw):  # no V2 branch possible: skip the parse
                continue
            branches += list(_v2_branches(_syntax(raw)))
    return bool(branches) and not any(_ragged(body) for body in branches)


def classify(cls: type) -> Detection:
    forward_extend = own_function(cls, "forward_extend")
    if forward_extend is None:
        raise TargetMissing(TARGET)
    try:
        routes = routes_v2_to_decode(forward_extend)
        uniform = uniform_v2_metadata(cls) if routes else None
    except (OSError, TypeError, SyntaxError) as e:
        return Detection.unknown(f"source of TRTLLMHAAttnBackend unreadable: {type(e).__name__}: {e}")
    if routes is None:
        return Detection.unknown("forward_extend calls no decode kernel: routing not recognised")
    if not routes:
        return Detection.not_needed("DRAFT_EXTEND_V2 runs the context kernel (#24856 form)")
    if uniform:
        return Detection.not_needed(
            "DRAFT_EXTEND_V2 runs the decode kernel on uniform-stride metadata (#25002 + #28241)")
    return Detection.needed(
        "forward_extend sends DRAFT_EXTEND_V2 to the decode kernel, but its CUDA-graph metadata "
        "has no uniform DRAFT_EXTEND_V2 stride (#24566 form)")


def _backend_class() -> type:
    return target_class(CLASS)


# ---------------------------------------------------------------------------- CPU scenario


@dataclass
class KernelCall:
    """One recorded flashinfer call from ``forward_extend``."""

    kernel: str  # "decode" or "context"
    layer_id: int
    q_rows: int
    q_dtype: Any
    q_len_per_req: Optional[int]  # decode: per-request query length; context: None
    batch_size: Optional[int]  # context: its batch_size argument; decode: None
    seq_lens: List[int]
    cu_seqlens_q: Optional[List[int]]  # context only
    page_table: Any  # block_tables as passed (a CPU tensor)
    mask: Any = None  # decode: the spec-decode mask passed (XQA), or None
    window_left: Optional[int] = None  # as passed (-1: full attention)
    q_dense: bool = True  # the query's rows are laid out densely (XQA reads them so)

    def breaks_decode_contract(self) -> bool:
        """A decode call whose query rows are not ``len(seq_lens) * q_len_per_req``: the kernel
        would infer a different batch size and read page-table rows past the batch."""
        return self.kernel == "decode" and self.q_rows != len(self.seq_lens) * (self.q_len_per_req or 1)


def kernel_recorders(calls: List[KernelCall], layer_ids: List[int]) -> SimpleNamespace:
    """A stand-in for the ``flashinfer`` name of the trtllm_mha module whose two entry points
    record their arguments and return zeros of the output shape."""
    import torch

    def output(query, out, out_dtype):
        return out if out is not None else torch.zeros(query.shape, dtype=out_dtype or torch.bfloat16)

    def decode(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, *a,
               q_len_per_req=1, out=None, out_dtype=None, mask=None, **kw):
        calls.append(KernelCall("decode", layer_ids[-1], query.shape[0], query.dtype, q_len_per_req, None,
                                seq_lens.tolist(), None, block_tables.clone(), mask, kw.get("window_left"),
                                query.is_contiguous()))
        return output(query, out, out_dtype)

    def context(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len,
                bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv, *a,
                out=None, out_dtype=None, **kw):
        calls.append(KernelCall("context", layer_ids[-1], query.shape[0], query.dtype, None, batch_size,
                                seq_lens.tolist(), cum_seq_lens_q.tolist(), block_tables.clone()))
        return output(query, out, out_dtype)

    return SimpleNamespace(decode=SimpleNamespace(trtllm_batch_decode_with_kv_cache=decode),
                           prefill=SimpleNamespace(trtllm_batch_context_with_kv_cache=context))


def _page_table_on_cpu(req_to_token, req_pool_indices, cache_seqlens, page_table, page_size,
                       swa_page_table=None, full_to_swa=None):
    """What the Triton ``build_trtllm_mha_page_table`` (0.5.14+) writes, in torch."""
    for i, (row, n) in enumerate(zip(req_pool_indices.tolist(), cache_seqlens.tolist())):
        pages = -(-int(n) // page_size)
        slots = req_to_token[row, : pages * page_size : page_size].long()
        page_table[i, :pages] = (slots // page_size).to(page_table.dtype)
        if swa_page_table is not None:
            swa_page_table[i, :pages] = (full_to_swa[slots] // page_size).to(swa_page_table.dtype)


def _fp8_quant_on_cpu(x, scale=None, *args, **kwargs):
    """What sgl_kernel's per-tensor ``scaled_fp8_quant`` returns, in torch."""
    import torch

    scale = x.abs().amax().float().clamp(min=1e-12) / torch.finfo(torch.float8_e4m3fn).max
    return (x.float() / scale).to(torch.float8_e4m3fn), scale.reshape(1)


def record_extend(backend: Any, forward_batch: Any, layers: Sequence[Any]) -> List[KernelCall]:
    """Build ``backend``'s metadata for ``forward_batch`` and run ``forward_extend`` for every
    layer with the flashinfer kernels (and, where the release has it, the Triton page-table
    builder) replaced by CPU stand-ins; return the recorded kernel calls."""
    import torch

    mod = optional_module(MODULE)
    calls: List[KernelCall] = []
    layer_ids: List[int] = []
    heads = layers[0].tp_q_head_num * layers[0].head_dim
    rows = forward_batch.input_ids.shape[0]
    with swapped(mod, "flashinfer", kernel_recorders(calls, layer_ids)):
        page_builder = (swapped(mod, "build_trtllm_mha_page_table", _page_table_on_cpu)
                        if hasattr(mod, "build_trtllm_mha_page_table") else contextlib.nullcontext())
        fp8_quant = (swapped(mod, "scaled_fp8_quant", _fp8_quant_on_cpu)
                     if hasattr(mod, "scaled_fp8_quant") else contextlib.nullcontext())
        with page_builder, fp8_quant:
            backend.init_forward_metadata(forward_batch)
            for layer in layers:
                layer_ids.append(layer.layer_id)
                q = torch.randn(rows, heads, dtype=torch.bfloat16)
                backend.forward_extend(q, None, None, layer, forward_batch, save_kv_cache=False)
    return calls


def scenario() -> List[KernelCall]:
    """A DRAFT_EXTEND_V2 step of 2 requests, 3 draft tokens each, on a real trtllm_mha backend
    over diverged full/SWA pools, with kernels recorded. The CUDA-graph metadata cannot run on
    CPU, so the batch carries the per-request query lengths that the installed draft-extend
    metadata gives it: the accepted lengths (1 and 3, ragged) where it has no uniform
    DRAFT_EXTEND_V2 stride, the stride (3 and 3) where it has one (#25002)."""
    from sglang_swa_plugin import testbed

    try:
        uniform = uniform_v2_metadata(_backend_class())
        bench = extend_bench()
        lens = [3, 3] if uniform else [1, 3]
        return record_extend(bench.backend, bench.batch("DRAFT_EXTEND_V2", lens), bench.layers)
    except testbed.Unavailable as e:
        raise ScenarioUnavailable(str(e)) from None


def extend_bench(num_draft_tokens: int = 3, prefix_lens: Sequence[int] = (4, 6)) -> SimpleNamespace:
    """A real trtllm_mha backend (EAGLE target runner over an SWAKVPool whose full and SWA
    index spaces diverge), one SWA and one full RadixAttention layer, and
    ``batch(mode, extend_lens)``: a real ForwardBatch for EXTEND, TARGET_VERIFY or
    DRAFT_EXTEND_V2 of requests holding ``prefix_lens`` tokens. ``seq_lens`` are the totals
    after this step's K/V (before the drafts for TARGET_VERIFY, which adds them itself)."""
    import torch
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang_swa_plugin import testbed

    pool = testbed.make_swa_pool()
    allocator = testbed.make_swa_allocator(pool)
    testbed.diverge(allocator)
    req_to_token = testbed.make_req_to_token_pool()
    runner = testbed.make_model_runner(kv_pool=pool, allocator=allocator, req_to_token_pool=req_to_token,
                                       spec_algorithm="EAGLE", num_draft_tokens=num_draft_tokens)
    backend = testbed.build_trtllm_backend(runner)
    cfg = runner.model_config
    swa_ids = sorted(i for i, (_, is_swa) in pool.layers_mapping.items() if is_swa)
    full_ids = sorted(i for i, (_, is_swa) in pool.layers_mapping.items() if not is_swa)
    layers = [RadixAttention(cfg.num_attention_heads, cfg.head_dim, cfg.head_dim ** -0.5, cfg.get_num_kv_heads(1),
                             layer_id=i, sliding_window_size=runner.sliding_window_size if i in swa_ids else -1)
              for i in (swa_ids[0], full_ids[0])]
    tokens = [testbed.alloc_tokens(allocator, n + 2 * num_draft_tokens) for n in prefix_lens]
    rows, _ = testbed.fill_requests(req_to_token, tokens)

    def batch(mode: str, extend_lens: Sequence[int]) -> Any:
        verify = mode == "TARGET_VERIFY"
        seq = list(prefix_lens) if verify else [p + e for p, e in zip(prefix_lens, extend_lens)]
        new = torch.cat([t[p:p + e] for t, p, e in zip(tokens, prefix_lens, extend_lens)])
        return testbed.make_forward_batch(runner, mode.lower(), req_pool_indices=rows, seq_lens=seq, out_cache_loc=new,
                                          extend_seq_lens=None if verify else list(extend_lens), attn_backend=backend)

    return SimpleNamespace(runner=runner, backend=backend, layers=layers, pool=pool, allocator=allocator,
                           req_to_token=req_to_token, tokens=tokens, rows=rows, batch=batch)


class TrtllmExtendRoutingFix(Fix):
    name = "trtllm_extend_routing"
    summary = "trtllm_mha runs DRAFT_EXTEND_V2 on the decode kernel only with uniform per-request query lengths"
    upstream_prs = ("#24566", "#24856", "#25002", "#28241")
    targets = (TARGET,)
    target_params = {TARGET: ("self", "q", "k", "v", "layer", "forward_batch")}
    scenario_summary = ("a DRAFT_EXTEND_V2 step (2 requests x 3 draft tokens) on a real trtllm_mha backend, kernels "
                        "recorded: does a ragged batch reach the decode kernel")

    def detect(self) -> Detection:
        if optional_module(MODULE) is None:
            return Detection.not_applicable("this sglang has no trtllm_mha backend")
        return classify(_backend_class())

    def install(self, hooks) -> None:
        hooks.around(TARGET, _v2_to_context_kernel)

    def reproduce(self) -> bool:
        return any(call.breaks_decode_contract() for call in scenario())


FIX = TrtllmExtendRoutingFix()


@hookimpl
def sglang_swa_plugin_fixes():
    return [FIX]
