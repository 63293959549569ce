"""Builders of REAL sglang objects on a CPU-only machine, portable across sglang releases.

Used by the ``check`` command (CPU reproductions on the user's deployment machine) and by
the tests.  Nothing here subclasses or fakes sglang's classes: pools, allocators, configs,
``ServerArgs``, ``SpeculativeAlgorithm``, ``ForwardBatch`` and the attention backends are
sglang's own.  A model runner is a plain ``types.SimpleNamespace`` carrying real objects,
as sglang's own unit tests do.  sglang is imported lazily, inside the functions.

Version differences are detected by structure (``hasattr``, ``inspect.signature``,
``ImportError``), one place each.  A feature a release does not have raises
:class:`Unavailable`.

On CPU: sglang itself must import (a CPU-only machine needs import shims for the CUDA-only
``sgl_kernel``, see tests/cpu_import_shims); the backends are *constructed* on CPU with
temporary patches (:func:`cpu_backend_patches`); no attention kernel runs.  sglang's Triton
kernels (trtllm_mha page tables from 0.5.14, paged allocation) run on CPU only when
``TRITON_INTERPRET=1`` is set before sglang is imported (:func:`run_kernels`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import socket
import tempfile
from types import SimpleNamespace

from ..fix import ScenarioUnavailable
from ..probe import swa_allocator_class, swapped

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
    "server_arg",
    "make_forward_batch",
    "attention_layer",
    "swa_layer",
    "full_layer",
    "run_kernels",
]


class Unavailable(ScenarioUnavailable):
    """The installed sglang does not have this feature (or it cannot be built on CPU)."""


def _torch():
    import torch

    return torch


def _sig_params(fn):
    return inspect.signature(fn).parameters


@contextlib.contextmanager
def _env_default(name, value):
    old = os.environ.get(name)
    if old is None:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)


def _call_with_supported(fn, /, **kwargs):
    """Call ``fn`` with those of ``kwargs`` its signature accepts (no ``**kwargs`` pass-through)."""
    params = _sig_params(fn)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


# --------------------------------------------------------------------------- pools


def swa_classes():
    """The SWA memory classes of the installed sglang, plus the portable :func:`translate`."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    return SimpleNamespace(
        SWAKVPool=SWAKVPool,
        SWATokenToKVPoolAllocator=swa_allocator_class(),
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


def ancestors(parents, i) -> set:
    """Draft ``i`` of an EAGLE tree and its ancestors (``parents``: each draft's, -1 for the root)."""
    out = set()
    while i >= 0:
        out.add(i)
        i = parents[i]
    return out


def tree_inputs(parents):
    """``lens -> (mask, positions)`` of a target verify of the EAGLE tree ``parents`` after requests
    of ``lens`` cached keys: sglang's tree mask (rows of ``L + n`` cells) and the drafts' positions."""
    torch = _torch()
    n = len(parents)
    tree = torch.tensor([[k in ancestors(parents, i) for k in range(n)] for i in range(n)])
    depth = [len(ancestors(parents, i)) - 1 for i in range(n)]

    def inputs(lens):
        mask = torch.cat([torch.cat([torch.ones(n, m, dtype=torch.bool), tree], 1).flatten() for m in lens])
        return mask, torch.tensor([m + d for m in lens for d in depth])
    return inputs


_ATTN_TP = [1]  # the attention tensor-parallel size the testbed builds for, innermost last (``attention_tp``)


@contextlib.contextmanager
def attention_tp(size: int):
    """Inside: the testbed builds rank 0 of ``size`` attention tensor-parallel ranks, heads split
    as sglang splits them: pools, layers and backends hold ``num_attention_heads // size`` query
    and ``get_num_kv_heads(size)`` KV heads; backends, runners and the runtime context read the
    attention TP size ``size``."""
    _ATTN_TP.append(size)
    try:
        yield
    finally:
        _ATTN_TP.pop()


def attn_tp() -> int:
    """The attention tensor-parallel size the testbed builds for now (1 outside ``attention_tp``)."""
    return _ATTN_TP[-1]


def layer_heads(cfg) -> tuple:
    """(query heads, KV heads) of one attention TP rank of model config ``cfg``."""
    return cfg.num_attention_heads // attn_tp(), cfg.get_num_kv_heads(attn_tp())


