"""CPU scenario of ``swa_write_loc``: a multi-step draft decode of a draft with sliding-window layers
(MiMo-V2's MTP) over a real hybrid SWA pool and allocator whose full and SWA ids differ. Right:
every draft step writes its sliding layer's keys at the SWA locations of that step's own slice of
the batch's ``out_cache_loc`` (sglang's ``per_step_draft_out_cache_loc`` layout).
0.5.10-0.5.12 (the batch keeps the SWA locations): sglang's real ``EagleDraftWorker.draft_forward``,
its batch from the real ``ForwardBatch.init_new``, each step through the real
``ModelRunner._forward_raw`` and ``forward_decode``; the model is a one-layer stand-in that writes
each token's position into the SWA keys through the pool.
0.5.13+ (the backends' metadata keep them): fa3's real ``FlashAttentionMultiStepBackend`` metadata,
eager, at CUDA-graph capture of more rows than its SWA write buffer and at a padded replay (the
step's SWA write locations it holds); triton's real ``TritonMultiStepDraftBackend``, eager and at
capture, each step's real ``forward_decode`` writing marker keys through the pool (its kernel
recorded, sglang's Triton index kernels as their torch twins, ``triton_swa_draft`` installed where
needed for the window rails, as on a server).
``python -m sglang_swa_plugin.check.swa_write_loc`` prints one JSON line."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from . import Outcome, print_outcome

BATCH, STEPS, TOPK, VOCAB, HIDDEN = 2, 3, 1, 8, 4
REQUESTS, GRAPH_TOKENS = 3, 4  # the metadata form's batch, and its CUDA-graph buffers' rows (fewer than 3 steps' ids)
SEQ_LENS = (5, 7)
DRAFT_SEQ_LENS = (10, 12, 14)  # the metadata form's requests (each before its draft tokens)


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


def batch_form() -> Outcome:
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
        raise ScenarioUnavailable(f"sglang.srt.model_executor.forward_batch_info.ForwardBatch keeps no {FIELD}")
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


def _step_slots(pool, whole, bs, num_steps=STEPS):
    """Each written step's full locations (sglang's own layout of the draft's batch) and their SWA slots."""
    from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc

    from . import testbed as tb

    steps = per_step_draft_out_cache_loc(whole, bs, TOPK, num_steps)
    return [(steps[i], tb.translate(pool, steps[i])) for i in range(num_steps - 1)]


def fa3_env():
    """A real ``FlashAttentionMultiStepBackend`` (topk 1, 3 steps) of a draft runner over a hybrid SWA
    pool whose full and SWA ids differ, three requests of 20 tokens: (fa3 module, pool, allocator,
    runner, request rows, the multi-step backend)."""
    import importlib

    from . import testbed as tb

    fa = importlib.import_module("sglang.srt.layers.attention.flashattention_backend")
    tb.tensor_parallel_of_one()
    pool = tb.make_swa_pool(size=256, size_swa=128)
    allocator = tb.make_swa_allocator(pool)
    tb.diverge(allocator, 11)
    rtt = tb.make_req_to_token_pool(size=8, max_context_len=64)
    runner = tb.make_model_runner(kv_pool=pool, allocator=allocator, req_to_token_pool=rtt, is_draft_worker=True,
                                  spec_algorithm="EAGLE", topk=TOPK, num_steps=STEPS, attention_backend="fa3")
    rows, _ = tb.fill_requests(rtt, [tb.alloc_tokens(allocator, 20) for _ in range(3)])
    with tb._single_rank_parallel():
        multi = fa.FlashAttentionMultiStepBackend(runner, TOPK, STEPS)
    return fa, pool, allocator, runner, rows, multi


def fa3_form() -> dict:
    """fa3's multi-step draft metadata: each step's SWA write locations, eager (3 requests), at
    capture of 3 requests on buffers of 4 rows and at a replay of 2 requests padded to 3."""
    from ..probe import swapped
    from . import testbed as tb

    fa, pool, allocator, runner, rows, multi = fa3_env()
    out = {}
    for phase, requests in (("eager", REQUESTS), ("capture", REQUESTS), ("replay", REQUESTS - 1)):
        if phase == "capture":
            multi.init_cuda_graph_state(GRAPH_TOKENS, GRAPH_TOKENS)
        whole = tb.alloc_tokens(allocator, requests * TOPK * STEPS)
        fb = tb.make_forward_batch(runner, "draft_decode", req_pool_indices=rows, seq_lens=list(DRAFT_SEQ_LENS),
                                   out_cache_loc=whole, attn_backend=multi)  # the replay's batch padded to 3
        try:
            if phase == "eager":
                multi.init_forward_metadata(fb)
            else:  # the graph metadata's Triton kernel (page tables, lengths: not judged here) stood in for by a no-op
                with swapped(fa, "normal_decode_set_metadata", lambda *a, **k: None):
                    multi.init_forward_metadata_out_graph(fb, **({"in_capture": True} if phase == "capture" else {}))
        except RuntimeError as e:  # the whole batch's locations copied into a step's buffer
            out[phase] = {"right": False, "error": f"{type(e).__name__}: {e}"[:200]}
            continue
        steps = []
        for (_, slots), be in zip(_step_slots(pool, whole, requests), multi.attn_backends):
            held = be.forward_metadata.swa_out_cache_loc
            steps.append({"held": held.tolist(), "want": slots.tolist(),
                          "right": held[:requests].tolist() == slots.tolist() and not held[requests:].any().item()})
        out[phase] = {"right": all(x["right"] for x in steps), "steps": steps}
    return out


