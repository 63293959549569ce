"""FA3 EAGLE3 topk > 1: translate both page tables into SWA space before the SWA kernel.

Bug
    ``FlashAttentionBackend._init_sliding_window_attn_spec_metadata`` (target verify with
    EAGLE3 tree decoding, topk > 1, on hybrid SWA models such as GPT-OSS) passes
    ``metadata.page_table`` (each request's prefix) and ``metadata_expand.page_table`` (the
    draft tokens) straight into ``prepare_swa_spec_page_table_triton``. Both hold full-pool
    indices read from ``req_to_token_pool``; the SWA layers then index the SWA pool with the
    resulting ``swa_spec_metadata.page_table``: wrong KV, or a CUDA illegal memory access
    once a full index exceeds the (smaller) SWA pool (issue #24402).
    The fix translates both tables with ``token_to_kv_pool.translate_loc_from_full_to_swa``
    and casts them to int32 before the kernel runs, only when the backend uses a SWA pool.
    The plugin does the same around the method: for the duration of the call the two
    metadata objects carry translated copies, and the full-pool tables are put back
    afterwards, because the rest of the backend (full-attention layers, cascade attention,
    ``swa_page_table``) keeps using them. No global state is swapped. Cost: two gathers
    per call on the topk > 1 SWA path, as upstream's own fix; nothing elsewhere.

Upstream PRs
    #24617 "fix(fa3): translate page table to SWA loc in EAGLE3 topk>1 spec metadata"
    (merged 2026-05-09; 0.5.13 added the ``.to(torch.int32)`` casts).

Affected versions
    sglang 0.5.10 and 0.5.11. 0.5.12 and later translate before the kernel.

Detection
    Behavioural: the installed method is run unbound on a stand-in ``self`` whose pool
    translates ``x -> x + 1000``, with the module's ``prepare_swa_spec_page_table_triton``
    replaced by a recorder for the duration of the probe. Untranslated tables reach the
    recorder: needed. Translated ones: already fixed upstream, nothing is installed.
    No FA3 backend module: not applicable. Anything else: unknown.

Delete when
    The oldest supported sglang is 0.5.12 or later.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any, Optional

from ..fix import Detection, Fix, ScenarioUnavailable, TargetMissing, hookimpl
from ..patching import MARK, target_marked_by
from ..probe import optional_module, swapped

MODULE = "sglang.srt.layers.attention.flashattention_backend"
CLASS = "FlashAttentionBackend"
METHOD = "_init_sliding_window_attn_spec_metadata"
KERNEL = "prepare_swa_spec_page_table_triton"
TARGET = f"{MODULE}.{CLASS}.{METHOD}"

_SHIFT = 1000  # the probe's stand-in translation


def _translate_page_tables(original, self, metadata, metadata_expand, *args, **kwargs):
    """Around hook: the kernel reads both tables in SWA space (int32); everyone else keeps
    the full-pool tables."""
    if not getattr(self, "use_sliding_window_kv_pool", False):
        return original(self, metadata, metadata_expand, *args, **kwargs)
    import torch

    full_a, full_b = metadata.page_table, metadata_expand.page_table
    translate = self.token_to_kv_pool.translate_loc_from_full_to_swa
    try:  # both assignments inside: a failing translation never leaves one table translated
        metadata.page_table = translate(full_a).to(torch.int32)
        metadata_expand.page_table = translate(full_b).to(torch.int32)
        return original(self, metadata, metadata_expand, *args, **kwargs)
    finally:
        metadata.page_table, metadata_expand.page_table = full_a, full_b


def _is_our_wrapper(fn: Any, fix_name: str) -> bool:
    """``fn`` is the wrapper our hook was installed as (directly or by HookRegistry)."""
    cells = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:
            pass
    return hasattr(fn, "__wrapped__") and any(getattr(x, MARK, None) == fix_name for x in [fn, *cells])


def kernel_inputs(mod: Any, call) -> Optional[dict]:
    """Run ``call()`` with the module's SWA spec page-table kernel replaced by a recorder;
    return what the kernel received (dst, a, b, seq_len_a, seq_len_b, draft tokens), or
    None when it was not called. Shared by detection, ``check`` and the tests."""
    seen = {}

    def recorder(dst, a, b, seq_len_a, seq_len_b, num_draft_tokens):
        seen.update(dst=dst, a=a.clone(), b=b.clone(), seq_len_a=seq_len_a.clone(),
                    seq_len_b=seq_len_b.clone(), num_draft_tokens=num_draft_tokens)

    with swapped(mod, KERNEL, recorder):
        call()
    return seen or None


def _probe(mod: Any, method: Any) -> Detection:
    import torch

    i32 = dict(dtype=torch.int32)
    meta, expand = mod.FlashAttentionMetadata(), mod.FlashAttentionMetadata()
    meta.page_table = torch.tensor([[1, 2, 3]], **i32)
    meta.cache_seqlens_int32 = torch.tensor([3], **i32)
    meta.max_seq_len_k = 3
    meta.cu_seqlens_q = torch.tensor([0, 2], **i32)
    expand.page_table = torch.tensor([[4, 5], [4, 6]], **i32)
    expand.cache_seqlens_int32 = torch.tensor([1, 2], **i32)
    expand.cu_seqlens_q = torch.tensor([0, 1, 2], **i32)
    stand_in = SimpleNamespace(
        page_size=1,
        use_sliding_window_kv_pool=True,
        speculative_num_draft_tokens=2,
        token_to_kv_pool=SimpleNamespace(translate_loc_from_full_to_swa=lambda x: x + _SHIFT),
    )
    a0, b0 = meta.page_table.clone(), expand.page_table.clone()
    seen = kernel_inputs(mod, lambda: method(stand_in, meta, expand))
    if seen is None:
        return Detection.unknown(f"{METHOD} did not call {KERNEL}")
    if torch.equal(seen["a"], a0 + _SHIFT) and torch.equal(seen["b"], b0 + _SHIFT):
        return Detection.not_needed("already fixed upstream: both page tables are translated to SWA space before the kernel")
    if torch.equal(seen["a"], a0) and torch.equal(seen["b"], b0):
        return Detection.needed(f"{METHOD} passes full-pool page tables to {KERNEL} on a SWA pool")
    return Detection.unknown(f"{METHOD} hands {KERNEL} page tables that are neither the full-pool nor the translated ones")


# ---------------------------------------------------------------- CPU scenario (check, tests)

# An EAGLE3 tree of 4 draft tokens (topk 2): 0 is the root, 1 and 2 its children, 3 a child
# of 1. Each entry: the draft tokens a token attends to (its ancestors and itself).
TREE = ((0,), (0, 1), (0, 2), (0, 1, 3))


def _verify_input(custom_mask, seq_lens, topk, num_draft_tokens):
    """A real ``EagleVerifyInput`` carrying the tree mask (the only field the FA3 metadata
    path reads); the retrieve tensors are placeholders."""
    import dataclasses

    import torch
    from sglang.srt.speculative.eagle_info import EagleVerifyInput
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    n = len(seq_lens) * num_draft_tokens
    values = dict(
        draft_token=torch.zeros(n, dtype=torch.int64),
        custom_mask=custom_mask,
        positions=torch.zeros(n, dtype=torch.int64),
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

    from .. import testbed as tb

    num_draft = len(TREE)
    try:
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
            spec_info=_verify_input(custom_mask, list(prefix_lens), topk, num_draft),
        )
    except tb.Unavailable as e:
        raise ScenarioUnavailable(str(e)) from None
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

    mod = importlib.import_module(MODULE)
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


class FA3SpecTranslateFix(Fix):
    name = "fa3_spec_translate"
    summary = "FA3 EAGLE3 topk>1 on SWA models: translate prefix and draft page tables to SWA space before the kernel"
    upstream_prs = ("#24617",)
    targets = (TARGET,)
    target_params = {TARGET: ("self", "metadata", "metadata_expand")}
    scenario_summary = ("EAGLE3 topk=2 TARGET_VERIFY metadata on a real FA3 backend over diverged full/SWA pools: "
                        "does the SWA spec page-table kernel get SWA-space int32 page tables")

    def detect(self) -> Detection:
        mod = optional_module(MODULE)
        if mod is None:
            return Detection.not_applicable("this sglang has no FA3 attention backend")
        cls = getattr(mod, CLASS, None)
        if cls is None:
            raise TargetMissing(f"{MODULE}.{CLASS}")
        method = getattr(cls, METHOD, None)
        if method is None:
            raise TargetMissing(TARGET)
        while _is_our_wrapper(method, self.name):  # judge sglang's code, not our hook
            method = method.__wrapped__
        if not hasattr(mod, KERNEL):
            raise TargetMissing(f"{MODULE}.{KERNEL}")
        try:
            return _probe(mod, method)
        except Exception as e:  # noqa: BLE001 - an unexpected shape is "unknown", never a crash
            return Detection.unknown(f"probe of {METHOD} failed: {type(e).__name__}: {e}")

    def install(self, hooks) -> None:
        if target_marked_by(TARGET) == self.name:
            return  # already in effect here (a second wrapper would translate twice)
        hooks.around(TARGET, _translate_page_tables)

    def reproduce(self) -> bool:
        return verify_run(verify_bench()).bug_shows


FIX = FA3SpecTranslateFix()


@hookimpl
def sglang_swa_plugin_fixes():
    return [FIX]
