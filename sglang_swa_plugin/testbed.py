"""Builders of REAL sglang objects on a CPU-only machine, portable across sglang releases.

Used by the ``check`` command (CPU reproductions on the user's deployment machine) and by
the tests.  Nothing here subclasses or fakes sglang's classes: pools, allocators, configs,
``ServerArgs``, ``SpeculativeAlgorithm``, ``ForwardBatch`` and the attention backends are
sglang's own.  A model runner is a plain ``types.SimpleNamespace`` carrying real objects,
as sglang's own unit tests do.  sglang is imported lazily, inside the functions.

Version differences are detected by structure (``hasattr``, ``inspect.signature``,
``ImportError``), one place each.  A feature a release does not have raises
:class:`Unavailable`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import tempfile
from types import SimpleNamespace

__all__ = [
    "Unavailable",
    "swa_classes",
    "translate",
    "make_swa_pool",
    "make_swa_allocator",
    "make_full_pool",
    "diverge",
    "alloc_tokens",
    "make_req_to_token_pool",
    "fill_requests",
    "make_model_config",
    "make_server_args",
    "make_spec_algorithm",
    "make_model_runner",
    "cpu_backend_patches",
    "build_trtllm_backend",
    "build_trtllm_multistep_draft_backend",
    "build_backend_via_registry",
    "build_draft_backends_via_factory",
    "build_fa3_backend",
    "make_forward_batch",
]


class Unavailable(RuntimeError):
    """The installed sglang does not have this feature (or it cannot be built on CPU)."""


def _torch():
    import torch

    return torch


def _sig_params(fn):
    return inspect.signature(fn).parameters


def _call_with_supported(fn, /, **kwargs):
    """Call ``fn`` with those of ``kwargs`` its signature accepts (no ``**kwargs`` pass-through)."""
    params = _sig_params(fn)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


# --------------------------------------------------------------------------- pools


def swa_classes():
    """The SWA memory classes of the installed sglang, plus the portable :func:`translate`."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    try:  # moved in 0.5.13
        from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    except ImportError:
        from sglang.srt.mem_cache.swa_memory_pool import SWATokenToKVPoolAllocator
    return SimpleNamespace(
        SWAKVPool=SWAKVPool,
        SWATokenToKVPoolAllocator=SWATokenToKVPoolAllocator,
        MHATokenToKVPool=MHATokenToKVPool,
        ReqToTokenPool=ReqToTokenPool,
        translate=translate,
    )


def translate(pool, idx):
    """Full-pool indices -> SWA-pool indices, as int64 (sglang returns int32 up to 0.5.12).

    ``pool`` is a ``SWAKVPool`` or a ``SWATokenToKVPoolAllocator``; ``-1`` stays ``-1``.
    """
    torch = _torch()
    idx = torch.as_tensor(idx, dtype=torch.int64)
    return pool.translate_loc_from_full_to_swa(idx).to(torch.int64)


def make_swa_pool(
    size=64,
    size_swa=32,
    page_size=1,
    swa_layers=(0, 2),
    full_layers=(1, 3),
    head_num=2,
    head_dim=8,
    dtype=None,
):
    """A real ``SWAKVPool`` on CPU (two MHA sub-pools: full layers and SWA layers)."""
    torch = _torch()
    cls = swa_classes().SWAKVPool
    kwargs = dict(
        size=size,
        size_swa=size_swa,
        page_size=page_size,
        dtype=dtype or torch.bfloat16,
        head_num=head_num,
        head_dim=head_dim,
        swa_attention_layer_ids=list(swa_layers),
        full_attention_layer_ids=list(full_layers),
        device="cpu",
    )
    if "enable_kvcache_transpose" in _sig_params(cls.__init__):  # required up to 0.5.14
        kwargs["enable_kvcache_transpose"] = False
    return cls(**kwargs)


def make_swa_allocator(pool):
    """A real ``SWATokenToKVPoolAllocator`` over ``pool`` (registers the full->SWA mapping)."""
    cls = swa_classes().SWATokenToKVPoolAllocator
    return cls(
        size=pool.size,
        size_swa=pool.size_swa,
        page_size=pool.page_size,
        dtype=pool.dtype,
        device="cpu",
        kvcache=pool,
        need_sort=False,
    )


def make_full_pool(size=64, layer_num=4, head_num=2, head_dim=8, page_size=1, dtype=None):
    """A real full-only ``MHATokenToKVPool`` on CPU (what an EAGLE draft worker owns)."""
    torch = _torch()
    return _call_with_supported(
        swa_classes().MHATokenToKVPool,
        size=size,
        page_size=page_size,
        dtype=dtype or torch.bfloat16,
        head_num=head_num,
        head_dim=head_dim,
        layer_num=layer_num,
        device="cpu",
        enable_memory_saver=False,
        enable_alt_stream=False,
    )


def diverge(allocator, n_full_only=5):
    """Take ``n_full_only`` slots from the full sub-allocator only, so the full and SWA
    index spaces of later allocations differ.  Returns the (held) full-only indices."""
    if n_full_only <= 0:
        return None
    return allocator.full_attn_allocator.alloc(n_full_only)


def alloc_tokens(allocator, n):
    """Allocate ``n`` tokens through the real allocator: returns full-pool indices (int64).
    With page_size=1 this is pure torch in every release; their SWA slots are
    ``translate(allocator, result)``."""
    if allocator.page_size != 1:
        raise Unavailable("alloc_tokens supports page_size=1 only")
    out = allocator.alloc(n)
    if out is None:
        raise RuntimeError(f"allocator out of space for {n} tokens")
    return out.to(_torch().int64)


def make_req_to_token_pool(size=8, max_context_len=128):
    """A real ``ReqToTokenPool`` on CPU."""
    return swa_classes().ReqToTokenPool(
        size=size, max_context_len=max_context_len, device="cpu", enable_memory_saver=False
    )


def fill_requests(req_to_token_pool, token_lists, first_row=0):
    """Write each list of full-pool indices into a row of ``req_to_token``.

    Returns ``(req_pool_indices int64, seq_lens int64)`` for those rows."""
    torch = _torch()
    rows, lens = [], []
    for i, tokens in enumerate(token_lists):
        row = first_row + i
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        req_to_token_pool.req_to_token[row, : len(tokens)] = tokens.to(
            req_to_token_pool.req_to_token.dtype
        )
        rows.append(row)
        lens.append(len(tokens))
    return torch.tensor(rows, dtype=torch.int64), torch.tensor(lens, dtype=torch.int64)
