"""What sglang's CUDA-graph runner does to an attention backend around a captured
TARGET_VERIFY (or DRAFT_EXTEND_V2) pass, through the backend's own metadata methods (both APIs sglang has had):
``prepare_capture`` before the warm-up runs and the capture, ``prepare_replay`` before each
replay. Shared by the CPU test (emulated graph) and the GPU test (real CUDA graph)."""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch


def graph_api(backend) -> str:
    """Up to 0.5.13: ``init_forward_metadata_capture_cuda_graph`` / ``..._replay_cuda_graph``;
    from 0.5.14: ``init_forward_metadata_out_graph(batch, in_capture)``."""
    return "out_graph" if hasattr(backend, "init_forward_metadata_out_graph") else "capture_replay"


def in_graph(backend, batch) -> None:
    """0.5.15+: the metadata update sglang's graph runner runs inside the captured pass, before
    the layers (``init_forward_metadata_in_graph``: seq_lens and page tables from the static
    buffers); nothing on releases without it."""
    update = getattr(backend, "init_forward_metadata_in_graph", None)
    if update is not None:
        update(batch)


def prepare_capture(backend, batch, q_len: int) -> None:
    bs = batch.batch_size
    backend.init_cuda_graph_state(bs, bs * q_len)
    if graph_api(backend) == "out_graph":
        backend.init_forward_metadata_out_graph(batch, in_capture=True)
    else:
        backend.init_forward_metadata_capture_cuda_graph(
            bs, bs * q_len, batch.req_pool_indices, batch.seq_lens, None, batch.forward_mode, batch.spec_info)


def prepare_replay(backend, batch, q_len: int, rows: Sequence[int], seq_lens: Sequence[int]) -> None:
    """Copy the step's requests into the static buffers, padded as sglang pads a smaller batch
    (request row 0, the backend's seq_len fill value), and refresh the backend's metadata."""
    bs, raw = batch.batch_size, len(rows)
    fill = backend.get_cuda_graph_seq_len_fill_value()
    batch.req_pool_indices.copy_(torch.tensor(list(rows) + [0] * (bs - raw)))
    batch.seq_lens.copy_(torch.tensor(list(seq_lens) + [fill] * (bs - raw)))
    if graph_api(backend) == "out_graph":
        backend.init_forward_metadata_out_graph(batch, in_capture=False)
    else:
        backend.init_forward_metadata_replay_cuda_graph(
            bs, batch.req_pool_indices, batch.seq_lens, int(batch.seq_lens.sum()), None,
            batch.forward_mode, batch.spec_info, batch.seq_lens.cpu())


@contextlib.contextmanager
def cpu_trtllm_kernels(graph, calls):
    """The trtllm_mha module's flashinfer replaced by CPU recorders and its Triton/sgl_kernel helpers
    (page tables, the in-graph metadata update of 0.5.15+) by their CPU stand-ins
    (``sglang_swa_plugin.check.kernels``); all of them steps of ``graph`` (a ``cpu_graph.CpuGraph``),
    replayed with it. CPU tests only."""
    from sglang_swa_plugin.check import kernels
    from sglang_swa_plugin.probe import optional_module, swapped
    from sglang_swa_plugin.trtllm_mha import MODULE

    rec = kernels.kernel_recorders(calls, [-1])
    rec.decode.trtllm_batch_decode_with_kv_cache = graph.kernel(rec.decode.trtllm_batch_decode_with_kv_cache)
    rec.prefill.trtllm_batch_context_with_kv_cache = graph.kernel(rec.prefill.trtllm_batch_context_with_kv_cache)
    with swapped(optional_module(MODULE), "flashinfer", rec), kernels.cpu_kernels(launch=graph.kernel):
        yield
