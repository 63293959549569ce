"""CPU scenario of ``swa_write_loc``: sglang's real eager multi-step draft decode
(``EagleDraftWorker.draft_forward``) of a draft with sliding-window layers (MiMo-V2's MTP), over a
real hybrid SWA pool and allocator, its batch built by the real ``ForwardBatch.init_new`` and each
step run by the real ``ModelRunner._forward_raw`` and ``forward_decode``. The model is a one-layer
stand-in that writes each token's position into the SWA layer's keys through the pool, as the
attention backends do. Right: every draft step's keys land at the SWA locations of that step's
own ``out_cache_loc``.
``python -m sglang_swa_plugin.check.swa_write_loc`` prints one JSON line."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from . import Outcome, print_outcome

BATCH, STEPS, TOPK, VOCAB, HIDDEN = 2, 3, 1, 8, 4
SEQ_LENS = (5, 7)


def _model(pool, layer, seen: list):
    """The draft model: keys and values of token t hold ``position + 1``; each forward appends its
    ``(out_cache_loc, positions)`` to ``seen``; logits favour token 1."""
    import torch

    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    class StepModel(torch.nn.Module):
        def forward(self, input_ids, positions, forward_batch, **_):
            n = input_ids.shape[0]
            kv = (positions.to(torch.float32) + 1).view(n, 1, 1).expand(n, pool.head_num, pool.head_dim)
            seen.append((forward_batch.out_cache_loc.clone(), positions.clone()))
            pool.set_kv_buffer(layer, forward_batch.out_cache_loc, kv.to(pool.dtype), kv.to(pool.dtype))
            logits = torch.zeros(n, VOCAB)
            logits[:, 1] = 1.0
            return LogitsProcessorOutput(next_token_logits=logits, hidden_states=torch.zeros(n, HIDDEN))

    return StepModel()


def build():
    """The draft runner (testbed fields plus what ``_forward_raw`` reads, sglang's own
    ``forward_decode``), the pool, the SWA layer, a draft-decode batch from ``init_new`` and the
    list of each forward's ``(out_cache_loc, positions)``."""
    import torch

    from sglang.srt.managers.schedule_batch import ModelWorkerBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    from . import testbed as tb

    tb.tensor_parallel_of_one()
    pool = tb.make_swa_pool(size=64, size_swa=32, head_num=1, head_dim=4)
    allocator = tb.make_swa_allocator(pool)
    tb.diverge(allocator)  # full and SWA ids differ
    runner = tb.make_model_runner(kv_pool=pool, allocator=allocator, req_to_token_pool=tb.make_req_to_token_pool(),
                                  is_draft_worker=True, spec_algorithm="EAGLE", topk=TOPK, num_steps=STEPS,
                                  attention_backend="triton")
    layer = tb.swa_layer(pool, runner)
    forwards = []
    runner.__dict__.update(model=_model(pool, layer, forwards), graph_runner=None, hisparse_coordinator=None,
                           is_hybrid_swa=True, use_ngram_embedding=False, model_is_mrope=False, support_pp=False,
                           device_timer=None, attn_backend=None)
    runner.forward_decode = ModelRunner.forward_decode.__get__(runner)
    runner.forward = lambda fb, skip_attn_backend_init=False, **_: ModelRunner._forward_raw(
        runner, fb, skip_attn_backend_init, None)

    seq_lens = torch.tensor(SEQ_LENS)
    required = {f.name: None for f in dataclasses.fields(ModelWorkerBatch)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    batch = ModelWorkerBatch(**{**required, **dict(
        forward_mode=ForwardMode.DECODE, input_ids=torch.zeros(BATCH * TOPK, dtype=torch.int64),
        req_pool_indices=torch.arange(BATCH), seq_lens=seq_lens, seq_lens_cpu=seq_lens,
        seq_lens_sum=int(seq_lens.sum()), out_cache_loc=tb.alloc_tokens(allocator, BATCH * TOPK * STEPS),
        return_logprob=False, is_extend_in_batch=False, all_extend_in_batch=False, can_run_dp_cuda_graph=False)})
    batch.spec_algorithm, batch.capture_hidden_mode = runner.spec_algorithm, None
    batch.spec_info = EagleDraftInput(topk_p=torch.ones(BATCH, TOPK), topk_index=torch.ones(BATCH, TOPK, dtype=torch.int64),
                                      hidden_states=torch.zeros(BATCH, HIDDEN))
    batch.reqs = [SimpleNamespace(rid=f"r{i}") for i in range(BATCH)]
    forward_batch = ForwardBatch.init_new(batch, runner)
    forward_batch.positions = seq_lens - 1
    return runner, pool, layer, forward_batch, forwards


def scenario() -> Outcome:
    """sglang's eager multi-step draft decode of a sliding-window draft must write each step's keys
    at the SWA locations of that step's own out_cache_loc. ``seen``: per draft step, its full
    locations, the SWA slots written and the keys found there (or the error)."""
    import torch

    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    from ..fix import ScenarioUnavailable
    from ..hooks.swa_write_loc import FIELD
    from . import testbed as tb

    if FIELD not in ForwardBatch.__dataclass_fields__:  # 0.5.13+: another form
        raise ScenarioUnavailable(f"sglang.srt.model_executor.forward_batch_info.ForwardBatch keeps no {FIELD} "
                                  "(the form this scenario builds)")
    runner, pool, layer, fb, forwards = build()
    worker = SimpleNamespace(hot_token_id=None, topk=TOPK, speculative_num_steps=STEPS,
                             speculative_num_draft_tokens=STEPS + 1, draft_runner=runner,
                             draft_attn_backend=SimpleNamespace(attn_backends=[None] * STEPS))
    keys = pool.get_key_buffer(layer.layer_id)
    try:
        EagleDraftWorker.draft_forward(worker, fb)
    except RuntimeError as e:  # the stale locations' length differs from the step's keys
        return Outcome(True, {"error": f"{type(e).__name__}: {e}"})
    steps = []
    for i, (loc, positions) in enumerate(forwards):  # one forward per draft step but the last
        slots = tb.translate(pool, loc)
        found = keys[slots, 0, 0].float()
        want = positions.float() + 1  # what the step's forward wrote
        steps.append({"step": i, "full": loc.tolist(), "swa_slots": slots.tolist(),
                      "keys": found.tolist(), "want": want.tolist(), "ok": bool(torch.equal(found, want))})
    return Outcome(not all(s["ok"] for s in steps), {"steps": steps})


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
