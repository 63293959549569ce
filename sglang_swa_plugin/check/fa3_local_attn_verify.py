"""CPU scenario of ``fa3_local_attn_verify``: what a chunked layer's attention kernel is
handed in FA3's CUDA-graph TARGET_VERIFY (capture, then replay), on a real
``FlashAttentionBackend`` over a real ``SWAKVPool``, judged by the KV it reads."""

from __future__ import annotations

from types import SimpleNamespace

from ..fa3_local import FA3_MODULE as MODULE
from ..fix import ScenarioUnavailable
from ..probe import optional_module
from . import Outcome
from . import testbed as tb
from .kernels import cpu_kernels

CHUNK, DRAFT = 32, 4  # the testbed's Llama 4 chunk; EAGLE topk 1, 3 steps: 4 draft tokens
SWA_LAYER = 0  # a chunked layer (SWA pool)
# Tokens per request before the draft tokens: 70 + 4 stays in chunk 2, 30 + 4 crosses into
# chunk 1, 63 + 4 crosses into chunk 2, 6 + 4 stays in chunk 0.
LENS = (70, 30, 63, 6)
# What a CPU cannot run: sglang's Triton metadata kernels (no driver), CUDA-only imports.
CUDA_ONLY = (ImportError, NotImplementedError, RuntimeError)


