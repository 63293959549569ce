"""fa3_local_attn_pages: FA3 chunked (Llama 4 "local") attention gets page ids, in the right pool.

Bug
    With ``--page-size`` > 1 FA3's local-attention block table is wrong: eager, token slots
    handed over as page ids; CUDA-graph decode, page ids pushed through the token-slot
    full->SWA mapping (wrong pages, or past the SWA buffer); both shrink the chunk to the
    longest sequence. Fix: upstream's final form, per half (page ids of the layer's pool,
    chunk kept, capture view one chunk wide). Page size 1 is left to sglang.
Upstream PRs
    #32902 (eager, 0.5.20), #37733 and #38187 (CUDA-graph half, 0.5.22).
Affected versions
    0.5.10-0.5.19: both halves; 0.5.20 and 0.5.21: the CUDA-graph half.
    Status by release: applied 0.5.10-0.5.21; not needed 0.5.22+.
Detection
    Behaviour on CPU: the installed methods (or ``LocalAttentionMetadataBuilder``) build a
    block table on a stand-in (page 16, chunk 32, a real ``SWAKVPool``); per half, wrong
    pages: that half's hooks are in the plan.
Delete when
    The oldest supported sglang is 0.5.22 or later.
"""

from __future__ import annotations

from types import SimpleNamespace

from sglang_swa_plugin.patching import without_wrappers_of
from sglang_swa_plugin.fix import Detection, Fix, around
from sglang_swa_plugin.fa3_local import BUILDER_MODULE, FA3_MODULE as MODULE, local_batches, local_metadata_class
from sglang_swa_plugin.probe import optional_module, swa_pool_class, target_class

NAME = "fa3_local_attn_pages"
CLASS = MODULE + ".FlashAttentionBackend"
EAGER = CLASS + "._maybe_init_local_attn_metadata"
CAPTURE = CLASS + "._maybe_update_local_attn_metadata_for_capture"
REPLAY = CLASS + "._maybe_update_local_attn_metadata_for_replay"

# The detection probe: page size 16, chunk 32, one request of 48 tokens on full pages
# 5, 6, 7 whose SWA pages are 1, 2, 3.
_PS, _CHUNK, _FULL_PAGES, _SWA_PAGES = 16, 32, (5, 6, 7), (1, 2, 3)


# ---------------------------------------------------------------------------- the fix


def _eager_with_pages(original, self, forward_batch, metadata, device, *args, **kwargs):
    if self.page_size <= 1 or not self.has_local_attention:
        return original(self, forward_batch, metadata, device, *args, **kwargs)
    import torch
    table, cu_q, lens = metadata.page_table, metadata.cu_seqlens_q, metadata.cache_seqlens_int32
    if table is None or cu_q is None or lens is None:
        metadata.local_attn_metadata = None
        return None
    if self.use_sliding_window_kv_pool:  # token slots: the full->SWA mapping applies
        table = self.token_to_kv_pool.translate_loc_from_full_to_swa(table).to(torch.int32)
    table = table[:, :: self.page_size] // self.page_size  # one column per page, page ids
    q, cu_local, k, blocks = local_batches(self.attention_chunk_size, cu_q.cpu().numpy(), lens.cpu().numpy(),
                                           table, self.page_size)
    metadata.local_attn_metadata = local_metadata_class(metadata)(
        local_query_start_loc=torch.from_numpy(cu_local).to(device),
        local_seqused_k=torch.from_numpy(k).to(device),
        local_block_table=blocks.to(device),
        local_max_query_len=int(q.max()),
        local_max_seq_len=int(k.max()),
    )
    return None


