"""CPU scenario of ``triton_one_pool_window``: a real ``ModelConfig`` of a tiny MiMo-V2 (a config.json of
transformers' llama type, which needs no remote code, naming the architecture ``MiMoV2FlashForCausalLM``
with MiMo-V2's window fields: sliding layers of window 7) read with ``disable_hybrid_swa_memory=True``
(one KV pool: a real ``MHATokenToKVPool`` and ``TokenToKVPoolAllocator``), the model runner's window
as sglang resolves it (``resolve_sliding_window_size`` where the release has it, else the same rule
of ``ModelRunner.load_model``: the model has no ``get_attention_sliding_window_size``), and a real
``TritonAttnBackend`` built on that runner. Then a DECODE batch through a sliding layer (a real
``RadixAttention`` of the model's window) with the Triton decode kernel recorded. Right: the backend
has the model's window, its window buffers (eager and CUDA-graph), and the sliding layer's kernel
gets the last keys of each request (window, or window + 1 with ``triton_swa_window``) as the pool's
own ids; the runner keeps the window sglang gave it.
``python -m sglang_swa_plugin.check.triton_one_pool_window`` prints one JSON line."""

from __future__ import annotations

import json
import os
import tempfile
from types import SimpleNamespace

from . import Outcome, print_outcome
from .triton_bench import MODULE, cpu_triton, layer_call, make_backend

WINDOW = 7
LAYERS = 4
SEQ_LENS = (21, 5, 13)  # longer than, shorter than, longer than the window
MIMO_V2 = dict(
    architectures=["MiMoV2FlashForCausalLM"], model_type="llama", hidden_size=32, intermediate_size=64,
    num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=128,
    max_position_embeddings=4096, rms_norm_eps=1e-5, torch_dtype="bfloat16",
    sliding_window_size=WINDOW, hybrid_layer_pattern=[1, 0] * (LAYERS // 2),  # 1: sliding layer
)
_DIRS: dict = {}


def model_config(one_pool: bool = True, arch: str = "MiMoV2FlashForCausalLM"):
    """A real ``ModelConfig`` of the tiny MiMo-V2 (or the same config under another architecture),
    one KV pool (``disable_hybrid_swa_memory``) or hybrid."""
    from sglang.srt.configs.model_config import ModelConfig

    from .testbed import _env_default

    path = _DIRS.get(arch)
    if path is None or not os.path.isdir(path):
        path = _DIRS[arch] = tempfile.mkdtemp(prefix=f"sglang-swa-testbed-{arch}-")
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(dict(MIMO_V2, architectures=[arch]), f)
        with open(os.path.join(path, "generation_config.json"), "w") as f:
            json.dump({}, f)
    with _env_default("HF_HUB_OFFLINE", "1"):
        return ModelConfig(path, trust_remote_code=False, disable_hybrid_swa_memory=one_pool)


def runner_window(model, cfg):
    """The model runner's ``sliding_window_size`` as sglang resolves it: its own
    ``resolve_sliding_window_size`` (0.5.16+), else the rule ``ModelRunner.load_model`` runs inline
    (the model's method; else the config's window if ``is_hybrid_swa``; else the chunk size)."""
    from sglang_swa_plugin.hooks.triton_one_pool_window import RESOLVER_MODULE
    from sglang_swa_plugin.probe import optional_module

    resolve = getattr(optional_module(RESOLVER_MODULE), "resolve_sliding_window_size", None)
    if resolve is not None:
        return resolve(model, cfg)
    if hasattr(model, "get_attention_sliding_window_size"):
        return model.get_attention_sliding_window_size()
    if cfg.is_hybrid_swa and cfg.sliding_window_size is not None:
        return cfg.sliding_window_size
    return cfg.attention_chunk_size


def build_runner(one_pool: bool = True, model=None, arch: str = "MiMoV2FlashForCausalLM", spec_algorithm=None):
    """A model runner of the tiny MiMo-V2 over one real KV pool (full ids only), its window as
    sglang resolves it for ``model`` (default: a model without a window method); with
    ``spec_algorithm`` ("EAGLE"), server args of 3 draft steps, topk 1."""
    import torch

    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

    from . import testbed as tb

    cfg = model_config(one_pool, arch)
    pool = tb.make_full_pool(size=128, layer_num=LAYERS, head_num=cfg.get_num_kv_heads(1), head_dim=cfg.head_dim)
    alloc = TokenToKVPoolAllocator(size=pool.size, dtype=pool.dtype, device="cpu", kvcache=pool, need_sort=False)
    rtt = tb.make_req_to_token_pool(size=8, max_context_len=64)
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtt, sliding_window_size=None,
                                  attention_backend="triton", spec_algorithm=spec_algorithm, topk=1,
                                  num_steps=3 if spec_algorithm else None)
    runner.model = model if model is not None else torch.nn.Module()
    runner.model_config, runner.dtype = cfg, cfg.dtype
    runner.sliding_window_size = runner_window(runner.model, cfg)
    # What TritonAttnBackend reads off a ModelRunner beyond the testbed's fields: no hybrid
    # linear-attention config, and (0.5.23) the tokens per request of a decode step.
    for name in ("hybrid_gdn_config", "kimi_linear_config", "linear_attn_model_spec"):
        setattr(runner, name, getattr(runner, name, None))
    runner.decode_num_tokens_per_req = lambda **_: 4 if spec_algorithm else 1
    return runner


