"""fa3_local_attn_tree_verify: FA3 chunked (Llama 4 "local") layers keep their chunk in tree (topk > 1) target verify.

Bug
    topk > 1 verify is cascade attention (whole prefix, then the tree's shared table);
    chunked layers take it with no local-attention metadata: they attend over the whole
    context, in full-pool slots. Fix: the chunked layers get their own two parts, computed
    on the device (no sync, graph-safe) from the chunk's start, swapped in around their
    ``forward_extend``. Page size 1 only (sglang stops topk > 1 otherwise).
Upstream PRs
    None (sglang's own TODO marks Llama 4 EAGLE as untested).
Affected versions
    0.5.10-0.5.23: chunked layers take the cascade with the shared tree table.
    Status by release: applied 0.5.10+.
Detection
    Text of ``forward_extend``: its ``use_cascade_attn`` condition names no local attention:
    needed; it does: not needed; no cascade or local path: target moved.
Delete when
    sglang's topk > 1 verify keeps chunked layers in their chunk.
"""

from __future__ import annotations

import re

from sglang_swa_plugin import graphed, state
from sglang_swa_plugin.fa3_local import FA3_CLASS as CLASS, FA3_MODULE as MODULE, GRAPH_CAPTURE, GRAPH_PARAMS
from sglang_swa_plugin.fa3_local import GRAPH_REPLAY, GRAPH_STATE, OUT_GRAPH, arange_once, graph_api
from sglang_swa_plugin.fa3_local import local_metadata_class
from sglang_swa_plugin.fix import Detection, Fix, TargetMissing, argument, arguments, around
from sglang_swa_plugin.log import warn_once
from sglang_swa_plugin.probe import function_text, optional_module, own_function, target_class

NAME = "fa3_local_attn_tree_verify"
EAGER = CLASS + ".init_forward_metadata"
FORWARD = CLASS + ".forward_extend"
SHARED_EXPAND = "forward_metadata_spec_decode_expand"
EXPAND = "chunked_tree_part"  # in a step's FlashAttentionMetadata's state: the chunked layers' part 2
BUFFERS = "fa3_local_attn_tree_verify.buffers"  # in the backend's state: the verify graphs' static buffers


# ---------------------------------------------------------------------------- the fix


def _tree(self) -> bool:
    """A backend of a chunked-attention model that verifies draft trees."""
    return bool(getattr(self, "has_local_attention", False)) and (self.topk or 0) > 1


def _tree_verify(self, mode) -> bool:
    if not (_tree(self) and mode is not None and mode.is_target_verify()):
        return False
    if self.page_size != 1:
        warn_once(NAME, f"page size {self.page_size}", "the chunked (local) layers of this model attend over the "
                                                       "whole context in topk > 1 target verify (page size 1 only)")
        return False
    return True


def _buffers(self, rows: int, device) -> dict:
    import torch

    n, c = int(self.speculative_num_draft_tokens), int(self.attention_chunk_size)
    i32 = dict(dtype=torch.int32, device=device)
    return {"cu_q": torch.arange(rows + 1, **i32), "prefix_len": torch.zeros(rows, **i32),
            "prefix": torch.zeros(rows, c, **i32), "tree_len": torch.zeros(rows, **i32),
            "tree_cu": torch.zeros(rows + 1, **i32), "tree": torch.zeros(rows, n, **i32),
            "positions": torch.zeros(rows, dtype=torch.int64, device=device)}  # the step's, copied in


def _bind(self, metadata, bufs: dict, rows: int) -> None:
    """The step's metadata reads views of ``bufs``: part 1 as one-query local-attention
    requests (``local_attn_metadata``), part 2 as a tree table of its own (``EXPAND``)."""
    n, c = int(self.speculative_num_draft_tokens), int(self.attention_chunk_size)
    metadata.local_attn_metadata = local_metadata_class(metadata)(
        local_query_start_loc=bufs["cu_q"][: rows + 1], local_seqused_k=bufs["prefix_len"][:rows],
        local_block_table=bufs["prefix"][:rows], local_max_query_len=1, local_max_seq_len=c)
    part2 = type(metadata)()
    part2.page_table, part2.cache_seqlens_int32 = bufs["tree"][:rows], bufs["tree_len"][:rows]
    part2.cu_seqlens_q, part2.cu_seqlens_k = bufs["cu_q"][: rows + 1], bufs["tree_cu"][: rows + 1]
    part2.max_seq_len_q, part2.max_seq_len_k = 1, n
    state.of(metadata)[EXPAND] = part2