def _pool_heads(head_num) -> int:
    """A pool's KV heads: ``head_num``, else one attention TP rank's share of the tiny models' two."""
    return head_num or max(1, 2 // attn_tp())


def make_swa_pool(
    size=64,
    size_swa=32,
    page_size=1,
    swa_layers=(0, 2),
    full_layers=(1, 3),
    head_num=None,
    head_dim=8,
    dtype=None,
):
    """A real ``SWAKVPool`` on CPU (two MHA sub-pools: full layers and SWA layers); ``head_num``
    (KV heads) defaults to one attention TP rank's share of the tiny models' two."""
    torch = _torch()
    cls = swa_classes().SWAKVPool
    kwargs = dict(
        size=size,
        size_swa=size_swa,
        page_size=page_size,
        dtype=dtype or torch.bfloat16,
        head_num=_pool_heads(head_num),
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


def make_full_pool(size=64, layer_num=4, head_num=None, head_dim=8, page_size=1, dtype=None):
    """A real full-only ``MHATokenToKVPool`` on CPU (what an EAGLE draft worker owns)."""
    torch = _torch()
    return _call_with_supported(
        swa_classes().MHATokenToKVPool,
        size=size,
        page_size=page_size,
        dtype=dtype or torch.bfloat16,
        head_num=_pool_heads(head_num),
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
        raise ValueError("alloc_tokens supports page_size=1 only")
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


# --------------------------------------------------------------------------- model runner

_TINY_CONFIGS = {
    # GPT-OSS style hybrid SWA: even layers sliding, odd layers full (like the real model).
    "gpt_oss": dict(
        architectures=["GptOssForCausalLM"],
        model_type="gpt_oss",
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=128,
        max_position_embeddings=4096,
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * 2,
        num_local_experts=4,
        num_experts_per_tok=2,
        rms_norm_eps=1e-5,
        rope_theta=150000.0,
        torch_dtype="bfloat16",
    ),
    # Plain full-attention Llama (e.g. an EAGLE draft model).
    "llama": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=128,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        torch_dtype="bfloat16",
    ),
    # Text-only Llama 4: layers 0-2 chunked ("local", attention_chunk_size 32), layer 3 global.
    "llama4": dict(
        architectures=["Llama4ForConditionalGeneration"],
        model_type="llama4",
        text_config=dict(
            model_type="llama4_text", vocab_size=128, hidden_size=32, intermediate_size=64,
            intermediate_size_mlp=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=500000.0,
            attention_chunk_size=32, interleave_moe_layer_step=0, moe_layers=[], num_local_experts=1,
            use_qk_norm=False, attn_temperature_tuning=False, torch_dtype="bfloat16"),
        vision_config=dict(
            model_type="llama4_vision_model", hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32, vision_output_dim=16, projector_input_dim=16, projector_output_dim=16),
        torch_dtype="bfloat16",
    ),
}
_CONFIG_DIRS = {}


def _tiny_model_dir(model):
    """A temp dir holding the config of ``model`` (no weights, no tokenizer)."""
    if model not in _TINY_CONFIGS:
        raise ValueError(f"model must be one of {sorted(_TINY_CONFIGS)}, got {model!r}")
    path = _CONFIG_DIRS.get(model)
    if path is None or not os.path.isdir(path):
        path = tempfile.mkdtemp(prefix=f"sglang-swa-testbed-{model}-")
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(_TINY_CONFIGS[model], f)
        with open(os.path.join(path, "generation_config.json"), "w") as f:
            json.dump({}, f)  # spares ModelConfig's "Failed to load generation config"
        _CONFIG_DIRS[model] = path
    return path


def make_model_config(model="gpt_oss", is_draft_model=False):
    """A real ``ModelConfig`` read from a tiny local config.json (HF_HUB_OFFLINE=1)."""
    from sglang.srt.configs.model_config import ModelConfig

    with _env_default("HF_HUB_OFFLINE", "1"):
        return ModelConfig(
            _tiny_model_dir(model), trust_remote_code=False, is_draft_model=is_draft_model
        )


def make_spec_algorithm(name):
    """A real ``SpeculativeAlgorithm`` member for ``name`` ("EAGLE", "EAGLE3", "NEXTN",
    "FROZEN_KV_MTP", ... or None).  NEXTN is EAGLE, as ServerArgs rewrites it."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    if (
        name is not None
        and name.upper() == "NEXTN"
        and "NEXTN" not in SpeculativeAlgorithm.__members__
    ):
        name = "EAGLE"
    try:
        return SpeculativeAlgorithm.from_string(name)
    except ValueError:
        raise Unavailable(f"this sglang has no speculative algorithm {name!r}") from None


def make_server_args(model_path, publish=True, **fields):
    """A real ``ServerArgs`` with ``fields`` set (unknown field names are ignored).

    Dataclass releases: built with ``object.__new__`` and the field defaults, because their
    ``__post_init__`` fetches the model config and probes the GPU (where ``resolve_once``
    does that at publish instead, the record is marked resolved).  When ``publish``, it
    becomes the process-global server args (``set_global_server_args_for_scheduler``), as
    in a scheduler process.  Releases with a runtime context (msgspec ``ServerArgs``):
    published through ``get_context().override_server_args(...).install()``, like sglang's
    own attention unit tests; backends read ``get_spec()`` etc. from it at call time."""
    import sglang.srt.server_args as sa_mod

    cls = sa_mod.ServerArgs
    fields = dict(fields, model_path=model_path)
    if dataclasses.is_dataclass(cls):
        args = object.__new__(cls)
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = None
            object.__setattr__(args, f.name, fields.get(f.name, value))
        if hasattr(cls, "resolve_once"):
            # Where resolution moved from ``__post_init__`` to ``resolve_once()`` (run by
            # ``publish``), the record is marked as past it, as ``__post_init__`` is
            # skipped above: the fields set here are the values in effect (resolution
            # probes the GPU and rewrites them, e.g. trtllm_mha's page size, or refuses
            # trtllm_mha without an SM90+ GPU). Without a raw snapshot sglang's
            # ``resolution_result`` reads the fields themselves.
            object.__setattr__(args, "_resolution_finished", True)
        if publish:
            sa_mod.set_global_server_args_for_scheduler(args)
        return args
    from sglang.srt.runtime_context import get_context

    known = set(getattr(cls, "__struct_fields__", ()))
    fields = {k: v for k, v in fields.items() if k in known and k != "model_path"}
    if not publish:
        return cls(model_path=model_path, **fields)
    override = get_context().override_server_args(**fields)
    args = override.install()
    args._testbed_override = override  # keeps the means to restore the previous context
    return args


def server_arg(server_args, name, default=None):
    """The value in effect for ``server_args.name``: the resolved value where sglang
    resolves ServerArgs into a runtime context (the raw field may be unset there)."""
    try:
        from sglang.srt.arg_groups.overrides import resolution_result
    except ImportError:
        return getattr(server_args, name, default)
    value = resolution_result(server_args, name)
    return value if value is not None else getattr(server_args, name, default)


_FROM_MODEL = object()


def make_model_runner(
    *,
    kv_pool,
    allocator,
    req_to_token_pool,
    is_draft_worker=False,
    spec_algorithm=None,
    topk=1,
    num_steps=None,
    num_draft_tokens=None,
    sliding_window_size=_FROM_MODEL,
    page_size=1,
    model="gpt_oss",
    attention_backend="trtllm_mha",
    server_args=None,
    max_running_requests=None,
):
    """A model runner: a ``SimpleNamespace`` carrying real sglang objects and the plain
    fields the attention backends and draft factories read.

    ``kv_pool`` is the runner's own pool (``SWAKVPool`` for a hybrid target, a full-only
    ``MHATokenToKVPool`` for an EAGLE draft); ``allocator`` is shared by target and draft.
    ``sliding_window_size`` defaults to the model's (``sliding_window - 1`` for gpt_oss,
    None for llama).  Without ``server_args`` a fresh ``ServerArgs`` is built and published
    as the process's; pass the target's to a draft runner to share it, as sglang does."""
    torch = _torch()
    algo = make_spec_algorithm(spec_algorithm)
    spec_on = not algo.is_none()
    if spec_on:
        num_steps = num_steps if num_steps is not None else 3
        if num_draft_tokens is None:
            num_draft_tokens = num_steps + 1 if topk == 1 else num_steps * topk + 1
    model_config = make_model_config(model, is_draft_model=is_draft_worker)
    if sliding_window_size is _FROM_MODEL:
        window = getattr(model_config.hf_config, "sliding_window", None)
        sliding_window_size = window - 1 if window else None
    if server_args is None:
        server_args = make_server_args(
            model_config.model_path,
            device="cpu",
            tp_size=1,
            page_size=page_size,
            kv_cache_dtype="auto",
            attention_backend=attention_backend,
            speculative_algorithm=algo.name if spec_on else None,
            speculative_eagle_topk=topk if spec_on else None,
            speculative_num_steps=num_steps if spec_on else None,
            speculative_num_draft_tokens=num_draft_tokens if spec_on else None,
            disable_cuda_graph=True,
            max_running_requests=max_running_requests,
        )
    runner = SimpleNamespace(
        model_config=model_config,
        server_args=server_args,
        spec_algorithm=algo,
        is_draft_worker=is_draft_worker,
        device="cpu",
        gpu_id=0,
        dtype=model_config.dtype,
        kv_cache_dtype=kv_pool.dtype,
        kv_cache_dtype_str="auto",
        page_size=page_size,
        sliding_window_size=sliding_window_size,
        attention_chunk_size=None,
        tp_size=attn_tp(),
        tp_rank=0,
        dp_size=1,
        pp_size=1,
        attn_cp_size=1,
        use_mla_backend=False,
        token_to_kv_pool=kv_pool,
        token_to_kv_pool_allocator=allocator,
        req_to_token_pool=req_to_token_pool,
        max_running_requests=max_running_requests or req_to_token_pool.size,
        model=torch.nn.Module(),
        init_new_workspace=False,
        prefill_attention_backend_str=attention_backend,
        decode_attention_backend_str=attention_backend,
        draft_attention_backend=attention_backend if is_draft_worker else None,
    )
    runner.kv_index_translator = _make_kv_index_translator(runner)
    ps = _parallel_state()
    if ps is not None:  # 0.5.16+: backends read the ranks and sizes from ``model_runner.ps``
        runner.ps = ps
    return runner


def _parallel_state():
    """sglang's ``ParallelState`` of a single rank, from its own ``ParallelState.trivial()``,
    where the release has that (else None: main of June 2026 has the class without it, and
    its model runners carry no ``ps``)."""
    try:
        from sglang.srt.distributed.parallel_state_wrapper import ParallelState
    except ImportError:
        return None
    trivial = getattr(ParallelState, "trivial", None)
    if trivial is None:
        return None
    # rank 0 of attn_tp() ranks: the sizes the backends read
    return trivial(**({"tp_size": attn_tp(), "attn_tp_size": attn_tp()} if attn_tp() > 1 else {}))


def _make_kv_index_translator(runner):
    """The runner's ``KVIndexTranslator`` where sglang has one (else None), built like
    ``ModelRunner.init_kv_index_translator``."""
    try:
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    except ImportError:
        return None
    values = dict(
        req_to_token=runner.req_to_token_pool.req_to_token,
        token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
        token_to_kv_pool=runner.token_to_kv_pool,
        page_size=runner.page_size or 1,
        device=runner.device,
        is_draft_worker=runner.is_draft_worker,  # 0.5.22+
    )
    takes = inspect.signature(KVIndexTranslator).parameters
    return KVIndexTranslator(**{name: value for name, value in values.items() if name in takes})


# --------------------------------------------------------------------------- backends

_FLASHINFER_WRAPPERS = (
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
)


class _CpuFlashinferWrapper:
    """Stand-in for a flashinfer wrapper class (flashinfer's, not sglang's: its constructor
    pins memory on CUDA).  It only records its arguments: it has no ``plan``/``run``."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def tensor_parallel_of_one() -> None:
    """sglang's parallel groups for one CPU process (gloo) and its server args, once per process
    (a scenario that builds sglang's layers or reads their parallel sizes). Such a scenario runs
    at attention TP 1 only: inside ``attention_tp(N > 1)`` this raises ScenarioUnavailable."""
    if attn_tp() > 1:
        raise ScenarioUnavailable(f"builds sglang's model layers on process groups of one rank: not at attention TP "
                                  f"{attn_tp()}")
    from sglang.srt.distributed import parallel_state as ps

    if getattr(ps, "_TP", None) is not None:
        _ranks_of_one()
        return
    make_server_args("tensor-parallel-of-one", device="cpu")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ps.init_distributed_environment(backend="gloo", world_size=1, rank=0, local_rank=0,
                                    distributed_init_method=f"tcp://127.0.0.1:{port}")
    if "tensor_model_parallel_size" in inspect.signature(ps.initialize_model_parallel).parameters:
        ps.initialize_model_parallel(tensor_model_parallel_size=1)
    else:  # 0.5.21+: the widths come from the runtime context (one process: all 1)
        ps.initialize_model_parallel()
    _ranks_of_one()


