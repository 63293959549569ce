"""CPU scenario of ``swa_one_chunked_prefill``: one prefill pass of sglang's real ``PrefillAdder`` over
a real hybrid SWA pool (``SWAKVPool``, ``SWATokenToKVPoolAllocator``, the release's SWA radix tree)
whose SWA part is smaller than the two waiting requests' prompts, with chunk budget to spare: the
SWA chunk cap cuts the first request's prefill, and the pass goes on. Right: at most one request of
the pass is cut short, and it is the adder's ``new_chunked_req`` (the one request the scheduler
goes on prefilling); the pass admits every request it can admit whole.
``python -m sglang_swa_plugin.check.swa_one_chunked_prefill`` prints one JSON line."""

from __future__ import annotations

from . import Outcome, print_outcome

FULL, SWA, WINDOW = 1024, 64, 15
PROMPT = 100  # longer than the SWA pool: its prefill must be cut
MAX_NEW = (64, 1)  # the second request reserves less decode room: the cap still lets it in


def tree_cache(allocator, req_to_token_pool):
    """The release's radix tree for a hybrid SWA pool: ``SWARadixCache`` (up to 0.5.20), else the
    unified tree with a full and an SWA component."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    params = dict(disable=False, req_to_token_pool=req_to_token_pool, token_to_kv_pool_allocator=allocator,
                  page_size=1, sliding_window_size=WINDOW)
    try:
        from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache
    except ImportError:
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        return UnifiedRadixCache(CacheInitParams(**params, tree_components=(ComponentType.FULL, ComponentType.SWA)))
    return SWARadixCache(CacheInitParams(**params))


def make_req(rid: str, prompt: list, max_new: int):
    """A real ``Req``; its prompt as the release keeps token ids (an array where ``output_ids`` is one)."""
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid, "", prompt, SamplingParams(max_new_tokens=max_new, temperature=0))
    if isinstance(req.output_ids, array) and not isinstance(req.origin_input_ids, array):
        req = Req(rid, "", array("q", prompt), SamplingParams(max_new_tokens=max_new, temperature=0))
    return req


def extend_end(req) -> int:
    """Where this pass's prefill of ``req`` ends (token count): its fill ids as sglang cut them."""
    get = getattr(req, "get_fill_ids", None)
    return len(get() if get is not None else req.fill_ids)


def one_pass(max_new=MAX_NEW, swa: int = SWA):
    """The adder after offering each request once (as ``Scheduler.get_new_batch_prefill`` does,
    stopping at the first answer that is not CONTINUE); returns (adder, requests, answers)."""
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

    from . import testbed as tb

    tb.make_server_args(tb._tiny_model_dir("gpt_oss"), publish=True)
    pool = tb.make_swa_pool(size=FULL, size_swa=swa, head_num=1, head_dim=4)
    allocator = tb.make_swa_allocator(pool)
    req_to_token = tb.make_req_to_token_pool(size=8, max_context_len=2 * PROMPT)
    tree = tree_cache(allocator, req_to_token)
    adder = tb._call_with_supported(PrefillAdder, page_size=1, tree_cache=tree, token_to_kv_pool_allocator=allocator,
                                    running_batch=None, new_token_ratio=0.5, rem_input_tokens=16384,
                                    rem_chunk_tokens=8192)
    reqs = [make_req(f"r{i}", list(range(10 + i, 10 + i + PROMPT)), n) for i, n in enumerate(max_new)]
    answers = []
    for req in reqs:
        req.init_next_round_input(tree)
        res = tb._call_with_supported(adder.add_one_req, req=req, has_chunked_req=False, truncation_align_size=None)
        answers.append(getattr(res, "name", str(res)))
        if res != AddReqResult.CONTINUE:
            break
    return adder, reqs, answers


def scenario() -> Outcome:
    """One prefill pass of sglang's PrefillAdder over a hybrid SWA pool smaller than two prompts must
    leave at most one request cut short, and that one as the request the scheduler goes on
    prefilling. ``seen``: each request's answer and admitted prefill, the cut ones, new_chunked_req."""
    from sglang_swa_plugin.hooks.swa_one_chunked_prefill import swa_chunk_cap
    from sglang.srt.managers.schedule_policy import PrefillAdder

    adder, reqs, answers = one_pass()
    admitted = [r for r in reqs if r in adder.can_run_list]
    cut = [r.rid for r in admitted if extend_end(r) < len(r.origin_input_ids) + len(r.output_ids)]
    tracked = getattr(adder.new_chunked_req, "rid", None)
    seen = {"swa_chunk_cap": swa_chunk_cap(PrefillAdder), "answers": answers,
            "prefill": {r.rid: f"{extend_end(r)}/{PROMPT}" for r in admitted}, "cut": cut,
            "new_chunked_req": tracked}
    bug = len(cut) > 1 or (bool(cut) and cut != [tracked])
    return Outcome(bug, seen)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