def _fill(self, bufs: dict, bs: int, req_pool_indices, seq_lens, positions, metadata, expand) -> None:
    """The chunked layers' two parts of the step, on the device. Draft token i of request r at
    position p sees the keys at positions [p - p % chunk, p]: part 1 the prefix ones (from
    sglang's prefix table), part 2 its ancestors (sglang's tree table, positions found by
    matching its slots with the request's draft slots); both translated to the SWA pool."""
    import torch

    n, c, rows = int(self.speculative_num_draft_tokens), int(self.attention_chunk_size), bs * int(
        self.speculative_num_draft_tokens)
    prefix_lens = seq_lens[:bs].to(torch.int64)
    pos = prefix_lens.repeat_interleave(n)  # padded rows (graph replays): depth 0
    known = min(positions.numel(), rows)
    pos[:known] = positions[:known]
    start = pos - pos % c
    dev = pos.device
    idx, req = arange_once(n, dev), arange_once(rows, dev, n)  # req: each row's request
    # part 1: the prefix from the chunk's start, one row per draft token
    table = metadata.page_table[:bs]
    cols = (start[:, None] + arange_once(c, dev)).clamp_(max=table.shape[1] - 1)
    prefix = table[req[:, None], cols].to(torch.int64)
    prefix_len = (prefix_lens.repeat_interleave(n) - start).clamp_(min=0)
    # part 2: the ancestors from the chunk's start
    tree = expand.page_table[:rows, :n].to(torch.int64)
    draft_cols = (prefix_lens[:, None] + idx).clamp_(max=self.req_to_token.shape[1] - 1)
    draft = self.req_to_token[req_pool_indices[:bs, None].to(torch.int64), draft_cols]  # slots, draft order
    hit = tree[:, :, None] == draft.repeat_interleave(n, 0)[:, None, :]
    key_pos = (hit * pos.view(bs, n).repeat_interleave(n, 0)[:, None, :]).sum(-1)
    keep = (idx < expand.cache_seqlens_int32[:rows, None]) & (key_pos >= start[:, None])
    tree = tree.gather(1, torch.sort(torch.where(keep, idx, arange_once(2 * n, dev)[n:]), dim=1).indices)
    if self.use_sliding_window_kv_pool:
        prefix = self.token_to_kv_pool.translate_loc_from_full_to_swa(prefix)
        tree = self.token_to_kv_pool.translate_loc_from_full_to_swa(tree)
    tree_len = keep.sum(1)
    bufs["prefix"][:rows].copy_(prefix)
    bufs["prefix_len"][:rows].copy_(prefix_len)
    bufs["tree"][:rows].copy_(tree)
    bufs["tree_len"][:rows].copy_(tree_len)
    bufs["tree_cu"][1: rows + 1].copy_(torch.cumsum(tree_len, 0))


def _step(self, metadata, expand, bs, req_pool_indices, seq_lens, positions, bufs=None) -> None:
    """Fill (and, eager or at capture, bind) the chunked layers' parts for one step."""
    if positions is None:  # capture without positions: the rows' first draft position
        positions = seq_lens[:0]
    if bufs is None:  # eager: this step's own tensors
        bufs = _buffers(self, bs * int(self.speculative_num_draft_tokens), seq_lens.device)
        _bind(self, metadata, bufs, bs * int(self.speculative_num_draft_tokens))
        _fill(self, bufs, bs, req_pool_indices, seq_lens, positions, metadata, expand)
        return
    _graph_fill(self, bufs, bs, req_pool_indices, seq_lens, positions, metadata, expand)


def _graph_fill(self, bufs: dict, bs: int, req_pool_indices, seq_lens, positions, metadata, expand) -> None:
    """A graph step's fill, replayed as one CUDA graph (``graphed``) over the static buffers:
    the step's draft positions (a tensor of its own per step) are copied into ``bufs`` first."""
    known = min(positions.numel(), bs * int(self.speculative_num_draft_tokens))
    staged = bufs["positions"][:known]
    staged.copy_(positions[:known])
    pool = self.token_to_kv_pool
    mapping = getattr(pool, "full_to_swa_index_mapping", None) if self.use_sliding_window_kv_pool else None
    inputs = [seq_lens, req_pool_indices, staged, metadata.page_table, expand.page_table, expand.cache_seqlens_int32,
              self.req_to_token, *bufs.values()] + ([mapping] if mapping is not None else [])
    graphed.run(self, (NAME, bs, known, self.use_sliding_window_kv_pool),
                lambda: _fill(self, bufs, bs, req_pool_indices, seq_lens, staged, metadata, expand), inputs)


def _positions(forward_batch):
    """The draft tokens' positions: the verify input's, else the batch's."""
    positions = getattr(forward_batch.spec_info, "positions", None)
    return getattr(forward_batch, "positions", None) if positions is None else positions


def _eager(original, self, forward_batch, *args, **kwargs):
    result = original(self, forward_batch, *args, **kwargs)
    if _tree_verify(self, forward_batch.forward_mode):
        _step(self, self.forward_metadata, getattr(self, SHARED_EXPAND), forward_batch.batch_size,
              forward_batch.req_pool_indices, forward_batch.seq_lens, _positions(forward_batch))
    return result


