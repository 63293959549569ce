"""What the trtllm_mha fixes read of the installed ``TRTLLMHAAttnBackend``: its dotted names
and the syntax-tree reading of ``forward_extend`` (which modes reach the decode kernel).
Shared by ``trtllm_extend_routing`` and ``trtllm_xqa_spec_decode``; runtime only."""

from __future__ import annotations

import ast
import functools
from typing import Any, Iterator, List, Optional

from .fix import TargetMissing
from .probe import calls, callee, function_tree, nodes, own_function, target_class

MODULE = "sglang.srt.layers.attention.trtllm_mha_backend"
CLASS = MODULE + ".TRTLLMHAAttnBackend"
FORWARD_EXTEND = CLASS + ".forward_extend"
FORWARD_EXTEND_PARAMS = ("self", "q", "k", "v", "layer", "forward_batch")

DECODE_KERNELS = frozenset({"trtllm_batch_decode_with_kv_cache", "_run_fixed_q_len_decode"})
V2_TEST = "is_draft_extend_v2"


def backend_class() -> type:
    return target_class(CLASS)


def syntax(fn: Any) -> ast.FunctionDef:
    """Syntax tree of a function or method (decorators and wrappers looked through), parsed
    once per function."""
    return function_tree(fn)[0]


def forward_extend_tree(cls: type) -> ast.FunctionDef:
    fn = own_function(cls, "forward_extend")
    if fn is None:
        raise TargetMissing(FORWARD_EXTEND)
    return syntax(fn)


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
    if not any(isinstance(n, ast.Call) and callee(n) in DECODE_KERNELS for n in nodes(tree)):
        return None
    return any(calls(stmt, DECODE_KERNELS) for body in v2_branches(tree, v2_flags(tree)) for stmt in body)


def routes_v2_to_decode(forward_extend: Any) -> Optional[bool]:
    """Whether ``forward_extend`` runs a decode kernel for DRAFT_EXTEND_V2; None when it
    calls no decode kernel at all (a shape no fix knows)."""
    return _routes(syntax(forward_extend))
