"""CPU scenario of ``frozen_kv_views``: a real FROZEN_KV MTP draft step on CPU, inside each
real target-KV view."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

from ..fix import ScenarioUnavailable
from ..hooks.frozen_kv_views import UTILS, VIEW_NAMES
from ..probe import optional_module
from ..trtllm_mha import MODULE as TRTLLM
from . import Outcome
from . import testbed
from .kernels import cpu_kernels


def frozen_kv_draft() -> SimpleNamespace:
    """Real objects of a FROZEN_KV draft step on CPU: the target's ``SWAKVPool`` and SWA
    allocator (6 tokens of one request whose full indices lie beyond the SWA pool), the
    draft's own full-only pool and trtllm_mha backend, a decode ``ForwardBatch``, the
    ``FrozenKVMTPContext`` and a target SWA layer (``RadixAttention``)."""
    from sglang.srt.speculative.frozen_kv_mtp_info import FrozenKVMTPContext

    target_pool = testbed.make_swa_pool()
    allocator = testbed.make_swa_allocator(target_pool)
    testbed.diverge(allocator, target_pool.size_swa + 8)
    req_to_token = testbed.make_req_to_token_pool()
    tokens = testbed.alloc_tokens(allocator, 6)
    rows, lens = testbed.fill_requests(req_to_token, [tokens])
    runner = testbed.make_model_runner(kv_pool=testbed.make_full_pool(), allocator=allocator,
                                       req_to_token_pool=req_to_token, is_draft_worker=True,
                                       spec_algorithm="FROZEN_KV_MTP")
    backend = testbed.build_trtllm_backend(runner)
    batch = testbed.make_forward_batch(runner, "decode", req_pool_indices=rows, seq_lens=lens,
                                       out_cache_loc=tokens[-1:], attn_backend=backend)
    swa_layer = testbed.swa_layer(target_pool, runner)
    return SimpleNamespace(
        target_pool=target_pool, allocator=allocator, runner=runner, backend=backend, batch=batch,
        tokens=tokens, swa_layer=swa_layer,
        kv_context=FrozenKVMTPContext(target_token_to_kv_pool=target_pool,
                                      physical_layer_ids={0: swa_layer.layer_id}))


def view_args(view, d: SimpleNamespace) -> tuple:
    """The arguments of ``view`` for draft ``d`` (0.5.12: 2, 0.5.13+: with the backend)."""
    return (d.batch, d.kv_context, d.backend)[: len(inspect.signature(view).parameters)]


def swa_layer_pages(d: SimpleNamespace) -> list:
    """The page table the draft backend gives its SWA layer (the request's pages), from
    metadata built now: call it inside a view."""
    with cpu_kernels():
        d.backend.init_forward_metadata(d.batch)
    table = d.backend._get_layer_page_table(d.swa_layer, d.batch)
    return table[0, : len(d.tokens[:: d.target_pool.page_size])].tolist()


def expected_swa_pages(d: SimpleNamespace) -> list:
    page = d.target_pool.page_size
    swa = d.target_pool.translate_loc_from_full_to_swa(d.tokens[::page]).long() // page
    assert int(swa.max()) < (d.target_pool.size_swa + page) // page  # inside the SWA pool
    return swa.tolist()


def scenario() -> Outcome:
    """a real FROZEN_KV MTP draft backend (trtllm_mha) inside each real target-KV view: does its SWA
    layer read SWA-space pages inside the SWA pool. ``seen``: per view, whether it does."""
    utils = optional_module(UTILS)
    for name, mod in ((UTILS, utils), (TRTLLM, utils and optional_module(TRTLLM))):
        if mod is None:
            raise ScenarioUnavailable(f"this sglang has no module {name}")
    d = frozen_kv_draft()
    out = {}
    for name in VIEW_NAMES:
        view = getattr(utils, name)
        with view(*view_args(view, d)):
            out[name] = swa_layer_pages(d) == expected_swa_pages(d)
    return Outcome(not all(out.values()), out)


def reproduce() -> bool:
    return scenario().bug
