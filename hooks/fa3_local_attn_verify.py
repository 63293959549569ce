"""fa3_local_attn_verify: FA3 chunked (Llama 4 "local") layers keep their chunk in CUDA-graph target verify.

Bug
    Llama 4's chunked layers (``use_irope``, ``sliding_window_size`` -1) are the SWA-pool
    layers of sglang's hybrid pool. FA3 builds their local-attention metadata (chunk-aligned
    "virtual" requests, SWA-pool page ids) for prefill, plain decode and eager topk-1 target
    verify, but the CUDA-graph TARGET_VERIFY metadata (capture and replay) carries none
    (sglang: "TODO: we need to test this part for llama 4 eagle case"). In every EAGLE/EAGLE3
    verify under CUDA graphs the chunked layers then attend over the whole context, causal,
    through ``metadata.page_table``: full-pool page ids, read in the SWA buffer on the hybrid
    pool. Greedy output diverges from plain decode at the first tokens (H100, sglang 0.5.11:
    0/32 identical at page 1 and 16, on the hybrid and on one pool; graphs off: 32/32).
    This module gives the verify graph its own static local-attention buffers (as many
    virtual requests as a verify step can make: ``bs * (1 + cdiv(draft_tokens - 1, chunk))``,
    one chunk of pages each), binds the metadata's ``local_attn_metadata`` to views of them at
    capture and refills them before each replay with the values of sglang's own splitter over
    the verify page table of the layer's own pool (``swa_page_table`` on the hybrid pool, page
    ids at every page size), computed on the device from the graph's sequence lengths with
    fixed shapes (no host-device sync); unused virtual requests get no query tokens and no keys. Eager topk-1 verify
    already builds the metadata (page size > 1: with ``fa3_local_attn_pages``).
    ``--speculative-eagle-topk`` > 1 (cascade verify) is ``fa3_local_attn_tree_verify``'s.
    Not covered: verify steps whose requests carry different numbers of draft tokens (ragged
    layouts), which keep sglang's metadata.

Upstream PRs
    None (no upstream report; sglang's own TODO marks the path as untested).

Affected versions
    0.5.10-0.5.23: no release builds local-attention metadata for CUDA-graph target verify.
    The capture/replay API up to 0.5.12, ``init_forward_metadata_out_graph`` from 0.5.13
    (0.5.18+: no host lengths on the sync-free path; the hook reads none). 0.5.23's metadata runs Triton
    kernels, so its graph path is exercised on the GPU only.
    Status by release: applied 0.5.10+.

Detection
    Structural: the installed FA3 backend's CUDA-graph metadata methods (capture/replay up to
    0.5.12, ``init_forward_metadata_out_graph`` and the helpers it calls from 0.5.13) are
    parsed; a target-verify branch that calls local-attention metadata code (a name with
    ``local_attn``, or the builder's ``build_for_capture``/``update_for_replay``) means not
    needed; none: needed. No FA3 module: not applicable.

Delete when
    sglang builds local-attention metadata for TARGET_VERIFY under CUDA graphs (detection
    then says not needed on every supported release).
"""

from __future__ import annotations

import ast

from sglang_swa_plugin import graphed
from sglang_swa_plugin.fa3_local import FA3_CLASS as CLASS, FA3_MODULE as MODULE, GRAPH_CAPTURE as CAPTURE
from sglang_swa_plugin.fa3_local import GRAPH_PARAMS, GRAPH_REPLAY as REPLAY, GRAPH_STATE as STATE, OUT_GRAPH
from sglang_swa_plugin.fa3_local import arg as _arg, cdiv as _cdiv, graph_targets, installed_graph_api
from sglang_swa_plugin.fa3_local import local_metadata_class, verify_local_batches
from sglang_swa_plugin.fix import Detection, Fix, hookimpl
from sglang_swa_plugin.probe import callee, if_branches, optional_module, own_function, target_class

NAME = "fa3_local_attn_verify"
BUFFERS = "_swa_plugin_verify_local_attn"  # the verify graphs' static buffers, on the backend
# Where the CUDA-graph metadata is built, per API; helpers they call.
GRAPH_METHODS = ("init_forward_metadata_capture_cuda_graph", "init_forward_metadata_replay_cuda_graph",
                 "init_forward_metadata_out_graph", "_init_full_cg_decode_metadata", "_apply_cuda_graph_metadata",
                 "_bind_metadata_buffers")
