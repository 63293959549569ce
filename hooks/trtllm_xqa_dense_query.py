"""trtllm_mha on XQA (sm90/sm120): single-token decode calls get the query dense.

Bug
    #22517 made the XQA query ``q.reshape(...)``; models pass q as a view of their fused qkv
    (rows strided by q+k+v) and XQA reads it as dense: batched requests read other rows.
    Fix, as #31667: on XQA ``forward_decode`` gets the query dense where it is strided.
Upstream PRs
    #31641 (issue), #31667 (the fix, ``forward_decode``), #22517 (the cause).
Affected versions
    ``forward_decode`` 0.5.11-0.5.15; copied on XQA from 0.5.16. Not Blackwell. Not
    covered: DFlash's ENCODER_ONLY verify rows (outside the plugin's modes).
    Status by release: not needed 0.5.10; applied 0.5.11-0.5.15; not needed 0.5.16+.
Detection
    Per method, its text or else its syntax tree: ``q = q.reshape(...)`` outside a non-XQA
    branch, and a decode call with one query token per request.
Delete when
    0.5.16 is the oldest supported sglang.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from sglang_swa_plugin.fix import Detection, Fix, TargetMissing, argument, around, with_argument
from sglang_swa_plugin.probe import callee, compact, function_text, nodes, optional_module, own_function
from sglang_swa_plugin.trtllm_mha import (DECODE_KERNELS, FORWARD_DECODE, FORWARD_DECODE_PARAMS, MODULE, XQA_FLAG,
                                          backend_class, syntax)

NAME = "trtllm_xqa_dense_query"
TARGETS = {"forward_decode": FORWARD_DECODE}


# ---------------------------------------------------------------------------- the hook


def _dense_query(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``forward_decode``: on XQA, a strided query is handed on dense (upstream's
    ``q.contiguous()``; one copy, captured with the graph, no sync)."""
    q = argument(original, "q", args, kwargs)
    if getattr(self, XQA_FLAG, False) and not q.is_contiguous():
        args, kwargs = with_argument(original, "q", q.contiguous(), args, kwargs)
    return original(self, *args, **kwargs)


# ---------------------------------------------------------------------------- detection


def _chain(expr: Any) -> Tuple[Optional[str], List[str]]:
    """``q.contiguous().view(...)`` -> ("q", ["contiguous", "view"])."""
    names = []
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        names.append(expr.func.attr)
        expr = expr.func.value
    return (expr.id if isinstance(expr, ast.Name) else None), names[::-1]


def _query_shapes(nodes: List[Any]) -> List[Tuple[Any, bool]]:
    """The method's ``q = q....reshape(...)``/``.view(...)`` assignments, each with whether
    it makes q dense (a ``.contiguous()`` in the chain)."""
    out = []
    for node in nodes:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "q"):
            base, names = _chain(node.value)
            if base == "q" and names and names[-1] in ("reshape", "view"):
                out.append((node, "contiguous" in names))
    return out


def _flag(test: Any) -> Tuple[Optional[str], bool]:
    """(attribute, negated) of an ``if self.<attr>`` / ``if not self.<attr>`` test."""
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    test = test.operand if negated else test
    if isinstance(test, ast.Attribute) and isinstance(test.value, ast.Name) and test.value.id == "self":
        return test.attr, negated
    return None, False


# 0.5.16+ forward_decode, 0.5.19+ forward_extend (whitespace removed): the copy on XQA only.
_GUARDED = re.compile(r"ifself\.(\w+):q=q\.contiguous\(\)\.view\([^:]*?\)else:q=q\.reshape\(")
_RESHAPE = re.compile(r"^( *)q\s*=\s*q\s*\.\s*reshape\(", re.M)
_SELF_ASSIGN = re.compile(r"^\s*self\.(\w+)\s*(?::[^=]+)?=\s*(.+?)\s*$", re.M)


def _xqa_flags(cls: type) -> frozenset:
    """``is_xqa_impl`` and the flags ``__init__`` sets from the same expression (``use_fmha_v2``
    from 0.5.19: both ``is_sm90 or is_sm120``)."""
    init = own_function(cls, "__init__")
    first: Dict[str, str] = {}
    for name, value in _SELF_ASSIGN.findall(function_text(init) if init is not None else ""):
        first.setdefault(name, re.sub(r"\s+", "", value))
    xqa = first.get(XQA_FLAG)
    return frozenset({XQA_FLAG} | {n for n, v in first.items() if xqa is not None and v == xqa})


def _reaches_xqa(node: Any, ifs: List[Any], flags: Callable[[], frozenset]) -> bool:
    """The assignment is not in the branch an XQA flag rules out."""
    for stmt in ifs:
        attr, negated = _flag(stmt.test)
        if attr is not None and (node in stmt.orelse and not negated or node in stmt.body and negated):
            return not (attr == XQA_FLAG or attr in flags())
    return True


def method_verdict(cls: type, method: str) -> Tuple[Optional[bool], str]:
    """(needed, why) for one method: True needed, False not, None shape not recognised."""
    fn = own_function(cls, method)
    if fn is None:
        raise TargetMissing(TARGETS[method])
    flags: list = []

    def xqa_flags() -> frozenset:
        if not flags:
            flags.append(_xqa_flags(cls))
        return flags[0]

    return text_verdict(method, function_text(fn), xqa_flags) or tree_verdict(method, syntax(fn), xqa_flags)


