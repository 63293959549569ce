"""A name a fix hooks or reads that is gone from the installed sglang is "target moved" (status
skipped, one warning naming it), never a healthy "not applicable"/"not needed": each case
deletes the name from the real release in this process and runs the fix's detection. A fix
is "not applicable" only where the feature itself is absent (decided from a module or field
that predates the fix's names), so where this release lacks the name the fix must already
be not applicable here."""

from __future__ import annotations

import ast
import copy
import importlib
import pkgutil

import pytest

from sglang_swa_plugin.core import safe_detect
from sglang_swa_plugin.fix import Verdict

TRITON = "sglang.srt.layers.attention.triton_backend"
TRTLLM = "sglang.srt.layers.attention.trtllm_mha_backend"
FA3 = "sglang.srt.layers.attention.flashattention_backend"
FLASHINFER = "sglang.srt.layers.attention.flashinfer_backend"

# (fix, the dotted name deleted from sglang)
CASES = [
    ("swa_graph_padding", "sglang.srt.model_executor.cuda_graph_runner.DecodeInputBuffers.populate_from_forward_batch"),
    ("swa_graph_padding", "sglang.srt.model_executor.cuda_graph_runner.DecodeInputBuffers"),
    ("flashinfer_swa_prefill", f"{FLASHINFER}.FlashInferAttnBackend"),
    ("flashinfer_swa_verify", "sglang.srt.speculative.eagle_info.EagleVerifyInput"),
    ("mle_hidden_pool", "sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker"),
    ("one_pool_draft_extend", "sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner."
                              "MultiLayerEagleDraftExtendCudaGraphRunner"),
    ("triton_local_attn", f"{TRITON}.TritonAttnBackend"),
    ("triton_one_pool_window", f"{TRITON}.TritonAttnBackend"),
    ("triton_swa_draft", f"{TRITON}.TritonAttnBackend"),
    ("triton_swa_window", f"{TRITON}.update_sliding_window_buffer"),
    ("trtllm_local_attn", f"{TRTLLM}.TRTLLMHAAttnBackend"),
    ("trtllm_swa_pool", f"{TRTLLM}.TRTLLMHAAttnBackend"),
    ("trtllm_extend_routing", f"{TRTLLM}.TRTLLMHAAttnBackend"),
    ("trtllm_xqa_spec_decode", f"{TRTLLM}.TRTLLMHAAttnBackend"),
    ("trtllm_xqa_dense_query", f"{TRTLLM}.TRTLLMHAAttnBackend"),
    ("frozen_kv_views", f"{TRTLLM}.TRTLLMHAAttnBackend"),
    ("fa3_spec_translate", f"{FA3}.FlashAttentionBackend"),
    ("fa3_local_attn_pages", f"{FA3}.FlashAttentionBackend"),
    ("fa3_local_attn_verify", f"{FA3}.FlashAttentionBackend"),
    ("fa3_local_attn_tree_verify", f"{FA3}.FlashAttentionBackend"),
]


def _hook(fix: str):
    return importlib.import_module(f"sglang_swa_plugin.hooks.{fix}")


def _owner(dotted: str):
    """(owner, attribute) of ``dotted``, or None where this sglang has no such name."""
    owner_path, _, attr = dotted.rpartition(".")
    try:
        owner = pkgutil.resolve_name(owner_path)
    except (ImportError, AttributeError):
        return None
    return (owner, attr) if attr in vars(owner) else None


def _judge(fix, before, after, name: str) -> None:
    """Deleting ``name`` gives "target moved" naming it; only a detection that decides without
    the name (the feature absent, or the bug impossible on this release) may stay as it was."""
    if after.verdict == Verdict.TARGET_MOVED:
        assert name.rsplit(".", 1)[-1] in after.reason, (fix, after)
        return
    assert before.verdict in (Verdict.NOT_APPLICABLE, Verdict.NOT_NEEDED) and after == before, \
        f"{fix} with {name} deleted: {after.verdict.value} ({after.reason}); before: {before.verdict.value}"


@pytest.mark.parametrize("fix,name", CASES, ids=[f"{f}-{n.rsplit('.', 1)[1]}" for f, n in CASES])
def test_a_deleted_name_is_target_moved(fix, name, monkeypatch):
    fix_obj = _hook(fix).FIX
    before = safe_detect(fix_obj)
    found = _owner(name)
    if found is None:  # this release lacks the name: only where the feature is absent
        assert before.verdict == Verdict.NOT_APPLICABLE, (fix, name, before)
        return
    monkeypatch.delattr(*found)
    _judge(fix, before, safe_detect(fix_obj), name)


def test_gemma4_attention_gone_from_its_module_is_target_moved(monkeypatch):
    """gemma4_window reads the model module's syntax tree (it imports CUDA-only code)."""
    hook = _hook("gemma4_window")
    before = safe_detect(hook.FIX)
    tree = hook.module_tree(hook.MODULE)
    if tree is None:  # no Gemma 4 in this sglang
        assert before.verdict == Verdict.NOT_APPLICABLE, before
        return
    renamed = copy.deepcopy(tree)
    for node in renamed.body:
        if isinstance(node, ast.ClassDef) and node.name == hook.CLASS:
            node.name += "Renamed"
    original = hook.module_tree
    monkeypatch.setattr(hook, "module_tree", lambda name: renamed if name == hook.MODULE else original(name))
    _judge("gemma4_window", before, safe_detect(hook.FIX), hook.TARGET)


def test_a_renamed_ragged_prefill_wrapper_is_target_moved(monkeypatch):
    """flashinfer_swa_prefill finds the ragged wrapper sglang builds by its name: the backend
    building none under that name is a rename (every flashinfer backend builds one)."""
    hook = _hook("flashinfer_swa_prefill")
    before = safe_detect(hook.FIX)
    if before.verdict == Verdict.NOT_APPLICABLE:
        return  # no flashinfer backend in this sglang
    monkeypatch.setattr(hook, "WRAPPER", hook.WRAPPER + "Renamed")
    _judge("flashinfer_swa_prefill", before, safe_detect(hook.FIX), hook.WRAPPER)


def test_optional_class_tells_an_absent_feature_from_a_moved_class():
    """probe.optional_class: None where the module is absent (not applicable), TargetMissing
    naming the class where its module is there without it, else the class."""
    from sglang_swa_plugin.fix import TargetMissing
    from sglang_swa_plugin.probe import optional_class

    assert optional_class(f"{TRITON}.TritonAttnBackend") is importlib.import_module(TRITON).TritonAttnBackend
    assert optional_class("sglang.srt.layers.attention.no_such_backend.TritonAttnBackend") is None
    with pytest.raises(TargetMissing, match="NoSuchClass"):
        optional_class(f"{TRITON}.NoSuchClass")
