"""fa3_local_attn_pages: the block tables FA3 builds for Llama 4's chunked layers at page size
16, on a real ``FlashAttentionBackend`` (Llama 4 model config, chunk 32) over a real
``SWAKVPool`` (layers 0-2 chunked in the SWA pool, layer 3 global) whose full and SWA pages
differ, with pages taken from the real allocator's two sub-allocators. Each check reads the
chunked layer's K through the block table from the SWA pool's real buffer, where every token
was written through ``SWAKVPool.set_kv_buffer`` with its own marker.

Eager: prefill (EXTEND) through ``init_forward_metadata``. CUDA graphs: plain decode through
``init_cuda_graph_state``, the capture and the replay methods; the replay's Triton kernel
``normal_decode_set_metadata`` cannot run on a CPU and is replaced by its pure-torch
equivalent (``decode_metadata`` below); the FA3 scheduler-metadata call is a CUDA op and is
skipped. Without the fix (0.5.10-0.5.21) the tests fail: the chunked layers read other
tokens' KV."""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from types import SimpleNamespace

import pytest
import torch

import sglang.srt.model_executor.model_runner  # noqa: F401  (0.5.10: the start-up hook)

from sglang_swa_plugin.check import testbed as tb
from sglang_swa_plugin.core import temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import fa3_local_attn_pages as lap
from sglang_swa_plugin.probe import swapped

from helpers import fixed_alone, methods_alone, sglang_release

FIX = lap.FIX
MOD = importlib.import_module(lap.MODULE)
BACKEND = MOD.FlashAttentionBackend
PS, CHUNK = 16, 32
SWA_LAYER = 0
LENS = (70, 45)  # tokens per request (prefill; decode: including the decode token)
METHODS = [t.rsplit(".", 1)[1] for t in lap.FIX.targets]


def _fixed_upstream(half: str) -> bool:
    release = sglang_release()
    return release >= ((0, 5, 20) if half == "eager" else (0, 5, 22))


def sglang_alone():
    return methods_alone(FIX, {BACKEND: METHODS})


def fixed():
    return fixed_alone(FIX, {BACKEND: METHODS})


def llama4_config_dir():
    text = dict(model_type="llama4_text", vocab_size=128, hidden_size=32, intermediate_size=64,
                intermediate_size_mlp=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=500000.0,
                attention_chunk_size=CHUNK, interleave_moe_layer_step=0, moe_layers=[], num_local_experts=1,
                use_qk_norm=False, attn_temperature_tuning=False, torch_dtype="bfloat16")
    cfg = dict(architectures=["Llama4ForConditionalGeneration"], model_type="llama4", text_config=text,
               vision_config=dict(model_type="llama4_vision_model", hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32, vision_output_dim=16,
                                  projector_input_dim=16, projector_output_dim=16),
               torch_dtype="bfloat16")
    path = tempfile.mkdtemp(prefix="llama4-cfg-")
    for name, body in (("config.json", cfg), ("generation_config.json", {})):
        with open(os.path.join(path, name), "w") as f:
            json.dump(body, f)
    return path


