"""CPU scenario of ``trtllm_xqa_spec_decode``: multi-token decode calls of a real trtllm_mha
backend that the release's own ``__init__`` set up for XQA hardware, kernels recorded. On
0.5.21+ the backend builds and passes its own spec-decode mask; nothing of the plugin takes
part unless the fix is installed."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, List, Tuple

from ..probe import swapped
from ..trtllm_mha import MODULE
from . import Outcome
from .kernels import KernelCall, extend_bench, record_extend


class _Sm90:
    """A platform answering sm90 (XQA hardware); everything else from the real one."""

    is_sm90, is_sm120 = True, False

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def as_xqa_hardware(xqa: bool = True) -> contextlib.ExitStack:
    """For the block, the backend module's hardware query (``get_platform()``, or
    ``is_sm90_supported()`` in older code) answers sm90, so that the release's own
    ``__init__`` sets itself up for XQA, building its own spec-decode mask where it has one."""
    mod = importlib.import_module(MODULE)
    stack = contextlib.ExitStack()
    if xqa and hasattr(mod, "get_platform"):
        real = mod.get_platform
        stack.enter_context(swapped(mod, "get_platform", lambda: _Sm90(real())))
    elif xqa and hasattr(mod, "is_sm90_supported"):
        stack.enter_context(swapped(mod, "is_sm90_supported", lambda *a, **k: True))
    return stack


def xqa_backend_calls(xqa: bool = True) -> Tuple[Any, List[KernelCall]]:
    """(backend, recorded kernel calls) of TARGET_VERIFY then DRAFT_EXTEND_V2 (2 requests x 3
    tokens, uniform) on a backend built as on XQA hardware (``xqa=False``: as on Blackwell)
    with an FP8 KV dtype."""
    import torch

    with as_xqa_hardware(xqa):
        bench = extend_bench()
    backend = bench.backend
    backend.is_xqa_impl = xqa
    backend.data_type = torch.float8_e4m3fn
    calls = record_extend(backend, bench.batch("TARGET_VERIFY", [3, 3]), bench.layers)
    return backend, calls + record_extend(backend, bench.batch("DRAFT_EXTEND_V2", [3, 3]), bench.layers)


def xqa_calls(xqa: bool = True) -> List[KernelCall]:
    return xqa_backend_calls(xqa)[1]


def broken(calls: List[KernelCall]) -> List[KernelCall]:
    """Decode calls XQA refuses: a query that is not bf16, or more than one token per request
    without a mask. (The windowed multi-token calls the fix also rewrites are checked by the
    tests and on the GPU: XQA runs them, inexactly.)"""
    import torch

    return [c for c in calls if c.kernel == "decode"
            and (c.q_dtype != torch.bfloat16 or ((c.q_len_per_req or 1) > 1 and c.mask is None))]


def scenario() -> Outcome:
    """TARGET_VERIFY and DRAFT_EXTEND_V2 (2 requests x 3 tokens) on a real trtllm_mha backend set up
    as on XQA hardware with an FP8 KV cache, kernels recorded: does XQA get a mask and a bf16
    query? The backend is the release's own, built by its ``__init__`` on sm90 (its
    ``is_xqa_impl`` and, in 0.5.21+, its own spec-decode mask). ``seen``: the recorded calls."""
    calls = xqa_calls()
    return Outcome(bool(broken(calls)), calls)


def reproduce() -> bool:
    return scenario().bug
