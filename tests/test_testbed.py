"""The testbed builds REAL sglang objects on CPU, on the installed sglang release.

Run with ``tests/cpu_import_shims`` on PYTHONPATH (a CPU machine cannot import the
CUDA-only ``sgl_kernel`` and PyPI's torchvision otherwise).
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch

from helpers import child_json, fix_in_effect, run_child
from sglang_swa_plugin.check import testbed as tb
from sglang_swa_plugin.hooks.trtllm_swa_pool import FIX as SWA_POOL_FIX

TRTLLM = "sglang.srt.layers.attention.trtllm_mha_backend"
FA = "sglang.srt.layers.attention.flashattention_backend"


def _cls(module, name):
    return getattr(importlib.import_module(module), name)


@pytest.fixture
def swa():
    """A hybrid-SWA target: pool, allocator with diverged index spaces, req_to_token."""
    pool = tb.make_swa_pool()
    allocator = tb.make_swa_allocator(pool)
    held = tb.diverge(allocator, 5)
    return pool, allocator, tb.make_req_to_token_pool(), held


@pytest.fixture
def target(swa):
    pool, allocator, req_to_token, _ = swa
    return tb.make_model_runner(
        kv_pool=pool, allocator=allocator, req_to_token_pool=req_to_token, spec_algorithm="EAGLE"
    )


@pytest.fixture
def draft(swa, target):
    """An EAGLE draft worker: its own full-only pool, the target's allocator."""
    _, allocator, req_to_token, _ = swa
    return tb.make_model_runner(
        kv_pool=tb.make_full_pool(layer_num=1),
        allocator=allocator,
        req_to_token_pool=req_to_token,
        spec_algorithm="EAGLE",
        is_draft_worker=True,
        model="llama",
        server_args=target.server_args,
    )


# ----------------------------------------------------------------------------- pools


def test_pools_are_the_real_classes(swa):
    pool, allocator, req_to_token, _ = swa
    c = tb.swa_classes()
    assert type(pool) is c.SWAKVPool and type(allocator) is c.SWATokenToKVPoolAllocator
    assert type(req_to_token) is c.ReqToTokenPool
    assert allocator.get_kvcache() is pool
    full = tb.make_full_pool()
    assert type(full) is c.MHATokenToKVPool and not isinstance(full, c.SWAKVPool)


def test_index_spaces_really_diverge(swa):
    pool, allocator, _, held = swa
    assert len(held) == 5
    full = tb.alloc_tokens(allocator, 7)
    swa_idx = tb.translate(pool, full)
    assert full.dtype == swa_idx.dtype == torch.int64
    # The whole point of the testbed: a full-pool index is NOT its SWA-pool index.
    assert (swa_idx != full).all(), (full, swa_idx)
    assert (swa_idx > 0).all() and (swa_idx < pool.size_swa).all()
    assert torch.equal(tb.translate(allocator, full), swa_idx)
    assert tb.translate(pool, [-1]).tolist() == [-1]


def test_fill_requests_writes_rows(swa):
    _, allocator, req_to_token, _ = swa
    a, b = tb.alloc_tokens(allocator, 4), tb.alloc_tokens(allocator, 2)
    rows, lens = tb.fill_requests(req_to_token, [a, b])
    assert rows.tolist() == [0, 1] and lens.tolist() == [4, 2]
    assert req_to_token.req_to_token[1, :2].tolist() == b.tolist()


# ----------------------------------------------------------------------------- runner


def test_model_runner_carries_real_objects(target):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    assert type(target.model_config) is ModelConfig and type(target.server_args) is ServerArgs
    assert target.spec_algorithm is SpeculativeAlgorithm.EAGLE
    assert target.model_config.is_hybrid_swa
    assert target.sliding_window_size == tb._TINY_CONFIGS["gpt_oss"]["sliding_window"] - 1
    assert tb.server_arg(target.server_args, "speculative_num_draft_tokens") == 4


def test_spec_algorithms():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    assert tb.make_spec_algorithm("NEXTN") is SpeculativeAlgorithm.EAGLE
    assert tb.make_spec_algorithm(None) is SpeculativeAlgorithm.NONE
    if "FROZEN_KV_MTP" in SpeculativeAlgorithm.__members__:
        assert tb.make_spec_algorithm("FROZEN_KV_MTP") is SpeculativeAlgorithm.FROZEN_KV_MTP
    else:
        with pytest.raises(tb.Unavailable):
            tb.make_spec_algorithm("FROZEN_KV_MTP")


# ----------------------------------------------------------------------------- backends


def test_trtllm_target_backend_uses_the_swa_pool(swa, target):
    import sglang.srt.layers.attention.flashinfer_backend as fi

    before = {n: getattr(fi, n, None) for n in ("get_attention_tp_size", *tb._FLASHINFER_WRAPPERS)}
    backend = tb.build_trtllm_backend(target)
    assert isinstance(backend, _cls(TRTLLM, "TRTLLMHAAttnBackend"))
    assert backend._swa_kv_pool is swa[0]
    assert {n: getattr(fi, n, None) for n in before} == before  # the CPU patches were undone