def make_bench():
    """Real pool, allocator, req_to_token rows and an FA3 backend for a Llama 4 runner."""
    from sglang.srt.configs.model_config import ModelConfig

    pool = tb.make_swa_pool(size=1024, size_swa=512, page_size=PS, swa_layers=(0, 1, 2), full_layers=(3,))
    alloc = tb.make_swa_allocator(pool)
    alloc.full_attn_allocator.alloc(5 * PS)  # five full-only pages: the page ids diverge
    rtp = tb.make_req_to_token_pool(size=4, max_context_len=256)
    reqs = []
    for n in LENS:
        pages = -(-n // PS)
        full, swa = alloc.full_attn_allocator.alloc(pages * PS), alloc.swa_attn_allocator.alloc(pages * PS)
        alloc.full_to_swa_index_mapping[full] = swa  # what the allocator records for a page
        reqs.append(full[:n].to(torch.int64))
    # The pool reads the allocator's mapping (0.5.10 through a weak proxy): the writes show there.
    assert torch.equal(pool.translate_loc_from_full_to_swa(torch.cat(reqs)).long(),
                       alloc.full_to_swa_index_mapping[torch.cat(reqs)].long())
    rows, _ = tb.fill_requests(rtp, reqs)
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtp, page_size=PS,
                                  attention_backend="fa3")
    with tb._env_default("HF_HUB_OFFLINE", "1"):
        runner.model_config = ModelConfig(llama4_config_dir(), trust_remote_code=False)
    runner.attention_chunk_size = runner.sliding_window_size = CHUNK  # as ModelRunner sets them for Llama 4
    backend = tb.build_fa3_backend(runner)
    assert backend.has_local_attention and backend.use_sliding_window_kv_pool
    backend._compute_scheduler_metadata = lambda *a, **k: None  # a CUDA op (FA3 scheduler metadata)
    markers = tb.write_markers(pool, reqs, SWA_LAYER)
    return SimpleNamespace(pool=pool, runner=runner, backend=backend, reqs=reqs, rows=rows, markers=markers)