def _decode(runner, backend) -> dict:
    """A DECODE batch through a sliding layer of the model's window: the keys its Triton decode
    kernel got per request, against the tail of the request's row of ``req_to_token``."""
    import torch
    from sglang.srt.layers.radix_attention import RadixAttention

    from . import testbed as tb

    cfg = runner.model_config
    tokens = [tb.alloc_tokens(runner.token_to_kv_pool_allocator, n) for n in SEQ_LENS]
    rows, _ = tb.fill_requests(runner.req_to_token_pool, tokens)
    layer = RadixAttention(num_heads=cfg.num_attention_heads, head_dim=cfg.head_dim, scaling=cfg.head_dim ** -0.5,
                           num_kv_heads=cfg.get_num_kv_heads(1), layer_id=0, sliding_window_size=WINDOW)
    env = SimpleNamespace(swa_layer=layer, torch=torch)
    calls: list = []
    with cpu_triton(backend, calls):
        fb = tb.make_forward_batch(runner, "decode", req_pool_indices=rows, seq_lens=list(SEQ_LENS),
                                   out_cache_loc=torch.stack([t[-1] for t in tokens]), attn_backend=backend)
        try:
            backend.init_forward_metadata(fb)
        except Exception as e:  # noqa: BLE001
            return {"right": False, "why": f"{type(e).__name__}: {e}"[:200]}
        if getattr(backend.forward_metadata, "window_kv_indices", None) is None:
            return {"right": False, "why": "forward_metadata.window_kv_indptr/indices are None: the sliding "
                                           "layer's kernel gets None (a Triton CompilationError on a GPU)"}
        call = layer_call(env, backend, fb, calls)
    if "error" in call or call["kv_indices"] is None:
        return {"right": False, "why": call.get("error") or "window_kv_indices=None"}
    indptr, indices, per_req, keys = call["kv_indptr"], call["kv_indices"], [], []
    for b, (row, n) in enumerate(zip(rows.tolist(), SEQ_LENS)):
        got = indices[int(indptr[b]):int(indptr[b + 1])].tolist()
        want = runner.req_to_token_pool.req_to_token[row, n - len(got):n].tolist()
        keys.append(len(got))
        per_req.append(got == want and len(got) in (min(n, WINDOW), min(n, WINDOW + 1)))
    return {"right": all(per_req), "keys": keys}


def scenario() -> Outcome:
    """A real TritonAttnBackend on a one-KV-pool MiMo-V2 model runner (disable_hybrid_swa_memory) must
    get the model's window and window buffers, and a sliding layer's decode the last window keys.
    The ModelConfig is sglang's, the runner's window as sglang resolves it. ``seen``: the windows,
    the buffers, the decode's verdict and the runner's window after the build."""
    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.probe import optional_module

    if optional_module(MODULE) is None:
        raise ScenarioUnavailable(f"no Triton attention backend: {MODULE}")
    runner = build_runner()
    before = runner.sliding_window_size
    backend = make_backend(runner)
    seen = {"model_window": runner.model_config.sliding_window_size, "runner_window": before,
            "backend_window": backend.sliding_window_size,
            "window_buffers": getattr(backend, "window_kv_indptr", None) is not None}
    seen["runner_window_after"] = runner.sliding_window_size
    backend.init_cuda_graph_state(4, 4)
    seen["graph_window_buffer"] = getattr(backend, "cuda_graph_window_kv_indices", None) is not None
    seen["decode"] = _decode(runner, backend)
    bug = not (seen["backend_window"] == WINDOW and seen["window_buffers"] and seen["graph_window_buffer"]
               and seen["decode"]["right"]) or seen["runner_window_after"] != before
    return Outcome(bug, seen)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
