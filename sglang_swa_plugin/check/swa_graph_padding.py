"""CPU scenario of ``swa_graph_padding``: after a padded CUDA-graph replay, do the padded rows
of the real ``DecodeInputBuffers`` still hold an earlier batch's SWA write locations?"""

from __future__ import annotations

from ..fix import ScenarioUnavailable
from . import Outcome
from . import testbed as tb

N = 4  # tokens per request (a verify step of 4 draft tokens)
MAX_BS = 4


def buffers_and_batch():
    """sglang's own ``DecodeInputBuffers`` (hybrid SWA pool) on the CPU, and a function that
    fills them from a real ``ForwardBatch`` of ``bs`` requests padded to ``padded`` rows."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    try:
        from sglang.srt.model_executor import cuda_graph_runner as cgr
    except ImportError as e:
        raise ScenarioUnavailable(f"cannot import sglang.srt.model_executor.cuda_graph_runner: {e}") from e

    cls = getattr(cgr, "DecodeInputBuffers", None)
    if cls is None or not hasattr(cls, "create"):
        raise ScenarioUnavailable(f"{cgr.__name__} has no DecodeInputBuffers.create")
    buffers = tb._call_with_supported(
        cls.create, device=torch.device("cpu"), max_bs=MAX_BS, max_num_token=MAX_BS * N, hidden_size=8,
        vocab_size=16, dtype=torch.float32, dp_size=1, pp_size=1, is_encoder_decoder=False,
        require_mlp_tp_gather=False, seq_len_fill_value=1, encoder_len_fill_value=0, num_tokens_per_bs=N,
        cache_loc_dtype=torch.int64, enable_mamba_track=False, is_hybrid_swa=True)
    if getattr(buffers, "out_cache_loc_swa", None) is None:
        raise ScenarioUnavailable(f"{cgr.__name__}.DecodeInputBuffers carries no SWA write locations (out_cache_loc_swa)")

    def fill(bs, padded, first_slot):
        loc = torch.arange(first_slot, first_slot + bs * N, dtype=torch.int64)
        batch = ForwardBatch(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs,
                             input_ids=torch.zeros(bs * N, dtype=torch.int64), req_pool_indices=torch.arange(bs),
                             seq_lens=torch.full((bs,), 50, dtype=torch.int32), out_cache_loc=loc,
                             seq_lens_sum=50 * bs)
        batch.out_cache_loc_swa = loc + 1000  # the SWA slots of those tokens
        batch.positions = torch.zeros(bs * N, dtype=torch.int64)
        batch.seq_lens_cpu = torch.full((bs,), 50)
        batch.num_token_non_padded = torch.tensor([bs * N], dtype=torch.int32)
        tb._call_with_supported(
            buffers.populate_from_forward_batch, forward_batch=batch, raw_bs=bs, raw_num_token=bs * N, bs=padded,
            seq_len_fill_value=1, require_gathered_buffer=False, num_tokens_per_bs=N, nsa_enable_prefill_cp=False,
            enable_num_token_non_padded_flag=False)

    return buffers, fill


def scenario() -> Outcome:
    """sglang's own CUDA-graph input buffers (hybrid SWA pool): after a padded replay, do the padded rows still hold an earlier batch's SWA write locations?

    A replay of 4 requests, then one of 3 requests padded to 4: the padded rows' SWA write
    locations must be the padding slot 0, not the first batch's last request's SWA slots (a
    live request's KV, which the captured graph then overwrites). ``seen``: the padded rows'
    SWA write locations."""
    buffers, fill = buffers_and_batch()
    fill(MAX_BS, MAX_BS, 10)
    fill(MAX_BS - 1, MAX_BS, 40)
    tail = buffers.out_cache_loc_swa[(MAX_BS - 1) * N:MAX_BS * N].tolist()
    return Outcome(any(tail), {"padded_rows_swa_locs": tail})


def reproduce() -> bool:
    return scenario().bug
