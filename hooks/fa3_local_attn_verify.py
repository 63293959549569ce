"""fa3_local_attn_verify: FA3 chunked (Llama 4 "local") layers keep their chunk in CUDA-graph target verify.

Bug
    FA3's CUDA-graph TARGET_VERIFY metadata carries no local-attention metadata, so with
    EAGLE under CUDA graphs chunked layers attend over the whole context through full-pool
    pages: wrong greedy output from the first tokens. Fix: static local-attention buffers
    for the verify graphs, bound at capture, refilled before each replay with the values of
    sglang's own splitter over the layer's pool's page table, computed on the device (fixed
    shapes, no host-device sync). topk > 1: fa3_local_attn_tree_verify.
Upstream PRs
    None (sglang's own TODO marks the path as untested).
Affected versions
    0.5.10-0.5.23 (capture/replay API up to 0.5.12, ``init_forward_metadata_out_graph`` after).
    Status by release: applied 0.5.10+.
Detection
    Syntax tree of the CUDA-graph metadata methods: a target-verify branch that calls
    local-attention code: not needed; none: needed. The plan follows the graph API.
Delete when
    sglang builds local-attention metadata for CUDA-graph TARGET_VERIFY.
"""

from __future__ import annotations

import ast

from sglang_swa_plugin import graphed, state
from sglang_swa_plugin.fa3_local import FA3_CLASS as CLASS, FA3_MODULE as MODULE, GRAPH_CAPTURE as CAPTURE
from sglang_swa_plugin.fa3_local import GRAPH_PARAMS, GRAPH_REPLAY as REPLAY, GRAPH_STATE as STATE, OUT_GRAPH
from sglang_swa_plugin.fa3_local import cdiv as _cdiv, graph_api, local_metadata_class
from sglang_swa_plugin.fa3_local import verify_local_batches
from sglang_swa_plugin.fix import Detection, Fix, argument, arguments, around
from sglang_swa_plugin.probe import callee, if_branches, optional_module, own_function, target_class

NAME = "fa3_local_attn_verify"
BUFFERS = "fa3_local_attn_verify.buffers"  # the verify graphs' static buffers, in the backend's state
# Where the CUDA-graph metadata is built, per API; helpers they call.
GRAPH_METHODS = ("init_forward_metadata_capture_cuda_graph", "init_forward_metadata_replay_cuda_graph",
                 "init_forward_metadata_out_graph", "_init_full_cg_decode_metadata", "_apply_cuda_graph_metadata",
                 "_bind_metadata_buffers")
LOCAL_CALLS = ("build_for_capture", "update_for_replay")


# ---------------------------------------------------------------------------- the fix


def _applies(self) -> bool:
    return bool(getattr(self, "has_local_attention", False)) and state.has(self, BUFFERS)


def _per_request(self) -> int:
    """Virtual requests one verify request can make: its draft tokens span this many chunks."""
    return 1 + _cdiv(self.speculative_num_draft_tokens - 1, self.attention_chunk_size)


def _state_with_verify_buffers(original, self, max_bs, *args, **kwargs):
    result = original(self, max_bs, *args, **kwargs)
    if (not getattr(self, "has_local_attention", False) or not (self.speculative_num_draft_tokens or 0) > 0
            or (self.topk or 0) > 1):
        return result
    import torch
    v = max_bs * _per_request(self)
    pages = _cdiv(self.attention_chunk_size, self.page_size)
    dev = self.device
    state.of(self)[BUFFERS] = {
        "local_query_start_loc": torch.zeros(v + 1, dtype=torch.int32, device=dev),
        "local_seqused_k": torch.zeros(v, dtype=torch.int32, device=dev),
        "local_block_table": torch.zeros(v, pages, dtype=torch.int32, device=dev),
    }
    return result


def _bind(self, metadata, bs: int) -> None:
    """At capture: the metadata's local-attention views over the verify buffers, as wide as
    the most virtual requests ``bs`` requests can make (the graph's kernel sees these)."""
    bufs, v = state.get(self, BUFFERS), bs * _per_request(self)
    metadata.local_attn_metadata = local_metadata_class(metadata)(
        local_query_start_loc=bufs["local_query_start_loc"][: v + 1],
        local_seqused_k=bufs["local_seqused_k"][:v],
        local_block_table=bufs["local_block_table"][:v],
        local_max_query_len=int(self.speculative_num_draft_tokens),
        local_max_seq_len=int(self.attention_chunk_size),
    )