def _ranks_of_one() -> None:
    """Where sglang's runtime context holds the process's ranks and building the groups does
    not write them (a scheduler's ``publish(..., ranks=...)`` does; layers read
    ``get_parallel().tp_rank``), state the placement of the only process: every rank 0.
    Ranks already written, and contexts without unwritten ranks, are left as they are."""
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        return
    parallel = get_parallel()
    unwritten = {}
    for name in dir(type(parallel)):
        if not name.endswith("_rank") or name == "dp_rank":  # dp_rank: a replica's number, None without DP
            continue
        try:
            getattr(parallel, name)
        except RuntimeError:  # "parallel name ... has not been written in this process"
            unwritten[name] = 0
        except Exception:  # read from elsewhere (e.g. dp_attention's globals, not built here): not stated
            continue
    if unwritten:
        parallel.override_permanently(**unwritten)


def _multi_ctas_counter_buffer(device, num_q_heads, max_batch_size):
    """CPU stand-in for ``make_persistent_multi_ctas_kv_counter_buffer`` (its size comes
    from flashinfer's SM-count query): a zeroed uint8 buffer, one int32 per (batch, head)."""
    torch = _torch()
    return torch.zeros(4 * num_q_heads * max_batch_size, dtype=torch.uint8, device=device)


def _single_rank() -> dict:
    """The runtime context's ranks of the testbed's process: rank 0 of ``attn_tp()`` attention
    TP ranks, one of everything else."""
    ranks = dict(attn_tp_size=attn_tp(), attn_tp_rank=0, attn_cp_size=1, attn_cp_rank=0, attn_dp_size=1,
                 attn_dp_rank=0)
    return {**ranks, "tp_size": attn_tp(), "tp_rank": 0, "moe_tp_size": attn_tp()} if attn_tp() > 1 else ranks


