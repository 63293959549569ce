"""trtllm_mha: DRAFT_EXTEND_V2 reaches the decode kernel only where that kernel's contract holds.

Bug
    #24566 sent DRAFT_EXTEND_V2 to the decode kernel (one query length per request) on ragged
    draft-extend metadata: more "requests" than the batch, page-table rows read past it
    (illegal memory access). Fix, as #24856: the batch is shown to ``forward_extend`` as
    DRAFT_EXTEND (EXTEND without v1) for the call, so it takes the context kernel.
Upstream PRs
    #24566 (the bug), #24856 (the fix), #25002 (uniform V2 metadata), #28241 (decode kernel
    again, on it), #29843.
Affected versions
    No release: builds of main between #24566 and #24856 (2026-05-09..13), and backports of
    #24566/#28241 onto branches without #25002.
    Status by release: not needed 0.5.10+.
Detection
    Syntax tree: ``forward_extend`` routes DRAFT_EXTEND_V2 to a decode-kernel call and the
    backend's CUDA-graph metadata builds ragged V2 offsets: needed. No decode call: unknown.
Delete when
    No supported build carries #24566 or #28241 without #25002.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any, Callable, Sequence

from sglang_swa_plugin.fix import Detection, Fix, TargetMissing, argument, around
from sglang_swa_plugin.probe import callee, function_text, if_branches, optional_module, own_function, swapped
from sglang_swa_plugin.trtllm_mha import (FORWARD_EXTEND as TARGET, FORWARD_EXTEND_PARAMS, MODULE, V2_TEST, has,
                                          backend_class, routes_v2_to_decode, syntax, tests_v2,
                                          v2_branches)


# ---------------------------------------------------------------------------- the fix


def _context_mode(forward_mode: Any) -> Any:
    """The mode a DRAFT_EXTEND_V2 batch is shown as: v1 DRAFT_EXTEND, or EXTEND where the
    release dropped v1. Neither passes ``is_target_verify()`` nor ``is_draft_extend_v2()``."""
    modes = type(forward_mode)
    return getattr(modes, "DRAFT_EXTEND", None) or modes.EXTEND


def _v2_to_context_kernel(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``forward_extend(self, q, k, v, layer, forward_batch, ...)``."""
    forward_batch = argument(original, "forward_batch", args, kwargs)
    mode = forward_batch.forward_mode
    if not mode.is_draft_extend_v2():
        return original(self, *args, **kwargs)
    with swapped(forward_batch, "forward_mode", _context_mode(mode)):
        return original(self, *args, **kwargs)


# ---------------------------------------------------------------------------- detection


def _ragged(body: Sequence[ast.AST]) -> bool:
    """The branch builds query offsets from the accepted lengths: a cumsum over
    ``num_accept_tokens`` (directly or through a local assigned from it)."""
    if not any(has(stmt, "call", "cumsum") for stmt in body):
        return False
    nodes = [n for stmt in body for n in ast.walk(stmt)]
    accept = frozenset(t.id for n in nodes if isinstance(n, ast.Assign) and has(n.value, "attr", "num_accept_tokens")
                       for t in n.targets if isinstance(t, ast.Name))
    return any(isinstance(n, ast.Call) and callee(n) == "cumsum"
               and (has(n, "attr", "num_accept_tokens") or has(n, "name", *accept)) for n in nodes)


def uniform_v2_metadata(cls: type) -> bool:
    """The backend's own CUDA-graph metadata (methods of the classes of its module; the
    flashinfer base class has its own graph path) has a DRAFT_EXTEND_V2 branch, and none of
    them is built from the accepted lengths (#25002). Only methods whose text names
    ``is_draft_extend_v2`` can hold such a branch and only those naming ``cumsum`` a ragged
    one: these are all parsed; of the others, only as many as it takes to find a branch (an
    ``if`` statement on it is found by ``if_branches`` without parsing the method)."""
    seen, methods = set(), []
    for klass in (k for k in cls.__mro__ if k.__module__ == cls.__module__):
        for name, raw in vars(klass).items():
            if "cuda_graph" not in name or name in seen or not inspect.isfunction(getattr(raw, "__func__", raw)):
                continue
            seen.add(name)
            text = function_text(raw)
            if V2_TEST in text:  # no V2 branch possible otherwise: no parse
                methods.append((raw, "cumsum" in text))
    found = False
    for raw, may_be_ragged in sorted(methods, key=lambda m: not m[1]):
        if found and not may_be_ragged:
            break  # can neither add a ragged branch nor change that one exists
        if not may_be_ragged and any(tests_v2(n.test) for n in if_branches(raw, V2_TEST)):
            found = True  # an ``if`` on DRAFT_EXTEND_V2, parsed alone (no parse of the method)
            continue
        tree = syntax(raw)
        bodies = list(v2_branches(tree))
        found = found or bool(bodies)
        if may_be_ragged and any(_ragged(body) for body in bodies):
            return False
    return found


def classify() -> Detection:
    if optional_module(MODULE) is None:
        return Detection.not_applicable("this sglang has no trtllm_mha backend")
    cls = backend_class()
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


class TrtllmExtendRoutingFix(Fix):
    name = "trtllm_extend_routing"
    summary = "trtllm_mha runs DRAFT_EXTEND_V2 on the decode kernel only with uniform per-request query lengths"
    upstream_prs = ("#24566", "#24856", "#25002", "#28241")
    targets = (TARGET,)
    target_params = {TARGET: FORWARD_EXTEND_PARAMS}
    check_module = "sglang_swa_plugin.check.trtllm_extend_routing"

    def detect(self) -> Detection:
        return classify().with_plan(around(TARGET, _v2_to_context_kernel))


FIX = TrtllmExtendRoutingFix()
