"""CPU scenario of ``trtllm_xqa_dense_query``: the single-token decode-kernel calls of a real
trtllm_mha backend that the release's own ``__init__`` set up for XQA hardware, given the
query as GPT-OSS and MiMo-V2 hand it over (a split view of a fused qkv projection), the
flashinfer kernels recorded with the query they receive. XQA reads the query rows as dense:
what it would read is the receiving tensor's memory laid out densely from its first element."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List

from ..probe import optional_module, swapped
from ..trtllm_mha import MODULE
from . import Outcome
from .kernels import cpu_kernels, extend_bench, kernel_recorders
from .trtllm_xqa_spec_decode import as_xqa_hardware

PREFIXES = (2, 4, 3)  # tokens of the requests decoding together (before this step)
BATCH = len(PREFIXES)


@dataclass
class QueryCall:
    """One recorded decode-kernel call: the query it received and the model's q rows."""

    mode: str
    layer_id: int
    q_len_per_req: Any
    query: Any  # the tensor the kernel received (as passed: its strides too)
    model_rows: Any  # the model's q, [tokens, heads, head_dim], dense copy

    @property
    def dense(self) -> bool:
        return bool(self.query.is_contiguous())

    def rows_as_xqa_reads(self) -> Any:
        """The query as a kernel that ignores strides reads it: dense from its first element."""
        import torch

        q = self.query
        return torch.as_strided(q, q.shape, torch.empty(q.shape, device="meta").stride(), q.storage_offset())

    def misread(self) -> bool:
        """Some request's query, as XQA reads it, is not the model's q for that request."""
        import torch

        return not torch.equal(self.rows_as_xqa_reads(), self.model_rows)

    def misread_rows(self) -> List[int]:
        """The query rows (tokens) XQA would read from other memory than the model's q row."""
        read = self.rows_as_xqa_reads().reshape(self.model_rows.shape[0], -1)
        want = self.model_rows.reshape(read.shape)
        return [i for i in range(read.shape[0]) if not bool(read[i].equal(want[i]))]


def fused_query(tokens: int, layer: Any, seed: int = 0) -> Any:
    """q as GPT-OSS/MiMo-V2 pass it to attention: ``q, k, v = qkv.split(...)`` of the fused
    projection's output (rows strided by q+k+v)."""
    import torch

    q_width = layer.tp_q_head_num * layer.head_dim
    kv_width = layer.tp_k_head_num * layer.head_dim
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, q_width + 2 * kv_width, generator=gen).to(torch.bfloat16)
    return qkv.split([q_width, kv_width, kv_width], dim=-1)[0]


def run_layers(backend: Any, batch: Any, layers: List[Any], method: str) -> List[QueryCall]:
    """Run ``backend.<method>`` for every layer on a fused-qkv query, the flashinfer entry
    points recorded with the query each decode call received."""
    rec, layer_ids, calls = kernel_recorders([], [-1]), [-1], []
    record = rec.decode.trtllm_batch_decode_with_kv_cache
    current = {}

    def decode(*args, **kwargs):
        calls.append(QueryCall(str(batch.forward_mode.name), layer_ids[-1], kwargs.get("q_len_per_req", 1),
                               kwargs["query"], current["rows"]))
        return record(*args, **kwargs)

    rec.decode.trtllm_batch_decode_with_kv_cache = decode
    rows = batch.input_ids.shape[0]
    with swapped(optional_module(MODULE), "flashinfer", rec), cpu_kernels():
        backend.init_forward_metadata(batch)
        for layer in layers:
            layer_ids.append(layer.layer_id)
            q = fused_query(rows, layer, seed=layer.layer_id)
            current["rows"] = q.reshape(rows, layer.tp_q_head_num, layer.head_dim).clone()
            getattr(backend, method)(q, None, None, layer, batch, save_kv_cache=False)
    return calls


def bench(xqa: bool = True) -> Any:
    """``kernels.extend_bench`` of ``PREFIXES`` on a backend whose own ``__init__`` ran as on XQA
    hardware (``xqa=False``: as on Blackwell)."""
    with as_xqa_hardware(xqa):
        return extend_bench(prefix_lens=PREFIXES)


def decode_calls(xqa: bool = True) -> List[QueryCall]:
    """A DECODE step of the ``BATCH`` requests on a sliding-window and a full layer."""
    b = bench(xqa)
    return run_layers(b.backend, b.batch("DECODE", [1] * BATCH), b.layers, "forward_decode")


def verify_calls(xqa: bool = True) -> List[QueryCall]:
    """TARGET_VERIFY (3 draft tokens per request) on a sliding-window and a full layer: the
    multi-token calls that trtllm_xqa_spec_decode takes over."""
    b = bench(xqa)
    return run_layers(b.backend, b.batch("TARGET_VERIFY", [3] * BATCH), b.layers, "forward_extend")


def xqa_calls(xqa: bool = True) -> List[QueryCall]:
    """The single-token XQA calls the fix covers: plain decode (and EAGLE draft steps)."""
    return decode_calls(xqa)


def scenario() -> Outcome:
    """A real trtllm_mha backend set up as on XQA hardware, 3 requests decoding together, the query a split view of a fused qkv: does every single-token XQA call read each request's own query?

    DECODE on a sliding-window and a full layer. ``seen``: per call, mode, layer, whether the
    query was dense, and the query rows XQA would read from elsewhere."""
    calls = xqa_calls()
    seen = [(c.mode, c.layer_id, c.dense, c.misread_rows()) for c in calls]
    return Outcome(any(c.misread() for c in calls), seen)


def reproduce() -> bool:
    return scenario().bug