def _single_rank_parallel():
    """Where sglang reads ranks from ``runtime_context.get_parallel()`` and no process
    group is built (CPU, no torch.distributed), a scoped single-rank override."""
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        return contextlib.nullcontext()
    parallel = get_parallel()
    if attn_tp() == 1:
        try:
            _ = parallel.attn_tp_size
            return contextlib.nullcontext()
        except Exception:  # noqa: BLE001 - "attention tensor model parallel group is not initialized"
            pass
    return parallel.override(**_single_rank())


@contextlib.contextmanager
def cpu_backend_patches():
    """What a flashinfer-derived backend (trtllm_mha) needs to be *constructed* on CPU,
    applied as temporary module-attribute patches, all undone on exit:

    - ``flashinfer_backend.get_attention_tp_size`` -> 1 (where the module binds it), or
      a scoped single-rank ``get_parallel().override(...)`` where ranks come from the
      runtime context and no process group exists;
    - stand-ins for flashinfer's three wrapper classes (sglang binds them only when CUDA
      is available; on a GPU machine the real ones would be built on CPU buffers);
    - ``trtllm_mha_backend.make_persistent_multi_ctas_kv_counter_buffer`` (where bound;
      it asks flashinfer for the SM count);
    - ``SGLANG_FLASHINFER_WORKSPACE_SIZE`` = 1 MiB unless set (the default allocates
      ~900 MiB of workspace on CPU).
    """
    fi = importlib.import_module("sglang.srt.layers.attention.flashinfer_backend")
    trt = importlib.import_module("sglang.srt.layers.attention.trtllm_mha_backend")
    with contextlib.ExitStack() as stack:
        stack.enter_context(_env_default("SGLANG_FLASHINFER_WORKSPACE_SIZE", str(1 << 20)))
        stack.enter_context(_single_rank_parallel())
        if hasattr(fi, "get_attention_tp_size"):
            stack.enter_context(swapped(fi, "get_attention_tp_size", attn_tp))
        for name in _FLASHINFER_WRAPPERS:
            stack.enter_context(swapped(fi, name, _CpuFlashinferWrapper))
        if hasattr(trt, "make_persistent_multi_ctas_kv_counter_buffer"):
            stack.enter_context(
                swapped(
                    trt,
                    "make_persistent_multi_ctas_kv_counter_buffer",
                    _multi_ctas_counter_buffer,
                )
            )
        yield