def _state(original, self, max_bs, *args, **kwargs):
    result = original(self, max_bs, *args, **kwargs)
    if _tree(self) and self.page_size == 1:
        state.of(self)[BUFFERS] = _buffers(self, max_bs * int(self.speculative_num_draft_tokens), self.device)
    return result


def _graph_step(self, bs, req_pool_indices, seq_lens, positions, in_capture) -> None:
    bufs = state.get(self, BUFFERS)
    if bufs is None:
        return
    metadata = self.target_verify_metadata_topk_normal[bs]
    if in_capture or state.get(metadata, EXPAND) is None:
        _bind(self, metadata, bufs, bs * int(self.speculative_num_draft_tokens))
    _step(self, metadata, self.target_verify_metadata_topk_expand[bs], bs, req_pool_indices, seq_lens, positions,
          bufs=bufs)


def _graph_hook(in_capture: bool):
    """The AROUND hook of the capture (``in_capture``) or replay metadata method (up to 0.5.12)."""

    def hook(original, self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        mode, bs, rows, seq_lens, spec_info = arguments(original, args, kwargs, "forward_mode", "bs",
                                                        "req_pool_indices", "seq_lens", "spec_info")
        if _tree_verify(self, mode):
            _graph_step(self, bs, rows, seq_lens, getattr(spec_info, "positions", None), in_capture)
        return result

    return hook


_capture, _replay = _graph_hook(True), _graph_hook(False)


def _out_graph(original, self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    forward_batch = argument(original, "forward_batch", args, kwargs)
    if _tree_verify(self, forward_batch.forward_mode):
        _graph_step(self, forward_batch.batch_size, forward_batch.req_pool_indices, forward_batch.seq_lens,
                    _positions(forward_batch), bool(argument(original, "in_capture", args, kwargs)))
    return result


def _chunked_layers_own_tree(original, self, q, k, v, layer, forward_batch, *args, **kwargs):
    metadata = getattr(self, "forward_metadata", None)
    part2 = None if metadata is None else state.get(metadata, EXPAND)
    if part2 is None or not getattr(layer, "use_irope", False) or not forward_batch.forward_mode.is_target_verify():
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    shared = getattr(self, SHARED_EXPAND)
    setattr(self, SHARED_EXPAND, part2)
    try:
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    finally:
        setattr(self, SHARED_EXPAND, shared)


# ---------------------------------------------------------------------------- detection


def _statement(text: str, name: str) -> str:
    """The text of ``name = ...`` in ``text`` up to where its brackets close ("" if none)."""
    m = re.search(rf"^\s*{name}\s*=", text, flags=re.M)
    if m is None:
        return ""
    depth, i = 0, m.end()
    while i < len(text):
        ch = text[i]
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "\n" and depth <= 0:
            break
        i += 1
    return text[m.start():i]


def classify() -> Detection:
    if optional_module(MODULE) is None:
        return Detection.not_applicable("this sglang has no FA3 backend module")
    cls = target_class(CLASS)
    forward_extend = own_function(cls, "forward_extend")
    if forward_extend is None:
        raise TargetMissing(FORWARD)
    text = function_text(forward_extend)
    cascade = _statement(text, "use_cascade_attn")
    if not cascade or SHARED_EXPAND not in text or "local_attn_metadata" not in text:
        return Detection.target_moved(f"target moved: {FORWARD} has no cascade verify over {SHARED_EXPAND} or no "
                                      "local-attention path")
    # The CUDA-graph metadata API changed in 0.5.13 (init_forward_metadata_out_graph).
    graph = ((around(OUT_GRAPH, _out_graph),) if graph_api(cls) == "out_graph"
             else (around(GRAPH_CAPTURE, _capture), around(GRAPH_REPLAY, _replay)))
    plan = (around(EAGER, _eager), around(FORWARD, _chunked_layers_own_tree), around(GRAPH_STATE, _state), *graph)
    if re.search(r"local|irope", cascade):
        return Detection.not_needed("chunked (local) layers leave the topk > 1 cascade verify", *plan)
    return Detection.needed("chunked (local) layers take the topk > 1 cascade verify with the whole prefix and the "
                            "shared tree table, in the full pool's slots", *plan)


class Fa3LocalAttnTreeVerifyFix(Fix):
    name = NAME
    summary = "FA3 chunked (Llama 4 local) layers keep their chunk, in their own pool, in topk > 1 target verify"
    upstream_prs = ()
    wraps = ("fa3_local_attn_verify",)
    check_module = "sglang_swa_plugin.check.fa3_local_attn_tree_verify"
    target_params = {**GRAPH_PARAMS, EAGER: ("self", "forward_batch"),
                     FORWARD: ("self", "q", "k", "v", "layer", "forward_batch")}

    targets = (EAGER, FORWARD, GRAPH_STATE, GRAPH_CAPTURE, GRAPH_REPLAY, OUT_GRAPH)

    def detect(self) -> Detection:
        return classify()


FIX = Fa3LocalAttnTreeVerifyFix()