def text_verdict(method: str, text: str, xqa_flags: Callable[[], frozenset]) -> Optional[Tuple[bool, str]]:
    """The verdict where the method's text has a form upstream shipped, else None (the tree
    decides; parsing costs about a millisecond per method): dense, 0.5.10's copy everywhere
    or the copy on XQA only (0.5.16+ ``forward_decode``, 0.5.19+ ``forward_extend``); strided,
    ``q = q.reshape(...)`` as a statement of the method's own body (on every path), no copy,
    and no decode call given ``q_len_per_req`` (0.5.11-0.5.15 ``forward_decode``)."""
    flat = compact(text)
    if "q=q.view(" in flat:
        return None
    if "q=q.contiguous().view(" in flat:
        guarded = _GUARDED.findall(flat)
        if len(guarded) == flat.count("q=q.reshape(") and all(f == XQA_FLAG or f in xqa_flags() for f in guarded):
            return False, f"{method} hands XQA a dense query"
        return None
    reshape = _RESHAPE.search(text)
    if (reshape and len(reshape.group(1)) == _body_indent(text) and "contiguous" not in flat
            and "q_len_per_req" not in flat and any(k + "(" in flat for k in DECODE_KERNELS)):
        return True, f"{method} hands XQA `q.reshape(...)` of the model's (strided) query, one token per request"
    return None


def _body_indent(text: str) -> int:
    """Indentation of a function's own statements: that of the first line after its header
    (the line where the signature's brackets close on a ':')."""
    lines, depth = text.splitlines(), 0
    for i, line in enumerate(lines):
        code = line.split("#", 1)[0]
        depth += sum(map(code.count, "([{")) - sum(map(code.count, ")]}"))
        if depth <= 0 and code.rstrip().endswith(":"):
            rest = [l for l in lines[i + 1:] if l.strip()]
            return len(rest[0]) - len(rest[0].lstrip()) if rest else -1
    return -1


def tree_verdict(method: str, tree: Any, xqa_flags: Callable[[], frozenset]) -> Tuple[Optional[bool], str]:
    """``method_verdict`` on a method's syntax tree; ``xqa_flags()``: the attributes that are
    true exactly on XQA hardware (read from ``__init__`` only when a guard needs them)."""
    walked = nodes(tree)
    shapes = _query_shapes(walked)
    if not shapes:
        return None, f"{method}: no `q = q.reshape/view(...)` of the query found"
    ifs = [n for n in walked if isinstance(n, ast.If)]
    strided = [n for n, dense in shapes if not dense and _reaches_xqa(n, ifs, xqa_flags)]
    if not strided:
        return False, f"{method} hands XQA a dense query"
    calls = [n for n in walked if isinstance(n, ast.Call) and callee(n) in DECODE_KERNELS]
    if not calls:
        return None, f"{method} reshapes the query without a copy but calls no decode kernel"
    if not any(_one_token_per_request(c) and not _dense_argument(c) for c in calls):
        return False, (f"{method} hands XQA `q.reshape(...)` on multi-token calls only "
                       "(trtllm_xqa_spec_decode makes those dense)")
    return True, f"{method} hands XQA `q.reshape(...)` of the model's (strided) query, one token per request"


def _one_token_per_request(call: Any) -> bool:
    """The decode call has no ``q_len_per_req`` argument, or the constant 1."""
    for kw in call.keywords:
        if kw.arg == "q_len_per_req":
            return isinstance(kw.value, ast.Constant) and kw.value.value == 1
    return True


def _dense_argument(call: Any) -> bool:
    """The decode call's ``query=`` is a ``.contiguous()`` chain."""
    return any(kw.arg == "query" and "contiguous" in _chain(kw.value)[1] for kw in call.keywords)


def classify() -> Detection:
    if optional_module(MODULE) is None:
        return Detection.not_applicable("this sglang has no trtllm_mha backend")
    cls = backend_class()
    try:
        verdicts = [method_verdict(cls, m) for m in TARGETS]
    except (OSError, TypeError, SyntaxError) as e:
        return Detection.unknown(f"source of TRTLLMHAAttnBackend unreadable: {type(e).__name__}: {e}")
    unknown = [why for needed, why in verdicts if needed is None]
    if unknown:
        return Detection.unknown("; ".join(unknown))
    needed = [why for needed, why in verdicts if needed]
    if needed:  # the hook goes on the methods that need it
        return Detection.needed("; ".join(needed), *(around(TARGETS[m], _dense_query)
                                                     for m, (n, _) in zip(TARGETS, verdicts) if n))
    return Detection.not_needed("; ".join(why for _, why in verdicts))


class TrtllmXqaDenseQueryFix(Fix):
    name = NAME
    summary = "trtllm_mha on XQA (sm90/sm120): single-token decode calls get the query dense, not a strided view"
    upstream_prs = ("#31641", "#31667", "#22517")
    targets = tuple(TARGETS.values())
    target_params = {FORWARD_DECODE: FORWARD_DECODE_PARAMS}
    check_module = "sglang_swa_plugin.check.trtllm_xqa_dense_query"

    def detect(self) -> Detection:
        return classify()


FIX = TrtllmXqaDenseQueryFix()