def _trtllm_module():
    return importlib.import_module("sglang.srt.layers.attention.trtllm_mha_backend")


def build_trtllm_backend(runner, **kwargs):
    """A real ``TRTLLMHAAttnBackend(runner, **kwargs)`` built on CPU.  The class is looked
    up on its module at call time, so a patched class or ``__init__`` is the one used."""
    with cpu_backend_patches():
        return _trtllm_module().TRTLLMHAAttnBackend(runner, **kwargs)


def build_trtllm_multistep_draft_backend(runner, topk=1, num_steps=3):
    """A real ``TRTLLMHAAttnMultiStepDraftBackend`` (one TRTLLMHAAttnBackend per step)."""
    with cpu_backend_patches():
        return _trtllm_module().TRTLLMHAAttnMultiStepDraftBackend(runner, topk, num_steps)


def build_fa3_backend(runner, **kwargs):
    """A real ``FlashAttentionBackend(runner, **kwargs)`` (fa_impl_ver=3) built on CPU.
    Its ``__init__`` imports ``sgl_kernel.flash_attn``: on CPU that needs an import shim."""
    mod = importlib.import_module("sglang.srt.layers.attention.flashattention_backend")
    with _single_rank_parallel():
        return mod.FlashAttentionBackend(runner, **kwargs)


