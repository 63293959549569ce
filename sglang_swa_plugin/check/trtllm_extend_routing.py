"""CPU scenario of ``trtllm_extend_routing``: does a ragged DRAFT_EXTEND_V2 batch reach the
decode kernel of a real trtllm_mha backend?"""

from __future__ import annotations

from ..hooks.trtllm_extend_routing import uniform_v2_metadata
from ..trtllm_mha import backend_class
from . import Outcome
from .kernels import extend_bench, record_extend


def scenario() -> Outcome:
    """a DRAFT_EXTEND_V2 step (2 requests x 3 draft tokens) on a real trtllm_mha backend, kernels
    recorded: does a ragged batch reach the decode kernel. The backend runs over diverged
    full/SWA pools; the CUDA-graph metadata cannot run on CPU, so the batch carries the
    per-request query lengths the installed draft-extend metadata gives it: the accepted
    lengths (1 and 3, ragged) where it has no uniform DRAFT_EXTEND_V2 stride, the stride (3
    and 3) where it has one (#25002). ``seen``: the recorded kernel calls."""
    lens = [3, 3] if uniform_v2_metadata(backend_class()) else [1, 3]
    bench = extend_bench()
    calls = record_extend(bench.backend, bench.batch("DRAFT_EXTEND_V2", lens), bench.layers)
    return Outcome(any(call.breaks_decode_contract() for call in calls), calls)


def reproduce() -> bool:
    return scenario().bug