def test_trtllm_backend_uses_the_patched_class(target, monkeypatch):
    real = _cls(TRTLLM, "TRTLLMHAAttnBackend")
    patched = type("PatchedTRTLLMHAAttnBackend", (real,), {})
    monkeypatch.setattr(importlib.import_module(TRTLLM), "TRTLLMHAAttnBackend", patched)
    assert type(tb.build_trtllm_backend(target)) is patched


def test_trtllm_draft_backends(swa, draft):
    backend_cls = _cls(TRTLLM, "TRTLLMHAAttnBackend")
    with fix_in_effect(SWA_POOL_FIX):  # the final rule (stock 0.5.10-0.5.12 give it swa[0]: bug 001)
        backend = tb.build_trtllm_backend(draft, skip_prefill=False)
    assert isinstance(backend, backend_cls)
    assert backend._swa_kv_pool is None  # an EAGLE draft's own full-only pool
    multi = tb.build_trtllm_multistep_draft_backend(draft, topk=1, num_steps=3)
    assert isinstance(multi, _cls(TRTLLM, "TRTLLMHAAttnMultiStepDraftBackend"))
    assert len(multi.attn_backends) == 2
    assert all(isinstance(b, backend_cls) for b in multi.attn_backends)


def test_draft_backends_via_factory(draft):
    got = tb.build_draft_backends_via_factory(draft)
    assert isinstance(got.decode, _cls(TRTLLM, "TRTLLMHAAttnMultiStepDraftBackend"))
    assert isinstance(got.draft_extend, _cls(TRTLLM, "TRTLLMHAAttnBackend"))


def test_registry(target):
    assert isinstance(
        tb.build_backend_via_registry(target, "trtllm_mha"), _cls(TRTLLM, "TRTLLMHAAttnBackend")
    )
    if not torch.cuda.is_available():  # fa3's factory asks for the CUDA device capability
        with pytest.raises(tb.Unavailable):
            tb.build_backend_via_registry(target, "fa3")
    with pytest.raises(tb.Unavailable):
        tb.build_backend_via_registry(target, "no_such_backend")


def test_fa3_backend(target):
    backend = tb.build_fa3_backend(target)
    assert isinstance(backend, _cls(FA, "FlashAttentionBackend"))
    assert backend.use_sliding_window_kv_pool


# ----------------------------------------------------------------------------- forward batch


@pytest.mark.parametrize("mode", ["decode", "target_verify", "draft_extend_v2", "draft_decode"])
def test_forward_batch(swa, target, mode):
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    pool, allocator, req_to_token, _ = swa
    tokens = [tb.alloc_tokens(allocator, 6), tb.alloc_tokens(allocator, 4)]
    rows, lens = tb.fill_requests(req_to_token, tokens)
    per_req = {"decode": 1, "draft_decode": 1}.get(mode, 4)
    loc = tb.alloc_tokens(allocator, 2 * per_req)
    fb = tb.make_forward_batch(target, mode, req_pool_indices=rows, seq_lens=lens, out_cache_loc=loc)
    assert type(fb) is ForwardBatch
    assert fb.batch_size == 2 and fb.seq_lens.tolist() == [6, 4] and fb.seq_lens_sum == 10
    assert torch.equal(fb.out_cache_loc.to(torch.int64), loc)  # full-pool space
    assert (tb.translate(pool, fb.out_cache_loc) != fb.out_cache_loc).all()
    assert fb.input_ids.numel() == 2 * per_req
    assert (fb.spec_info is not None) == (mode == "draft_decode")


HEADS = """
from sglang_swa_plugin.check import kernels, testbed, triton_bench

out = {}
for size in (2, 1):
    with testbed.attention_tp(size):
        bench, tri = kernels.extend_bench(), triton_bench.build()
    out[size] = {"layers": [(la.tp_q_head_num, la.tp_k_head_num) for la in bench.layers],
                 "pools": [bench.pool.head_num, tri.pool.head_num],
                 "triton": [tri.backend.num_head, tri.backend.num_kv_head],
                 "triton_layer": [tri.swa_layer.tp_q_head_num, tri.swa_layer.tp_k_head_num]}
out["after"] = testbed.attn_tp()
print("RESULT=" + json.dumps(out))
"""