def read_through(bench, pages, n):
    """The first ``n`` tokens' K markers the chunked layer reads through a block-table row,
    as FA3 does: the SWA layer's buffer viewed as pages of 16."""
    k = bench.pool.get_key_buffer(SWA_LAYER)
    paged = k.view(-1, PS, *k.shape[1:])
    assert int(pages[: -(-n // PS)].max()) < paged.shape[0], f"page ids {pages.tolist()} leave the SWA pool"
    return torch.cat([paged[int(p)] for p in pages[: -(-n // PS)]])[:n, 0, 0].float()


def chunk_start(length):
    return (length - 1) // CHUNK * CHUNK


def decode_metadata(cache_seqlens_int32, cu_seqlens_k, page_table, req_to_token, req_pool_indices,
                    strided_indices, max_seq_pages, seq_lens, seq_len_delta, page_size,
                    swa_page_table=None, token_to_kv_pool=None):
    """Pure-torch equivalent of ``normal_decode_set_metadata`` (the fused Triton kernel):
    lengths, their prefix sum, the page table (first slot of each page // page size) and,
    with a SWA pool, the same pages in the SWA pool."""
    lens = (seq_lens + seq_len_delta).to(torch.int32)
    cache_seqlens_int32.copy_(lens)
    cu_seqlens_k[1:].copy_(torch.cumsum(lens, 0, dtype=torch.int32))
    slots = req_to_token[req_pool_indices[:, None], strided_indices[:max_seq_pages][None, :]]
    page_table[:, :max_seq_pages].copy_(slots // page_size)
    if swa_page_table is not None and token_to_kv_pool is not None:
        swa = token_to_kv_pool.translate_loc_from_full_to_swa(slots.to(torch.int64))
        swa_page_table[:, :max_seq_pages].copy_(swa // page_size)


def eager_reads(bench):
    """Per virtual request of a prefill of both requests: (markers read, markers wanted)."""
    batch = tb.make_forward_batch(bench.runner, "extend", seq_lens=list(LENS), extend_seq_lens=list(LENS),
                                  out_cache_loc=torch.cat(bench.reqs))
    bench.backend.init_forward_metadata(batch)
    lam = bench.backend.forward_metadata.local_attn_metadata
    out, v = [], 0
    for r, n in enumerate(LENS):
        for start in range(0, n, CHUNK):
            k_len = int(lam.local_seqused_k[v])
            assert k_len == min(CHUNK, n - start), (r, start, k_len)
            out.append((read_through(bench, lam.local_block_table[v], k_len),
                        bench.markers[r][start:start + k_len]))
            v += 1
    assert v == lam.local_block_table.shape[0]
    return out


def graph_reads(bench):
    """Plain decode through the CUDA-graph metadata methods (capture at batch size 2, then a
    replay of both requests, each at its last token): per request (markers read, wanted)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    be, bs = bench.backend, len(LENS)
    be.init_cuda_graph_state(4, 4)
    be.init_forward_metadata_capture_cuda_graph(bs, bs, torch.zeros(bs, dtype=torch.int64),
                                                torch.ones(bs, dtype=torch.int64), None, ForwardMode.DECODE, None)
    lens = torch.tensor(LENS, dtype=torch.int64)
    with swapped(MOD, "normal_decode_set_metadata", decode_metadata):
        be.init_forward_metadata_replay_cuda_graph(bs, bench.rows, lens, int(lens.sum()), None, ForwardMode.DECODE,
                                                   None, lens.clone())
    lam = be.decode_cuda_graph_metadata[bs].local_attn_metadata
    table = be.decode_cuda_graph_local_attn_metadata["local_block_table"]  # what the graph's view reads
    out = []
    for r, n in enumerate(LENS):
        start = chunk_start(n)
        k_len = int(lam.local_seqused_k[r])
        assert k_len == n - start, (r, k_len)
        out.append((read_through(bench, table[r], k_len), bench.markers[r][start:n]))
    return out, lam


# ------------------------------------------------------------------ detection


def test_detection_per_half_matches_the_release():
    with sglang_alone():
        det = FIX.detect()
        halves = lap.probe(BACKEND)
    assert halves == {"eager": _fixed_upstream("eager"), "graph": _fixed_upstream("graph")}, halves
    assert (det.verdict is Verdict.NEEDED) == (not all(halves.values())), det


def test_check_scenario_reproduces_and_the_fix_corrects_it():
    with sglang_alone():
        bug = FIX.reproduce()
        assert bug == (not _fixed_upstream("graph"))
        if bug:
            with temporarily_installed(FIX):
                assert not FIX.reproduce()


# ------------------------------------------------------------------ the real metadata paths


def test_eager_prefill_chunks_read_their_own_tokens_from_the_swa_pool():
    bench = make_bench()
    with fixed():
        reads = eager_reads(bench)
    for v, (got, want) in enumerate(reads):
        assert torch.equal(got, want), f"virtual request {v}: read {got.tolist()}, want {want.tolist()}"


OLD_GRAPH_API = pytest.mark.skipif(not hasattr(BACKEND, "init_forward_metadata_capture_cuda_graph"),
                                   reason="graph metadata through init_forward_metadata_out_graph (0.5.14+): "
                                          "the CUDA-graph half is covered by the detection probe there")


@OLD_GRAPH_API
def test_graph_decode_chunks_read_their_own_tokens_from_the_swa_pool():
    bench = make_bench()
    with fixed():
        reads, lam = graph_reads(bench)
    for r, (got, want) in enumerate(reads):
        assert torch.equal(got, want), f"request {r}: read {got.tolist()}, want {want.tolist()}"
    # The captured view spans a chunk's pages, as upstream captures it.
    assert lam.local_block_table.shape[1] == CHUNK // PS


@pytest.mark.parametrize("half", ["eager", "graph"])
def test_without_the_fix_the_chunked_layers_read_other_tokens(half):
    """What the fix is for: sglang alone, where it needs the fix."""
    if _fixed_upstream(half):
        pytest.skip(f"this sglang builds the {half} block table right")
    if half == "graph" and not hasattr(BACKEND, "init_forward_metadata_capture_cuda_graph"):
        pytest.skip("CUDA-graph metadata API of 0.5.13+ (the detection probe covers this half there)")
    bench = make_bench()
    with sglang_alone():
        try:
            reads = eager_reads(bench) if half == "eager" else graph_reads(bench)[0]
        except AssertionError as e:  # a page id past the SWA pool: FA3 would read out of bounds
            assert "leave the SWA pool" in str(e), e
            return
    assert any(not torch.equal(got, want) for got, want in reads)


def test_page_size_one_is_left_to_sglang():
    """The hooks hand page size 1 to sglang's own methods unchanged."""
    calls = []
    self = SimpleNamespace(page_size=1, has_local_attention=True)
    for hook, args in ((lap._eager_with_pages, (None, None, "cpu")), (lap._replay_with_page_ids, (None, 1))):
        hook(lambda *a, **k: calls.append(a), self, *args)
    assert len(calls) == 2
