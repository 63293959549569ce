"""CPU scenario of ``fa3_spec_translate``: EAGLE3 topk > 1 TARGET_VERIFY metadata on a real
FA3 backend over diverged full/SWA pools, with the SWA spec page-table kernel recorded."""

from __future__ import annotations

from types import SimpleNamespace

from ..fix import ScenarioUnavailable
from ..hooks.fa3_spec_translate import KERNEL, MODULE, kernel_inputs
from ..probe import optional_module
from . import Outcome
from . import testbed as tb

# An EAGLE3 tree of 4 draft tokens (topk 2): 0 is the root, 1 and 2 its children, 3 a child
# of 1. Each entry: the draft tokens a token attends to (its ancestors and itself).
TREE = ((0,), (0, 1), (0, 2), (0, 1, 3))


def verify_input(custom_mask, seq_lens, topk, num_draft_tokens, positions=None):
    """A real ``EagleVerifyInput`` carrying the tree mask and the draft tokens' positions
    (zeros unless given; the fields the FA3 metadata paths read); the retrieve tensors are
    placeholders."""
    import dataclasses

    import torch
    from sglang.srt.speculative.eagle_info import EagleVerifyInput
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    n = len(seq_lens) * num_draft_tokens
    values = dict(
        draft_token=torch.zeros(n, dtype=torch.int64),
        custom_mask=custom_mask,
        positions=torch.zeros(n, dtype=torch.int64) if positions is None else positions,
        spec_steps=max(len(t) for t in TREE) - 1,
        topk=topk,
        draft_token_num=num_draft_tokens,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=int(sum(seq_lens)),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
    )
    kwargs = {}
    for f in dataclasses.fields(EagleVerifyInput):
        if f.name in values:
            kwargs[f.name] = values[f.name]
        elif f.name.startswith(("retrive_", "retrieve_")):
            kwargs[f.name] = torch.full((len(seq_lens), num_draft_tokens), -1, dtype=torch.int64)
    return EagleVerifyInput(**kwargs)


def verify_bench(prefix_lens=(5, 3), full_only=30, topk=2, swa_pool=True):
    """A real FA3 backend of a GPT-OSS-like target (layers 0, 2 sliding; 1, 3 full) on a real
    ``SWAKVPool`` (64 full / 32 SWA slots) whose index spaces diverge by ``full_only`` slots,
    EAGLE3 with ``topk`` and the 4-token ``TREE``, and a real TARGET_VERIFY ``ForwardBatch``
    for requests with ``prefix_lens`` tokens. Every full-pool index of the requests lies
    beyond the SWA pool, every SWA index inside it. ``swa_pool=False``: the runner owns a
    full-only pool instead (sharing the SWA allocator), so the backend uses no SWA pool."""
    import torch

    num_draft = len(TREE)
    pool = tb.make_swa_pool(size=64, size_swa=32)
    alloc = tb.make_swa_allocator(pool)
    held = tb.diverge(alloc, full_only)
    req_to_token = tb.make_req_to_token_pool(size=4, max_context_len=64)
    runner = tb.make_model_runner(
        kv_pool=pool if swa_pool else tb.make_full_pool(size=64, layer_num=4),
        allocator=alloc, req_to_token_pool=req_to_token, spec_algorithm="EAGLE3",
        topk=topk, num_steps=max(len(t) for t in TREE) - 1, num_draft_tokens=num_draft,
        attention_backend="fa3",
    )
    backend = tb.build_fa3_backend(runner)
    prefixes = [tb.alloc_tokens(alloc, n) for n in prefix_lens]
    drafts = [tb.alloc_tokens(alloc, num_draft) for _ in prefix_lens]
    rows, _ = tb.fill_requests(req_to_token, [torch.cat(pd) for pd in zip(prefixes, drafts)])
    draft_mask = torch.zeros(num_draft, num_draft, dtype=torch.bool)
    for i, attends in enumerate(TREE):
        draft_mask[i, list(attends)] = True
    custom_mask = torch.cat([
        torch.cat([torch.ones(num_draft, n, dtype=torch.bool), draft_mask], dim=1).flatten()
        for n in prefix_lens
    ])
    batch = tb.make_forward_batch(
        runner, "target_verify", req_pool_indices=rows, seq_lens=list(prefix_lens),
        out_cache_loc=torch.cat(drafts),
        spec_info=verify_input(custom_mask, list(prefix_lens), topk, num_draft),
    )
    return SimpleNamespace(
        pool=pool, allocator=alloc, held=held, runner=runner, backend=backend, batch=batch,
        req_to_token=req_to_token, rows=rows, prefixes=prefixes, drafts=drafts,
        num_draft_tokens=num_draft, swa_slots=lambda full: tb.translate(pool, full),
    )


def verify_run(bench):
    """Build the TARGET_VERIFY metadata on ``bench``'s backend with the SWA spec page-table
    kernel recorded. ``bug_shows``: the kernel did not get each request's prefix and draft
    tokens as SWA slots (int32)."""
    import torch

    mod = optional_module(MODULE)
    seen = kernel_inputs(mod, lambda: bench.backend.init_forward_metadata(bench.batch))
    if seen is None:
        raise ScenarioUnavailable(f"the topk>1 SWA verify path did not call {KERNEL}")
    ok = seen["a"].dtype == torch.int32 and seen["b"].dtype == torch.int32
    for r, (prefix, draft) in enumerate(zip(bench.prefixes, bench.drafts)):
        ok &= torch.equal(seen["a"][r, : len(prefix)].long(), bench.swa_slots(prefix))
        for i, attends in enumerate(TREE):
            row = seen["b"][r * len(TREE) + i, : len(attends)].long()
            ok &= torch.equal(row, bench.swa_slots(draft[list(attends)]))
    return SimpleNamespace(seen=seen, bug_shows=not ok)


def scenario() -> Outcome:
    """EAGLE3 topk=2 TARGET_VERIFY metadata on a real FA3 backend over diverged full/SWA pools: does
    the SWA spec page-table kernel get SWA-space int32 page tables. ``seen``: what the kernel
    received."""
    run = verify_run(verify_bench())
    return Outcome(run.bug_shows, run.seen)


def reproduce() -> bool:
    return scenario().bug