def test_attention_tp_builds_one_ranks_heads():
    """Inside ``attention_tp(2)`` the testbed builds rank 0 of two attention TP ranks (the tiny
    models' 4 query and 2 KV heads split as sglang splits them): the pools, the layers and the
    Triton backend hold 2 query and 1 KV head; then, at 1, all of them again. In a fresh process,
    as ``check --attention-tp`` runs: where a scenario built sglang's process groups (of one rank)
    before, the runtime context of 0.5.21+ refuses another attention TP size."""
    out = child_json(run_child(HEADS, SGLANG_SWA_PLUGIN="0"))
    for size, (q, kv) in (("2", (2, 1)), ("1", (4, 2))):
        got = out[size]
        assert got["layers"] == [[q, kv]] * 2 and got["pools"] == [kv, kv], (size, got)
        assert got["triton"] == [q, kv] and got["triton_layer"] == [q, kv], (size, got)
    assert out["after"] == 1


def test_trtllm_forward_metadata_translates_swa_layers(swa, target):
    pool, allocator, req_to_token, _ = swa
    backend = tb.build_trtllm_backend(target)
    tokens = tb.alloc_tokens(allocator, 6)
    rows, lens = tb.fill_requests(req_to_token, [tokens])
    fb = tb.make_forward_batch(
        target, "decode", req_pool_indices=rows, seq_lens=lens, out_cache_loc=tokens[-1:]
    )
    try:
        tb.run_kernels(backend.init_forward_metadata, fb)
    except tb.Unavailable as e:  # 0.5.14+: Triton page-table kernels (see the child test)
        pytest.skip(str(e))
    swa_table = backend._get_layer_page_table(tb.swa_layer(pool, target), fb)[0, :6]
    full_table = backend._get_layer_page_table(tb.full_layer(pool, target), fb)[0, :6]
    assert full_table.tolist() == tokens.tolist()
    assert swa_table.tolist() == tb.translate(pool, tokens).tolist()


def test_trtllm_forward_metadata_with_triton_interpreter():
    """Same check in a fresh interpreter with TRITON_INTERPRET=1: sglang's Triton kernels
    (trtllm_mha page tables from 0.5.14) then run on CPU."""
    proc = run_child(
        """
        from sglang_swa_plugin.check import testbed as tb
        pool = tb.make_swa_pool(); alloc = tb.make_swa_allocator(pool); tb.diverge(alloc, 5)
        rtt = tb.make_req_to_token_pool()
        runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtt,
                                      spec_algorithm="EAGLE")
        backend = tb.build_trtllm_backend(runner)
        tokens = tb.alloc_tokens(alloc, 6)
        rows, lens = tb.fill_requests(rtt, [tokens])
        out = {}
        for mode in ("decode", "target_verify", "draft_extend_v2"):
            seq = lens - 1 if mode == "decode" else lens
            fb = tb.make_forward_batch(runner, mode, req_pool_indices=rows, seq_lens=seq)
            tb.run_kernels(backend.init_forward_metadata, fb)
            table = backend._get_layer_page_table(tb.swa_layer(pool, runner), fb)[0, :5]
            out[mode] = table.tolist() == tb.translate(pool, tokens[:5]).tolist()
        print("RESULT=" + json.dumps(out))
        """,
        TRITON_INTERPRET="1",
        HF_HUB_OFFLINE="1",
    )
    assert child_json(proc) == {"decode": True, "target_verify": True, "draft_extend_v2": True}


# ----------------------------------------------------------------------------- FROZEN_KV MTP


def test_frozen_kv_draft_runner(swa):
    """A FROZEN_KV MTP draft (own full-only pool, the target's allocator), built alone."""
    pool, allocator, req_to_token, _ = swa
    kwargs = dict(
        kv_pool=tb.make_full_pool(),
        allocator=allocator,
        req_to_token_pool=req_to_token,
        is_draft_worker=True,
        spec_algorithm="FROZEN_KV_MTP",
    )
    if not importlib.util.find_spec("sglang.srt.speculative.frozen_kv_mtp_utils"):
        with pytest.raises(tb.Unavailable):
            tb.make_model_runner(**kwargs)
        return
    runner = tb.make_model_runner(**kwargs)
    assert runner.spec_algorithm.is_frozen_kv_mtp()
    with fix_in_effect(SWA_POOL_FIX):  # the final rule (#25103's form gives it None)
        backend = tb.build_trtllm_backend(runner)
    assert isinstance(backend, _cls(TRTLLM, "TRTLLMHAAttnBackend"))
    assert backend._swa_kv_pool is pool  # the target's SWA pool, read through the shared allocator


# ----------------------------------------------------------------------------- import hygiene


def test_testbed_and_shims_import_nothing_heavy():
    """testbed imports no sglang/torch at import time; the shims' sitecustomize imports no
    torch unless torchvision is imported."""
    proc = run_child(
        """
        before = set(sys.modules)
        import sglang_swa_plugin.check.testbed
        new = set(sys.modules) - before
        print("RESULT=" + json.dumps(sorted(m for m in new if m.split(".")[0] in ("sglang", "torch"))))
        """
    )
    assert child_json(proc) == []