def _fill(self, metadata, bs: int, prefix_lens) -> None:
    """Before a replay (and at capture): the step's virtual requests into the buffers, from
    the device lengths before the draft tokens; the rest empty. Device ops with fixed shapes
    (``verify_local_batches``), replayed as one CUDA graph (``graphed``): no host-device sync
    in the replayed path."""
    table = metadata.swa_page_table if self.use_sliding_window_kv_pool else metadata.page_table
    bufs = state.get(self, BUFFERS)
    q, k, blocks = bufs["local_query_start_loc"], bufs["local_seqused_k"], bufs["local_block_table"]
    chunk, ps, n, per = (self.attention_chunk_size, self.page_size, int(self.speculative_num_draft_tokens),
                         _per_request(self))
    graphed.run(self, (NAME, bs, chunk, ps, n, per),
                lambda: verify_local_batches(chunk, ps, prefix_lens, n, table, bs, per, q, k, blocks),
                [prefix_lens, table, q, k, blocks])


def _verify_topk1(self, forward_mode, spec_info) -> bool:
    return (_applies(self) and forward_mode is not None and forward_mode.is_target_verify()
            and (self.topk or 0) <= 1 and getattr(spec_info, "ragged_verify_layout", None) is None)


def _capture_with_local(original, self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    mode, spec_info, bs, seq_lens = arguments(original, args, kwargs, "forward_mode", "spec_info", "bs", "seq_lens")
    if _verify_topk1(self, mode, spec_info):
        metadata = self.target_verify_metadata[bs]
        _bind(self, metadata, bs)
        _fill(self, metadata, bs, seq_lens)
    return result


def _replay_with_local(original, self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    mode, spec_info, bs, seq_lens = arguments(original, args, kwargs, "forward_mode", "spec_info", "bs", "seq_lens")
    if _verify_topk1(self, mode, spec_info):
        _fill(self, self.target_verify_metadata[bs], bs, seq_lens)
    return result


def _out_graph_with_local(original, self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    forward_batch = argument(original, "forward_batch", args, kwargs)
    if _verify_topk1(self, forward_batch.forward_mode, forward_batch.spec_info):
        bs, in_capture = forward_batch.batch_size, bool(argument(original, "in_capture", args, kwargs))
        metadata = self.target_verify_metadata[bs]
        if in_capture or metadata.local_attn_metadata is None:
            _bind(self, metadata, bs)
        _fill(self, metadata, bs, forward_batch.seq_lens)
    return result


# ---------------------------------------------------------------------------- detection


def verify_builds_local(cls) -> bool:
    """Whether a target-verify branch of the CUDA-graph metadata methods calls local-attention
    metadata code."""
    for name in GRAPH_METHODS:
        fn = own_function(cls, name)
        if fn is None:
            continue
        for node in if_branches(fn, "is_target_verify", mentioning=("local_attn",) + LOCAL_CALLS):
            called = {callee(c) or "" for stmt in node.body for c in ast.walk(stmt) if isinstance(c, ast.Call)}
            if any("local_attn" in c or c in LOCAL_CALLS for c in called):
                return True
    return False


def classify() -> Detection:
    if optional_module(MODULE) is None:
        return Detection.not_applicable("this sglang has no FA3 backend module")
    cls = target_class(CLASS)  # gone: target moved (TargetMissing), not an unknown shape
    try:
        builds_local = verify_builds_local(cls)
    except Exception as e:  # noqa: BLE001
        return Detection.unknown(f"the FA3 CUDA-graph metadata methods could not be read: {type(e).__name__}: {e}")
    # The CUDA-graph metadata API changed in 0.5.13 (init_forward_metadata_out_graph).
    graph = ((around(OUT_GRAPH, _out_graph_with_local),) if graph_api(cls) == "out_graph"
             else (around(CAPTURE, _capture_with_local), around(REPLAY, _replay_with_local)))
    plan = (around(STATE, _state_with_verify_buffers), *graph)
    if builds_local:
        return Detection.not_needed("CUDA-graph target verify builds local-attention metadata", *plan)
    return Detection.needed("CUDA-graph target verify builds no local-attention metadata: chunked layers attend "
                            "over the whole context through the full-pool page table", *plan)


class Fa3LocalAttnVerifyFix(Fix):
    name = NAME
    summary = "FA3 chunked (Llama 4 local) layers keep their chunk, in their own pool, in CUDA-graph target verify"
    upstream_prs = ()
    check_module = "sglang_swa_plugin.check.fa3_local_attn_verify"

    targets = (STATE, CAPTURE, REPLAY, OUT_GRAPH)
    target_params = GRAPH_PARAMS

    def detect(self) -> Detection:
        return classify()


FIX = Fa3LocalAttnVerifyFix()