LOCAL_CALLS = ("build_for_capture", "update_for_replay")


# ---------------------------------------------------------------------------- the fix


def _applies(self) -> bool:
    return bool(getattr(self, "has_local_attention", False)) and BUFFERS in self.__dict__


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
    self.__dict__[BUFFERS] = {
        "local_query_start_loc": torch.zeros(v + 1, dtype=torch.int32, device=dev),
        "local_seqused_k": torch.zeros(v, dtype=torch.int32, device=dev),
        "local_block_table": torch.zeros(v, pages, dtype=torch.int32, device=dev),
    }
    return result


def _bind(self, metadata, bs: int) -> None:
    """At capture: the metadata's local-attention views over the verify buffers, as wide as
    the most virtual requests ``bs`` requests can make (the graph's kernel sees these)."""
    bufs, v = self.__dict__[BUFFERS], bs * _per_request(self)
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
    bufs = self.__dict__[BUFFERS]
    q, k, blocks = bufs["local_query_start_loc"], bufs["local_seqused_k"], bufs["local_block_table"]
    chunk, ps, n, per = (self.attention_chunk_size, self.page_size, int(self.speculative_num_draft_tokens),
                         _per_request(self))
    graphed.run(self, (NAME, bs, chunk, ps, n, per),
                lambda: verify_local_batches(chunk, ps, prefix_lens, n, table, bs, per, q, k, blocks),
                [prefix_lens, table, q, k, blocks])


def _verify_topk1(self, forward_mode, spec_info) -> bool:
    return (_applies(self) and forward_mode is not None and forward_mode.is_target_verify()
            and (self.topk or 0) <= 1 and getattr(spec_info, "ragged_verify_layout", None) is None)


def _capture_with_local(original, self, bs, *args, **kwargs):
    # (bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info)
    result = original(self, bs, *args, **kwargs)
    if _verify_topk1(self, _arg(args, kwargs, 4, "forward_mode"), _arg(args, kwargs, 5, "spec_info")):
        metadata = self.target_verify_metadata[bs]
        _bind(self, metadata, bs)
        _fill(self, metadata, bs, _arg(args, kwargs, 2, "seq_lens"))
    return result


def _replay_with_local(original, self, bs, *args, **kwargs):
    # (bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu, ...)
    result = original(self, bs, *args, **kwargs)
    if _verify_topk1(self, _arg(args, kwargs, 4, "forward_mode"), _arg(args, kwargs, 5, "spec_info")):
        _fill(self, self.target_verify_metadata[bs], bs, _arg(args, kwargs, 1, "seq_lens"))
    return result


def _out_graph_with_local(original, self, forward_batch, *args, **kwargs):
    result = original(self, forward_batch, *args, **kwargs)
    if _verify_topk1(self, forward_batch.forward_mode, forward_batch.spec_info):
        bs, in_capture = forward_batch.batch_size, bool(_arg(args, kwargs, 0, "in_capture"))
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
    try:
        cls = target_class(CLASS)
        if verify_builds_local(cls):
            return Detection.not_needed("CUDA-graph target verify builds local-attention metadata")
    except Exception as e:  # noqa: BLE001
        return Detection.unknown(f"the FA3 CUDA-graph metadata methods could not be read: {type(e).__name__}: {e}")
    return Detection.needed("CUDA-graph target verify builds no local-attention metadata: chunked layers attend "
                            "over the whole context through the full-pool page table")


class Fa3LocalAttnVerifyFix(Fix):
    name = NAME
    summary = "FA3 chunked (Llama 4 local) layers keep their chunk, in their own pool, in CUDA-graph target verify"
    upstream_prs = ()
    check_module = "sglang_swa_plugin.check.fa3_local_attn_verify"

    @property
    def targets(self):  # the CUDA-graph metadata API changed in 0.5.13
        return graph_targets()

    target_params = GRAPH_PARAMS

    def detect(self) -> Detection:
        return classify()

    def install(self, hooks) -> None:
        hooks.around(STATE, _state_with_verify_buffers)
        if installed_graph_api() == "out_graph":
            hooks.around(OUT_GRAPH, _out_graph_with_local)
        else:
            hooks.around(CAPTURE, _capture_with_local)
            hooks.around(REPLAY, _replay_with_local)


FIX = Fa3LocalAttnVerifyFix()


@hookimpl
def sglang_swa_plugin_fixes():
    return [FIX]