def triton_form() -> dict:
    """triton's multi-step draft decode: each step's ``forward_decode`` of the sliding layer writes
    marker keys (step + 1); where they land, eager and at capture of 3 requests on buffers of 4 rows."""
    import contextlib

    from ..core import temporarily_installed
    from ..fix import Verdict
    from ..hooks import triton_swa_draft
    from .triton_bench import NUM_STEPS, build, cpu_triton, make_backend

    env = build()
    torch, layer, pool = env.torch, env.swa_layer, env.pool
    keys = pool.get_key_buffer(layer.layer_id)
    out = {}
    with contextlib.ExitStack() as stack:
        if triton_swa_draft.FIX.detect().verdict is Verdict.NEEDED:  # the window rails, as on a server
            stack.enter_context(temporarily_installed(triton_swa_draft.FIX))
        for phase in ("eager", "capture"):
            multi, calls = make_backend(env.runner, "TritonMultiStepDraftBackend", TOPK, NUM_STEPS), []
            for be in multi.attn_backends:
                stack.enter_context(cpu_triton(be, calls))
            fb = env.tb.make_forward_batch(env.runner, "draft_decode", req_pool_indices=env.rows,
                                           seq_lens=list(DRAFT_SEQ_LENS), attn_backend=multi)
            fb.positions = fb.seq_lens.clone()  # the draft tokens' positions, as sglang's draft decode has them
            whole = env.tb.alloc_tokens(env.runner.token_to_kv_pool_allocator, fb.batch_size * TOPK * NUM_STEPS)
            fb.out_cache_loc = whole
            if phase == "eager":
                multi.init_forward_metadata(fb)
            else:
                multi.init_cuda_graph_state(GRAPH_TOKENS, GRAPH_TOKENS)
                multi.init_forward_metadata_out_graph(fb, in_capture=True)
            steps = []
            for i, ((loc, slots), be) in enumerate(zip(_step_slots(pool, whole, fb.batch_size, NUM_STEPS),
                                                       multi.attn_backends)):
                fb.out_cache_loc = loc
                rows = fb.batch_size
                q = torch.zeros(rows, layer.tp_q_head_num * layer.qk_head_dim)
                kv = torch.full((rows, layer.tp_k_head_num, layer.qk_head_dim), float(i + 1), dtype=keys.dtype)
                keys.zero_()
                try:
                    be.forward_decode(q, kv, kv.clone(), layer, fb)
                except (AssertionError, RuntimeError) as e:  # no SWA locations / another length
                    steps.append({"step": i, "right": False, "error": f"{type(e).__name__}: {e}"[:200]})
                    continue
                found = keys[slots, 0, 0].float()
                steps.append({"step": i, "slots": slots.tolist(), "keys": found.tolist(),
                              "right": bool((found == i + 1).all())})
            out[phase] = {"right": all(x["right"] for x in steps), "steps": steps}
    return out


def metadata_form() -> Outcome:
    """0.5.13+: the fa3 and triton multi-step draft backends of this sglang that take their SWA write
    locations from the whole batch (the form the fix reads; upstream's per-step forms use their own
    batch layout at replay)."""
    from ..fix import ScenarioUnavailable
    from ..hooks.swa_write_loc import BACKENDS, _writes_metadata_locations

    forms = {"flashattention_backend": fa3_form, "triton_backend": triton_form}
    seen = {m.split("_")[0]: forms[m]() for m in BACKENDS if _writes_metadata_locations(m)}
    if not seen:
        raise ScenarioUnavailable("no draft step of sglang.srt.layers.attention.flashattention_backend or "
                                  "triton_backend takes its SWA write locations from the whole batch here")
    return Outcome(not all(phase["right"] for backend in seen.values() for phase in backend.values()), seen)


def scenario() -> Outcome:
    """sglang's multi-step draft decode of a sliding-window draft must write each step's keys at the
    SWA locations of that step's own out_cache_loc: the batch's form (0.5.10-0.5.12) or the
    metadata's (0.5.13+)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from ..hooks.swa_write_loc import FIELD

    return batch_form() if FIELD in ForwardBatch.__dataclass_fields__ else metadata_form()


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
