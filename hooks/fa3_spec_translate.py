"""FA3 EAGLE3 topk > 1: translate both page tables into SWA space before the SWA kernel.

Bug
    ``FlashAttentionBackend._init_sliding_window_attn_spec_metadata`` hands full-pool page
    tables to ``prepare_swa_spec_page_table_triton``; SWA layers then read wrong KV or past
    the SWA pool (issue #24402). Fix: for the duration of the call both tables are translated
    copies (int32), put back after it (the rest of the backend reads the full-pool ones).
Upstream PRs
    #24617 (merged 2026-05-09; 0.5.13 added the int32 casts).
Affected versions
    0.5.10 and 0.5.11; 0.5.12 and later translate before the kernel.
    Status by release: applied 0.5.10-0.5.11; not needed 0.5.12+.
Detection
    The method is run on a stand-in whose pool translates ``x -> x + 1000``, the kernel
    recorded: untranslated tables: needed; translated: not needed; else unknown.
Delete when
    The oldest supported sglang is 0.5.12 or later.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

from .. import graphed, state
from ..fix import Detection, Fix, TargetMissing, argument, around
from ..patching import without_wrappers_of
from ..probe import optional_module, swapped

NAME = "fa3_spec_translate"
MODULE = "sglang.srt.layers.attention.flashattention_backend"
CLASS = "FlashAttentionBackend"
METHOD = "_init_sliding_window_attn_spec_metadata"
KERNEL = "prepare_swa_spec_page_table_triton"
TARGET = f"{MODULE}.{CLASS}.{METHOD}"

_SHIFT = 1000  # the probe's stand-in translation
TABLES = "spec_tables"  # in the backend's state: the CUDA-graph path's translated tables


def _translate_page_tables(original, self, metadata, metadata_expand, *args, **kwargs):
    """Around hook: the kernel reads both tables in SWA space (int32); everyone else keeps
    the full-pool tables."""
    if not getattr(self, "use_sliding_window_kv_pool", False):
        return original(self, metadata, metadata_expand, *args, **kwargs)
    import torch

    full_a, full_b = metadata.page_table, metadata_expand.page_table
    translate = self.token_to_kv_pool.translate_loc_from_full_to_swa
    in_graph = argument(original, "metadata_swa", (metadata, metadata_expand, *args), kwargs) is not None
    try:  # both assignments inside: a failing translation never leaves one table translated
        if in_graph:
            metadata.page_table, metadata_expand.page_table = _graph_translation(self, full_a, full_b, translate)
        else:
            metadata.page_table = translate(full_a).to(torch.int32)
            metadata_expand.page_table = translate(full_b).to(torch.int32)
        return original(self, metadata, metadata_expand, *args, **kwargs)
    finally:
        metadata.page_table, metadata_expand.page_table = full_a, full_b


def _graph_translation(self, full_a, full_b, translate):
    """CUDA-graph replays (static tables): the two translations written into views of two
    int32 tables kept on the backend, replayed as one CUDA graph (``graphed``). The views,
    the work and its inputs are made once per pair of tables (a batch size's) and reused."""
    pool = self.token_to_kv_pool
    mapping = getattr(pool, "full_to_swa_index_mapping", None)
    made_for, ids = (full_a, full_b, pool, mapping), (id(full_a), id(full_b))
    steps = state.of(self).setdefault(STEPS, {})
    step = steps.get(ids)
    if step is None or any(x is not y for x, y in zip(step[0], made_for)):
        if len(steps) >= MAX_STEPS:  # tables that are not a graph's static ones: keep none alive
            steps.clear()
        step = steps[ids] = (made_for, *_graph_step(self, full_a, full_b, translate, mapping))
    graphed.run(self, (NAME, full_a.shape[0], full_b.shape[0]), step[1], step[2])
    return step[3]


STEPS = "fa3_spec_translate.steps"  # in the backend's state: {tables' ids: (what it was made for, work, inputs, views)}
MAX_STEPS = 64  # more pairs of tables than a server's CUDA-graph batch sizes


def _graph_step(self, full_a, full_b, translate, mapping) -> tuple:
    """One pair of tables' work, its graph's inputs and the translated views it writes."""
    old = state.get(self, TABLES, (None, None))
    kept = state.of(self)[TABLES] = (_kept(old[0], full_a), _kept(old[1], full_b))
    a, b = kept[0][: full_a.shape[0]], kept[1][: full_b.shape[0]]

    def both():
        a.copy_(translate(full_a))
        b.copy_(translate(full_b))

    return both, [full_a, full_b, a, b] + ([mapping] if mapping is not None else []), (a, b)


def _kept(old, full):
    """``old`` where it can hold ``full`` (as wide, at least as tall), else an int32 table as
    wide as ``full`` and as tall as the taller of the two."""
    import torch

    same_width = old is not None and old.shape[1:] == full.shape[1:]
    if same_width and old.shape[0] >= full.shape[0]:
        return old
    rows = max(full.shape[0], old.shape[0] if same_width else 0)
    return full.new_empty((rows, *full.shape[1:]), dtype=torch.int32)


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


def classify() -> Detection:
    mod = optional_module(MODULE)
    if mod is None:
        return Detection.not_applicable("this sglang has no FA3 attention backend")
    cls = getattr(mod, CLASS, None)
    if cls is None:
        raise TargetMissing(f"{MODULE}.{CLASS}")
    method = getattr(cls, METHOD, None)
    if method is None:
        raise TargetMissing(TARGET)
    if not hasattr(mod, KERNEL):
        raise TargetMissing(f"{MODULE}.{KERNEL}")
    try:  # judge sglang's code, not our hook
        return _probe(mod, without_wrappers_of(method, NAME))
    except Exception as e:  # noqa: BLE001 - an unexpected shape is "unknown", never a crash
        return Detection.unknown(f"probe of {METHOD} failed: {type(e).__name__}: {e}")


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


class FA3SpecTranslateFix(Fix):
    name = NAME
    summary = "FA3 EAGLE3 topk>1 on SWA models: translate prefix and draft page tables to SWA space before the kernel"
    upstream_prs = ("#24617",)
    targets = (TARGET,)
    target_params = {TARGET: ("self", "metadata", "metadata_expand")}
    check_module = "sglang_swa_plugin.check.fa3_spec_translate"

    def detect(self) -> Detection:
        return classify().with_plan(around(TARGET, _translate_page_tables))



FIX = FA3SpecTranslateFix()
