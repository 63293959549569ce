"""CPU scenario of ``trtllm_swa_pool``: which SWA pool do the real trtllm_mha backends that
sglang builds for a target and its drafts resolve?"""

from __future__ import annotations

from . import Outcome
from . import testbed as tb


def scenario() -> Outcome:
    """real trtllm_mha backends (target, EAGLE draft steps and draft extend, FROZEN_KV draft where
    present) built by sglang over diverged full/SWA pools: does each resolve the SWA pool
    upstream's final rule gives. Real pools whose index spaces diverge, one SWA allocator
    shared by target and drafts, backends built through sglang's own paths (registry for the
    target and a FROZEN_KV draft, ``DraftBackendFactory`` for an EAGLE draft). ``seen``: per
    backend, whether it resolved the pool the final rule gives."""
    swa_pool = tb.make_swa_pool()
    allocator = tb.make_swa_allocator(swa_pool)
    tb.diverge(allocator)
    req_to_token = tb.make_req_to_token_pool()
    target = tb.make_model_runner(kv_pool=swa_pool, allocator=allocator, req_to_token_pool=req_to_token,
                                  spec_algorithm="EAGLE")

    def draft(algo):
        return tb.make_model_runner(kv_pool=tb.make_full_pool(), allocator=allocator, req_to_token_pool=req_to_token,
                                    is_draft_worker=True, spec_algorithm=algo, server_args=target.server_args,
                                    model="llama")

    eagle = tb.build_draft_backends_via_factory(draft("EAGLE"))
    built = {"target": (tb.build_backend_via_registry(target, "trtllm_mha"), swa_pool),
             "eagle_draft_extend": (eagle.draft_extend, None)}
    for i, step in enumerate(b for b in eagle.decode.attn_backends if b is not None):
        built[f"eagle_draft_step{i}"] = (step, None)
    try:
        frozen = draft("FROZEN_KV_MTP")
    except tb.Unavailable:
        pass  # no FROZEN_KV MTP in this sglang
    else:
        built["frozen_kv_draft"] = (tb.build_backend_via_registry(frozen, "trtllm_mha"), swa_pool)
    seen = {name: backend._swa_kv_pool is want for name, (backend, want) in built.items()}
    return Outcome(not all(seen.values()), seen)


def reproduce() -> bool:
    return scenario().bug
