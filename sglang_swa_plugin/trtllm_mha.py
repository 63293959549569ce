"""What the trtllm_mha fixes read of the installed ``TRTLLMHAAttnBackend``: its dotted names,
the syntax-tree reading of ``forward_extend`` (which modes reach the decode kernel), and the
module view through which a fix hands the backend's ``flashinfer`` calls something else.
Shared by ``trtllm_extend_routing``, ``trtllm_xqa_spec_decode``, ``trtllm_xqa_dense_query`` and
``trtllm_local_attn``, with what the kernel-call rewrites share (one-token rows of a multi-token
call, its query as XQA reads it exactly, a derivation kept for one forward pass); runtime only."""

from __future__ import annotations

import ast
import functools
import sys
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Tuple

from . import state
from .graphed import capturing
from .probe import callee, function_tree, nodes, target_class

MODULE = "sglang.srt.layers.attention.trtllm_mha_backend"
CLASS = MODULE + ".TRTLLMHAAttnBackend"
FORWARD_EXTEND = CLASS + ".forward_extend"
FORWARD_DECODE = CLASS + ".forward_decode"
FORWARD_EXTEND_PARAMS = ("self", "q", "k", "v", "layer", "forward_batch")
FORWARD_DECODE_PARAMS = FORWARD_EXTEND_PARAMS

DECODE_KERNELS = frozenset({"trtllm_batch_decode_with_kv_cache", "_run_fixed_q_len_decode"})
V2_TEST = "is_draft_extend_v2"
XQA_FLAG = "is_xqa_impl"  # set by the backend's __init__ on sm90/sm120, where the decode kernel is XQA


def backend_class() -> type:
    return target_class(CLASS)


class ModuleView:
    """A view of a module: ``overrides`` first, everything else from the module. The
    trtllm_mha fixes put one in place of the backend module's ``flashinfer`` for a call."""

    def __init__(self, module: Any, **overrides: Any) -> None:
        self.__dict__.update(overrides)
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def with_decode_entry(flashinfer: Any, decode: Any) -> ModuleView:
    """``flashinfer`` whose ``decode.trtllm_batch_decode_with_kv_cache`` is ``decode``."""
    return ModuleView(flashinfer, decode=ModuleView(flashinfer.decode, trtllm_batch_decode_with_kv_cache=decode))


def flashinfer_view(backend: Any, slot: str, build: Callable[[Any], ModuleView]) -> Tuple[Any, ModuleView]:
    """(the backend module, ``build(flashinfer)``): a view of the module's current
    ``flashinfer``, kept in ``backend``'s state (``state``) under ``slot`` and built again when
    that name holds another object (another fix's view during its call, a test's kernel recorders)."""
    mod = sys.modules[MODULE]
    view = state.get(backend, slot)
    if view is None or view._module is not mod.flashinfer:
        view = state.of(backend)[slot] = build(mod.flashinfer)
    return mod, view


def syntax(fn: Any) -> ast.FunctionDef:
    """Syntax tree of a function or method (decorators and wrappers looked through), parsed
    once per function."""
    return function_tree(fn)[0]


def has(node: ast.AST, kind: str, *names: str) -> bool:
    """``node``'s subtree holds a call (``kind`` "call": ``f()``/``x.f()``), attribute ("attr")
    or variable ("name") of one of ``names``."""
    for n in ast.walk(node):
        if kind == "call" and isinstance(n, ast.Call) and callee(n) in names:
            return True
        if kind == "attr" and isinstance(n, ast.Attribute) and n.attr in names:
            return True
        if kind == "name" and isinstance(n, ast.Name) and n.id in names:
            return True
    return False