def build_backend_via_registry(runner, name="trtllm_mha"):
    """``ATTENTION_BACKENDS[name](runner)``, sglang's registry path (no wrappers).

    The ``fa3`` factory asserts the CUDA device capability first, so on a machine without
    CUDA it raises :class:`Unavailable` (use :func:`build_fa3_backend` for the class)."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    if name not in ATTENTION_BACKENDS:
        raise Unavailable(f"no attention backend {name!r} registered in this sglang")
    try:
        with cpu_backend_patches():
            return ATTENTION_BACKENDS[name](runner)
    except AssertionError as e:  # fa3: "requires SM>=80" / "Torch not compiled with CUDA"
        if _torch().cuda.is_available():
            raise
        raise Unavailable(f"registry factory {name!r} needs a CUDA device: {e}") from e


def build_draft_backends_via_factory(runner, topk=None, num_steps=None):
    """The draft worker's backends through sglang's real ``DraftBackendFactory``:
    returns ``SimpleNamespace(decode=<multi-step backend or None>, draft_extend=<backend>)``.
    ``topk``/``num_steps`` default to the server args.  The factory's constructor takes
    ``server_args`` first in older releases (0.5.10-0.5.14 at least), not in 0.5.23."""
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    sa = runner.server_args
    topk = topk if topk is not None else server_arg(sa, "speculative_eagle_topk") or 1
    num_steps = num_steps if num_steps is not None else server_arg(sa, "speculative_num_steps")
    if "server_args" in _sig_params(DraftBackendFactory.__init__):
        factory = DraftBackendFactory(sa, runner, topk, num_steps)
    else:
        factory = DraftBackendFactory(runner, topk, num_steps)
    with cpu_backend_patches():
        return SimpleNamespace(
            decode=factory.create_decode_backend(),
            draft_extend=factory.create_draft_extend_backend(),
        )


# --------------------------------------------------------------------------- forward batch


def make_forward_batch(
    runner,
    mode="decode",
    *,
    seq_lens,
    req_pool_indices=None,
    out_cache_loc=None,
    extend_seq_lens=None,
    num_tokens_per_req=None,
    spec_info=None,
    attn_backend=None,
):
    """A real ``ForwardBatch`` for ``mode`` ("decode", "target_verify", "draft_extend_v2",
    "extend", ...; a mode the release lacks raises :class:`Unavailable`).  "draft_decode"
    is DECODE with a real default ``EagleDraftInput`` as ``spec_info`` (what a multi-step
    draft backend sees).

    ``seq_lens`` are as sglang passes them for that mode (decode and draft-extend: total
    lengths including the new tokens; target-verify: lengths before the draft tokens).
    ``out_cache_loc`` is in FULL-pool space; by default it is freshly allocated from the
    runner's allocator.  The rows of ``req_to_token`` are the caller's (:func:`fill_requests`);
    ``req_pool_indices`` defaults to rows ``0..bs-1``.  Tokens per request: 1 (decode),
    ``num_tokens_per_req`` or speculative_num_draft_tokens (target_verify, draft_extend_v2),
    ``extend_seq_lens`` (extend modes).  Where sglang routes KV ids through a
    ``KVLocPlan``, the batch gets its own plan, as ``ForwardBatch.init_new`` does."""
    torch = _torch()
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    mode = mode.lower()
    if mode == "draft_decode":  # a multi-step draft step: DECODE with a draft spec_info
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        mode, spec_info = "decode", spec_info if spec_info is not None else EagleDraftInput()
    fmode = getattr(ForwardMode, mode.upper(), None)
    if fmode is None:
        raise Unavailable(f"this sglang has no ForwardMode.{mode.upper()}")
    seq_lens = torch.as_tensor(seq_lens, dtype=torch.int64)
    bs = len(seq_lens)
    if req_pool_indices is None:
        req_pool_indices = range(bs)
    req_pool_indices = torch.as_tensor(req_pool_indices, dtype=torch.int64)
    if num_tokens_per_req is None and (fmode.is_target_verify() or fmode.is_draft_extend_v2()):
        num_tokens_per_req = server_arg(runner.server_args, "speculative_num_draft_tokens")
    is_extend = fmode.is_draft_extend_v2() or (fmode.is_extend() and not fmode.is_target_verify())
    if is_extend and extend_seq_lens is None:
        extend_seq_lens = [num_tokens_per_req or 1] * bs
    if fmode.is_decode_or_idle():
        per_req = [1] * bs
    elif is_extend:
        per_req = [int(n) for n in extend_seq_lens]
    else:
        per_req = [num_tokens_per_req] * bs
    n_tokens = sum(per_req)
    if out_cache_loc is None:
        out_cache_loc = alloc_tokens(runner.token_to_kv_pool_allocator, n_tokens)
    out_cache_loc = torch.as_tensor(out_cache_loc, dtype=torch.int64)
    first = seq_lens if fmode.is_target_verify() else seq_lens - torch.tensor(per_req)
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(first.tolist(), per_req)])
    fields = dict(
        forward_mode=fmode,
        batch_size=bs,
        input_ids=torch.zeros(n_tokens, dtype=torch.int64),
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.cpu(),
        seq_lens_sum=int(seq_lens.sum()),
        orig_seq_lens=seq_lens.clone(),
        out_cache_loc=out_cache_loc,
        positions=positions,
        req_to_token_pool=runner.req_to_token_pool,
        token_to_kv_pool=runner.token_to_kv_pool,
        attn_backend=attn_backend,
        spec_algorithm=runner.spec_algorithm,
        spec_info=spec_info,
        return_logprob=False,
    )
    if is_extend:
        ext = torch.tensor(per_req, dtype=torch.int64)
        prefix = seq_lens - ext
        fields.update(
            extend_num_tokens=n_tokens,
            extend_seq_lens=ext.to(torch.int32),
            extend_seq_lens_cpu=per_req,
            extend_prefix_lens=prefix.to(torch.int32),
            extend_prefix_lens_cpu=prefix.tolist(),
            extend_start_loc=torch.cumsum(ext, 0) - ext,
            extend_logprob_start_lens_cpu=[0] * bs,
        )
    known = {f.name for f in dataclasses.fields(ForwardBatch)}
    batch = ForwardBatch(**{k: v for k, v in fields.items() if k in known})
    translator = getattr(runner, "kv_index_translator", None)
    if translator is not None and "kv_loc_plan" in known:
        translator.own_plan(batch).bind(batch, translator)
    return batch


# --------------------------------------------------------------------------- layers, kernels


def attention_layer(pool, layer_id, runner=None):
    """A real ``RadixAttention`` for ``layer_id`` of ``pool`` (sliding for an SWA layer of
    an ``SWAKVPool``: the runner's window, else the tiny gpt_oss one)."""
    from sglang.srt.layers.radix_attention import RadixAttention

    mapping = getattr(pool, "layers_mapping", None) or {}
    is_swa = mapping.get(layer_id, (None, False))[1]
    window = getattr(runner, "sliding_window_size", None) if runner is not None else None
    if is_swa and window is None:
        window = _TINY_CONFIGS["gpt_oss"]["sliding_window"] - 1
    cfg = runner.model_config if runner is not None else None
    heads, kv_heads = layer_heads(cfg) if cfg is not None else (2 * pool.head_num, pool.head_num)
    head_dim = cfg.head_dim if cfg is not None else pool.head_dim
    return RadixAttention(
        num_heads=heads,
        head_dim=head_dim,
        scaling=head_dim**-0.5,
        num_kv_heads=kv_heads,
        layer_id=layer_id,
        sliding_window_size=window if is_swa else -1,
    )


def _layer_ids(pool, swa):
    return sorted(i for i, (_, is_swa) in pool.layers_mapping.items() if is_swa == swa)


def swa_layer(pool, runner=None):
    """A real ``RadixAttention`` for the first SWA layer of an ``SWAKVPool``."""
    return attention_layer(pool, _layer_ids(pool, True)[0], runner)


def full_layer(pool, runner=None):
    """A real ``RadixAttention`` for the first full-attention layer of an ``SWAKVPool``."""
    return attention_layer(pool, _layer_ids(pool, False)[0], runner)


def run_kernels(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``; a Triton kernel that cannot run here (no GPU and no
    ``TRITON_INTERPRET=1`` in the environment before sglang was imported) raises
    :class:`Unavailable`.  trtllm_mha's forward metadata is pure torch up to 0.5.13 and
    launches Triton page-table kernels from 0.5.14."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as e:
        if "active drivers" not in str(e):
            raise
        raise Unavailable(
            "needs a Triton kernel: run on a GPU, or set TRITON_INTERPRET=1 before importing sglang"
        ) from e


def write_markers(pool, reqs, layer_id):
    """K (and V) of every token of every request in layer ``layer_id`` = its marker (1, 2, ...),
    written through ``SWAKVPool.set_kv_buffer`` with the write location each release takes.
    Returns the markers per request."""
    torch = _torch()
    layer = SimpleNamespace(layer_id=layer_id)
    shape = pool.get_key_buffer(layer_id).shape[1:]
    markers, nxt = [], 1
    for loc in reqs:
        vals = torch.arange(nxt, nxt + len(loc), dtype=torch.float32)
        nxt += len(loc)
        k = vals.view(-1, *([1] * len(shape))).expand(-1, *shape).to(pool.dtype).contiguous()
        swa_loc = pool.translate_loc_from_full_to_swa(loc).to(torch.int64)
        params = inspect.signature(pool.set_kv_buffer).parameters
        if "loc_info" in params:  # 0.5.14+: the write location carries the SWA location
            from sglang.srt.mem_cache.memory_pool import KVWriteLoc

            pool.set_kv_buffer(layer, KVWriteLoc(loc, swa_loc=swa_loc), k, k.clone())
        elif "swa_loc" in params:  # 0.5.13
            pool.set_kv_buffer(layer, loc, k, k.clone(), swa_loc=swa_loc)
        else:  # up to 0.5.12 the pool translates the full location itself
            pool.set_kv_buffer(layer, loc, k, k.clone())
        markers.append(vals)
    return markers