def make_bench(page_size: int, topk: int = 1):
    """Real pool (layers 0-2 chunked in the SWA pool, layer 3 full), allocator with diverging
    full and SWA ids, ``req_to_token`` rows for ``LENS`` plus their draft tokens, and an FA3
    backend of a Llama 4 runner with EAGLE ``topk`` (3 steps, 4 draft tokens); every token's K
    in the chunked layer is its own marker (1, 2, ...), written through
    ``SWAKVPool.set_kv_buffer``."""
    import torch

    ps = page_size
    pool = tb.make_swa_pool(size=2048, size_swa=1024, page_size=ps, swa_layers=(0, 1, 2), full_layers=(3,))
    alloc = tb.make_swa_allocator(pool)
    alloc.full_attn_allocator.alloc(5 * max(ps, 16))  # full-only slots first: the ids diverge
    rtp = tb.make_req_to_token_pool(size=8, max_context_len=256)
    reqs = []
    for n in LENS:
        total = n + DRAFT
        pages = -(-total // ps)
        full, swa = alloc.full_attn_allocator.alloc(pages * ps), alloc.swa_attn_allocator.alloc(pages * ps)
        alloc.full_to_swa_index_mapping[full] = swa
        reqs.append(full[:total].to(torch.int64))
    rows, _ = tb.fill_requests(rtp, reqs)
    runner = tb.make_model_runner(kv_pool=pool, allocator=alloc, req_to_token_pool=rtp, page_size=ps,
                                  attention_backend="fa3", model="llama4", spec_algorithm="EAGLE3", topk=topk,
                                  num_steps=DRAFT - 1, num_draft_tokens=DRAFT)
    runner.attention_chunk_size = runner.sliding_window_size = CHUNK  # as ModelRunner sets them for Llama 4
    backend = tb.build_fa3_backend(runner)
    if not (backend.has_local_attention and backend.use_sliding_window_kv_pool):
        raise ScenarioUnavailable("this sglang's FA3 backend sees no chunked layers on the hybrid pool")
    backend._compute_scheduler_metadata = lambda *a, **k: None  # a CUDA op (FA3 scheduler metadata)
    return SimpleNamespace(pool=pool, runner=runner, backend=backend, reqs=reqs, rows=rows, ps=ps,
                           markers=tb.write_markers(pool, reqs, SWA_LAYER))



def kernel_view(backend, metadata):
    """What FA3's ``forward_extend`` hands the kernel for a chunked layer (``use_irope``,
    ``sliding_window_size`` -1): the local-attention metadata where there is one, else the
    plain page table (a chunked layer is no sliding-window layer, so no SWA table)."""
    lam = metadata.local_attn_metadata
    if backend.has_local_attention and lam is not None:
        return SimpleNamespace(table=lam.local_block_table, cu_q=lam.local_query_start_loc,
                               seqused_k=lam.local_seqused_k, max_q=lam.local_max_query_len)
    return SimpleNamespace(table=metadata.page_table, cu_q=metadata.cu_seqlens_q,
                           seqused_k=metadata.cache_seqlens_int32, max_q=metadata.max_seq_len_q)


def reads(bench, view, lens=LENS):
    """Per query token (request, draft index): (markers read, markers wanted). Causal FA3 on
    a varlen batch: query i of a batch with q_len queries and k_len keys sees keys
    [0, k_len - q_len + i] of its block-table row. Wanted: the token's own chunk up to it."""
    import torch

    ps = bench.ps
    k = bench.pool.get_key_buffer(SWA_LAYER)
    paged = k.view(-1, ps, *k.shape[1:])
    cu = view.cu_q.tolist()
    out = []
    for r, n in enumerate(lens):
        for j in range(DRAFT):
            qi, pos = r * DRAFT + j, n + j
            b = max(i for i in range(len(cu) - 1) if cu[i] <= qi < cu[i + 1])
            q_len, k_len = cu[b + 1] - cu[b], int(view.seqused_k[b])
            assert q_len <= view.max_q, (q_len, view.max_q)
            upto = k_len - q_len + (qi - cu[b])  # last key index the query sees
            row = view.table[b]
            n_pages = upto // ps + 1
            if int(row[:n_pages].max()) >= paged.shape[0]:
                got = None  # page ids past the SWA buffer: FA3 would read out of bounds
            else:
                got = torch.cat([paged[int(p)] for p in row[:n_pages]])[: upto + 1, 0, 0].float()
            start = pos // CHUNK * CHUNK
            out.append((got, bench.markers[r][start:pos + 1]))
    return out


def graph_api(backend) -> str:
    return "out_graph" if hasattr(backend, "init_forward_metadata_out_graph") else "capture_replay"


def graph_verify(bench, lens=LENS):
    """sglang's CUDA-graph runner steps for TARGET_VERIFY at the batch size of ``lens``:
    state, capture (lengths all 1, as the runner captures), then a replay of the requests.
    Returns the kernel view taken at capture (the tensors the graph holds) and the metadata."""
    import torch

    be, bs = bench.backend, len(lens)
    be.init_cuda_graph_state(8, 8 * DRAFT)
    cap = tb.make_forward_batch(bench.runner, "target_verify", seq_lens=[1] * bs,
                                out_cache_loc=torch.zeros(bs * DRAFT, dtype=torch.int64))
    capture(be, bs, cap)
    metadata = be.forward_metadata
    view = kernel_view(be, metadata)  # what the captured kernels read
    out_loc = torch.cat([r[n:n + DRAFT] for r, n in zip(bench.reqs, lens)])
    step = tb.make_forward_batch(bench.runner, "target_verify", seq_lens=list(lens),
                                 req_pool_indices=bench.rows[:bs], out_cache_loc=out_loc)
    replay(be, bs, step)
    assert be.forward_metadata is metadata, "the replay uses the captured metadata"
    return view, metadata


def capture(be, bs: int, cap) -> None:
    """The runner's capture-time metadata call for the capture batch ``cap``."""
    if graph_api(be) == "out_graph":
        be.init_forward_metadata_out_graph(cap, in_capture=True)
    else:
        be.init_forward_metadata_capture_cuda_graph(bs, cap.positions.numel(), cap.req_pool_indices, cap.seq_lens,
                                                    None, cap.forward_mode, cap.spec_info)


def replay(be, bs: int, step) -> None:
    """The runner's replay-time metadata call for ``step`` (padded to ``bs`` by the caller);
    the page-table Triton kernel of 0.5.18+ runs as its torch stand-in."""
    with cpu_kernels(MODULE):
        if graph_api(be) == "out_graph":
            be.init_forward_metadata_out_graph(step, in_capture=False)
        else:
            be.init_forward_metadata_replay_cuda_graph(bs, step.req_pool_indices, step.seq_lens,
                                                       int(step.seq_lens.sum()), None, step.forward_mode,
                                                       step.spec_info, step.seq_lens_cpu)


def eager_verify(bench, lens=LENS):
    """Eager TARGET_VERIFY of the requests through ``init_forward_metadata``."""
    import torch

    out_loc = torch.cat([r[n:n + DRAFT] for r, n in zip(bench.reqs, lens)])
    step = tb.make_forward_batch(bench.runner, "target_verify", seq_lens=list(lens),
                                 req_pool_indices=bench.rows[: len(lens)], out_cache_loc=out_loc)
    bench.backend.init_forward_metadata(step)
    return kernel_view(bench.backend, bench.backend.forward_metadata)


def wrong(pairs) -> int:
    """Queries whose keys read (a tensor or a list of markers; None: out of bounds) are not
    the ones wanted."""
    import torch

    def same(got, want):
        return torch.equal(got, want) if isinstance(got, torch.Tensor) else got == want

    return sum(1 for got, want in pairs if got is None or not same(got, want))


def scenario() -> Outcome:
    """FA3's CUDA-graph target verify (EAGLE topk 1, 4 draft tokens, chunk 32, page size 1)
    over a real SWAKVPool: does each chunked-layer query read exactly its own chunk's KV from
    the SWA pool. ``seen``: query tokens that read other KV, of all."""
    def run():
        bench = make_bench(1)
        return reads(bench, graph_verify(bench)[0])

    return graph_outcome(run)


def graph_outcome(run) -> Outcome:
    """The Outcome of ``run()`` (per query token: (read, wanted)) on FA3's CPU path: bug where
    any query reads other KV; unavailable without FA3 or where its metadata needs a GPU."""
    if optional_module(MODULE) is None:
        raise ScenarioUnavailable(f"no FA3 backend: {MODULE}")
    try:
        pairs = run()
    except CUDA_ONLY as e:
        raise ScenarioUnavailable(f"the verify graph metadata of {MODULE} runs a CUDA or Triton kernel here: {e}") from e
    bad = wrong(pairs)
    return Outcome(bad > 0, {"wrong_queries": bad, "of": len(pairs)})


def reproduce() -> bool:
    return scenario().bug