def tests_v2(expr: ast.AST, flags: frozenset = frozenset()) -> bool:
    """``expr`` is true for DRAFT_EXTEND_V2: it calls ``is_draft_extend_v2()`` or reads a
    flag assigned from such a call, outside any ``not``."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return False
    if isinstance(expr, ast.Call) and callee(expr) == V2_TEST:
        return True
    if isinstance(expr, ast.Name) and expr.id in flags:
        return True
    return any(tests_v2(child, flags) for child in ast.iter_child_nodes(expr))


@functools.lru_cache(maxsize=64)
def v2_flags(tree: ast.AST) -> frozenset:
    """Local names assigned from a DRAFT_EXTEND_V2 test (``is_decode_mode``,
    ``uses_decode_kernel``...)."""
    return frozenset(t.id for n in nodes(tree) if isinstance(n, ast.Assign) and tests_v2(n.value)
                     for t in n.targets if isinstance(t, ast.Name))


def v2_branches(tree: ast.AST, flags: frozenset = frozenset()) -> Iterator[List[ast.AST]]:
    """Bodies of the ``if``s (and conditional expressions) taken for DRAFT_EXTEND_V2."""
    for node in nodes(tree):
        if isinstance(node, (ast.If, ast.IfExp)) and tests_v2(node.test, flags):
            yield node.body if isinstance(node.body, list) else [node.body]


@functools.lru_cache(maxsize=64)
def _routes(tree: ast.AST) -> Optional[bool]:
    if not has(tree, "call", *DECODE_KERNELS):
        return None
    return any(has(stmt, "call", *DECODE_KERNELS) for body in v2_branches(tree, v2_flags(tree)) for stmt in body)


def routes_v2_to_decode(forward_extend: Any) -> Optional[bool]:
    """Whether ``forward_extend`` runs a decode kernel for DRAFT_EXTEND_V2; None when it
    calls no decode kernel at all (a shape no fix knows)."""
    return _routes(syntax(forward_extend))


# ---------------------------------------------------------------------------- kernel-call rewrites


class _Kept(NamedTuple):
    layer_id: int  # the last layer that used the value
    sources: tuple  # the tensors it was derived from (held: compared by identity)
    key: Any  # what else it was derived from (compared by value)
    capturing: bool
    value: Any


class PerPass:
    """A device-side derivation shared by the layers of one forward pass. sglang captures a pass
    after running it eagerly on the same static buffers, and at replay no Python runs, so a
    value is reused only by a later layer of the same pass: a layer id that does not grow
    starts a new pass (a warm-up run, then the capture, then the next batch), as do other
    source tensors or a change of capture state; a captured pass records its own derivation."""

    def __init__(self) -> None:
        self.kept: Optional[_Kept] = None

    def get(self, layer_id: int, sources: tuple, key: Any, build: Callable[[], Any]) -> Any:
        now, kept = capturing(), self.kept
        if (kept is None or layer_id <= kept.layer_id or kept.capturing != now or kept.key != key
                or len(kept.sources) != len(sources) or any(a is not b for a, b in zip(kept.sources, sources))):
            kept = _Kept(layer_id, sources, key, now, build())
        self.kept = kept._replace(layer_id=layer_id)
        return kept.value


def one_token_lens(seq_lens: Any, q_len: int) -> Any:
    """Row r of a request with ``seq_lens`` S (after its ``q_len`` query tokens' K/V) as a request
    of its own: ``S - q_len + 1 + r`` keys (at least 1: padded graph rows). Device ops of a fixed size."""
    import torch

    offsets = torch.arange(1 - q_len, 1, device=seq_lens.device, dtype=seq_lens.dtype)
    return (seq_lens[:, None] + offsets[None, :]).reshape(-1).clamp_(min=1)


def one_token_rows(seq_lens: Any, block_tables: Any, q_len: int) -> Tuple[Any, Any]:
    """``one_token_lens`` and each row's page-table row (the request's)."""
    return one_token_lens(seq_lens, q_len), block_tables.repeat_interleave(q_len, dim=0)


def exact_query(query: Any, out_dtype: Any) -> Any:
    """A multi-token call's query as XQA computes it exactly: dense (models hand over q as a view
    of their fused qkv projection, rows strided by q+k+v; XQA reads rows as if dense), and a
    query the release made FP8 in the output dtype (its scale is already in ``bmm1_scale``)."""
    import torch

    if query.dtype == torch.float8_e4m3fn:
        query = query.to(out_dtype or torch.bfloat16)
    return query.contiguous()