def _capture_chunk_wide(original, self, metadata, bs, *args, **kwargs):
    result = original(self, metadata, bs, *args, **kwargs)
    lam = getattr(metadata, "local_attn_metadata", None)
    if self.page_size > 1 and self.has_local_attention and lam is not None:
        buf = self.decode_cuda_graph_local_attn_metadata["local_block_table"]
        pages = max(1, self.attention_chunk_size // self.page_size)
        lam.local_block_table = buf[: lam.local_block_table.shape[0], :pages]
    return result


def _replay_with_page_ids(original, self, metadata, bs, *args, **kwargs):
    if self.page_size <= 1 or not self.has_local_attention:
        return original(self, metadata, bs, *args, **kwargs)
    import torch
    bufs = self.decode_cuda_graph_local_attn_metadata
    q_buf, k_buf, block_buf = bufs["local_query_start_loc"], bufs["local_seqused_k"], bufs["local_block_table"]
    lens = metadata.cache_seqlens_int32[:bs].cpu().numpy()  # one device-to-host copy, as sglang's own replay
    max_len = int(lens.max())
    # The graph metadata holds page ids already; swa_page_table is that table in the SWA pool.
    table = metadata.swa_page_table if self.use_sliding_window_kv_pool else metadata.page_table
    table = table[:bs, : (max_len + self.page_size - 1) // self.page_size]
    cu_q = torch.arange(bs + 1, dtype=torch.int32).numpy()  # decode: one query token each
    q, cu_local, k, blocks = local_batches(self.attention_chunk_size, cu_q, lens, table, self.page_size)
    device = q_buf.device
    cu_local, k_local, blocks = torch.from_numpy(cu_local).to(device), torch.from_numpy(k).to(device), blocks.to(device)
    nq, nk, (b0, b1) = cu_local.shape[0], k_local.shape[0], blocks.shape
    q_buf[:nq].copy_(cu_local)
    q_buf[nq:].fill_(0)
    k_buf[:nk].copy_(k_local)
    k_buf[nk:].fill_(0)
    block_buf[:b0, :b1].copy_(blocks)
    block_buf[b0:, :].fill_(0)
    block_buf[:b0, b1:].fill_(0)
    if metadata.local_attn_metadata is not None:
        metadata.local_attn_metadata.local_max_query_len = int(q.max())
        metadata.local_attn_metadata.local_max_seq_len = int(k.max())
    return None


# ---------------------------------------------------------------------------- detection


def _probe_pool():
    """A real ``SWAKVPool`` object carrying only its full->SWA token mapping (no buffers):
    full pages 5, 6, 7 hold the SWA pages 1, 2, 3. The mapping is handed over with the pool's
    own ``register_mapping``, as sglang's allocator does: where the pool keeps state that
    goes with the mapping (upstream main in June 2026 caches the last translation, reset
    there), that state is set up too."""
    import torch
    pool = object.__new__(swa_pool_class())
    mapping = torch.zeros(_PS * 16 + 1, dtype=torch.int64)
    for f, s in zip(_FULL_PAGES, _SWA_PAGES):
        mapping[f * _PS:(f + 1) * _PS] = torch.arange(s * _PS, (s + 1) * _PS)
    pool.register_mapping(mapping)
    return pool


def _probe_inputs():
    import torch
    n = len(_FULL_PAGES) * _PS  # 48 tokens: chunks [0, 32) and [32, 48)
    tokens = torch.cat([torch.arange(p * _PS, (p + 1) * _PS) for p in _FULL_PAGES]).to(torch.int32)[None]
    pages = torch.zeros(1, 8, dtype=torch.int32)
    pages[0, : len(_FULL_PAGES)] = torch.tensor(_FULL_PAGES)
    swa_pages = torch.zeros(1, 8, dtype=torch.int32)
    swa_pages[0, : len(_SWA_PAGES)] = torch.tensor(_SWA_PAGES)
    return SimpleNamespace(n=n, tokens=tokens, pages=pages, swa_pages=swa_pages)


def _graph_buffers():
    import torch
    return {"local_query_start_loc": torch.zeros(9, dtype=torch.int32),
            "local_seqused_k": torch.zeros(8, dtype=torch.int32),
            "local_block_table": torch.zeros(8, _CHUNK // _PS, dtype=torch.int32)}


def probe(cls: type, peel: bool = True) -> dict:
    """Per half ("eager", "graph"): True where the block table the installed code builds
    starts each chunk on the request's SWA page (eager: chunks at pages 1 and 3 of a
    48-token prefill; graph: the decode token's chunk at page 3)."""
    import torch
    inp, pool = _probe_inputs(), _probe_pool()
    md_cls = getattr(optional_module(MODULE), "FlashAttentionMetadata")
    want_eager, want_graph = [_SWA_PAGES[0], _SWA_PAGES[2]], _SWA_PAGES[2]

    def metadata(page_table, swa_page_table=None, q=None):
        md = md_cls()
        md.page_table, md.swa_page_table = page_table, swa_page_table
        md.cu_seqlens_q = torch.tensor([0, q or 1], dtype=torch.int32)
        md.cache_seqlens_int32 = torch.tensor([inp.n], dtype=torch.int32)
        md.local_attn_metadata = None
        return md

    builder_cls = getattr(optional_module(BUILDER_MODULE), "LocalAttentionMetadataBuilder", None)
    bufs = _graph_buffers()
    if hasattr(cls, REPLAY.rsplit(".", 1)[1]):
        self = object.__new__(cls)
        self.__dict__.update(has_local_attention=True, attention_chunk_size=_CHUNK, page_size=_PS,
                             use_sliding_window_kv_pool=True, token_to_kv_pool=pool,
                             decode_cuda_graph_local_attn_metadata=bufs,
                             decode_cuda_graph_metadata={"cu_seqlens_q": torch.arange(9, dtype=torch.int32)})
        # ``peel``: the installed code under our own hooks (detection judges sglang's code,
        # also where the hooks are in already); else the methods as they run (``check``).
        init, replay = (getattr(cls, t.rsplit(".", 1)[1]) for t in (EAGER, REPLAY))
        if peel:
            init, replay = without_wrappers_of(init, NAME), without_wrappers_of(replay, NAME)
        md = metadata(inp.tokens, q=inp.n)
        init(self, None, md, "cpu")
        eager = md.local_attn_metadata.local_block_table[:, 0].tolist()
        md = metadata(inp.pages, inp.swa_pages)
        replay(self, md, 1)
    elif builder_cls is not None:
        builder = builder_cls(attention_chunk_size=_CHUNK, page_size=_PS, max_context_len=4096, device="cpu",
                              swa_translate=pool.translate_loc_from_full_to_swa)
        lam = builder.build(cu_seqlens_q=torch.tensor([0, inp.n], dtype=torch.int32),
                            cache_seqlens_int32=torch.tensor([inp.n], dtype=torch.int32), page_table=inp.tokens,
                            device="cpu")
        eager = lam.local_block_table[:, 0].tolist()
        builder.update_for_replay(metadata(inp.pages, inp.swa_pages), 1, buffers=bufs)
    else:
        raise LookupError("neither FlashAttentionBackend's local-attention methods nor LocalAttentionMetadataBuilder")
    return {"eager": eager == want_eager, "graph": int(bufs["local_block_table"][0, 0]) == want_graph}


def classify() -> Detection:
    if optional_module(MODULE) is None:
        return Detection.not_applicable("this sglang has no FA3 backend module")
    cls = target_class(CLASS)  # gone: target moved (TargetMissing), not an unknown shape
    try:
        got = probe(cls)
    except Exception as e:  # noqa: BLE001
        return Detection.unknown(f"local-attention metadata could not be probed: {type(e).__name__}: {e}")
    wrong = [half for half, ok in got.items() if not ok]
    if not wrong:
        return Detection.not_needed("chunked attention gets page ids of its own pool, eager and in CUDA graphs")
    what = {"eager": "the eager local block table holds token slots, not page ids (#32902)",
            "graph": "CUDA-graph decode pushes page ids through the token-slot full->SWA mapping (#38187)"}
    plan = {"eager": (around(EAGER, _eager_with_pages),),
            "graph": (around(CAPTURE, _capture_chunk_wide), around(REPLAY, _replay_with_page_ids))}
    return Detection.needed("; ".join(what[h] for h in wrong), *(hook for h in wrong for hook in plan[h]))


class Fa3LocalAttnPagesFix(Fix):
    name = NAME
    summary = "FA3 chunked (Llama 4 local) attention reads page ids of its own pool with page size > 1"
    upstream_prs = ("#32902", "#37733", "#38187")
    targets = (EAGER, CAPTURE, REPLAY)
    target_params = {EAGER: ("self", "forwardbatch", "metadata", "device"), CAPTURE: ("self", "metadata", "bs"),
                     REPLAY: ("self", "metadata", "bs")}
    check_module = "sglang_swa_plugin.check.fa3_local_attn_pages"

    def detect(self) -> Detection:
        return classify()


FIX = Fa3LocalAttnPagesFix()
