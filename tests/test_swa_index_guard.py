"""swa_index_guard: with SGLANG_SWA_PLUGIN_GUARD=1, every index a sliding-window layer hands
to its attention kernel is checked against the KV buffer that kernel reads, and an
index-space mix-up becomes an error naming backend, forward mode, layer and pool size.

Real ``SWAKVPool``/allocator whose full and SWA index spaces diverge (the request's full
indices 41..46 lie beyond the 17-slot SWA pool, its SWA slots 1..6 inside), real
``TRTLLMHAAttnBackend`` / ``FlashAttentionBackend`` built on CPU, real ``ForwardBatch`` and
metadata objects. The fa3 attention kernel (and the Triton kernel of the topk>1 SWA page
table) cannot run on a CPU: they are replaced by a recorder (and a pure-torch equivalent).
On CPU the guard's ``torch._assert_async`` raises RuntimeError at once.

The guard is installed around each test as the plugin would install it when asked for;
``SGLANG_SWA_PLUGIN=0 pytest tests/test_swa_index_guard.py`` runs the same tests without it:
every test expecting the named error then fails (the out-of-range indices reach the kernel
unnoticed)."""

from __future__ import annotations

import contextlib
import importlib

import pytest
import torch

# On sglang without a plugin framework the start-up hook installs the plugin when the model
# runner module is imported, as in a server process: make that happen before anything else.
import sglang.srt.model_executor.model_runner  # noqa: F401

from helpers import HAS_PLUGIN_FRAMEWORK, child_json, run_child, sglang_release, without_fix

from sglang_swa_plugin import config
from sglang_swa_plugin.core import APPLIED, DISABLED, PROBLEMS, decide, load_fixes, temporarily_installed
from sglang_swa_plugin.fix import ScenarioUnavailable, Verdict
from sglang_swa_plugin.hooks import fa3_spec_translate
from sglang_swa_plugin.hooks import swa_index_guard as guard
from sglang_swa_plugin.check import fa3_spec_translate as fa3_check
from sglang_swa_plugin.check import swa_index_guard as guard_check
from sglang_swa_plugin.patching import DirectHooks, target_marked_by
from sglang_swa_plugin.probe import swapped

FIX = guard.FIX
FA3 = importlib.import_module(guard.FA3_MODULE)
FA3_FORM = guard.fa3_kernel_form(FA3.FlashAttentionBackend)
TRT = importlib.import_module(guard.TRT_MODULE)
SGLANG = sglang_release()
CACHE_LOC_TAKES_BATCH = "forward_batch" in guard.normalized_source(TRT.TRTLLMHAAttnBackend._get_layer_cache_loc)
# The fa3 kernel itself is hooked where forward_extend calls the module global.
ALL_TARGETS = tuple(t for t in FIX.targets if t != guard.FA3_KERNEL or FA3_FORM == "module")
SWA_POOL_PAGES = 17  # 16 SWA slots + the padding slot, page_size 1
# On 0.5.10 with SGLANG_SWA_PLUGIN_GUARD=1 the start-up hook installed the guard for good.
GUARD_IN_PROCESS = target_marked_by(FIX.targets[0]) == FIX.name
needs_clean_process = pytest.mark.skipif(GUARD_IN_PROCESS, reason="the start-up hook installed the guard in this process")


def _plugin_enabled() -> bool:
    cfg = config.parse()
    return cfg.enabled and cfg.selected(FIX.name)


@contextlib.contextmanager
def guarded(*other_fixes):
    """The guard (and ``other_fixes``) installed for the block, as the plugin installs it
    when SGLANG_SWA_PLUGIN_GUARD=1 (unless SGLANG_SWA_PLUGIN / _FIXES turn it off)."""
    fixes = ((FIX,) if _plugin_enabled() and not GUARD_IN_PROCESS else ()) + other_fixes
    with temporarily_installed(*fixes):
        yield


def named_error(backend, mode, layer_id, size, unit="pages"):
    pattern = (rf"swa_index_guard: {backend} {mode} SWA layer {layer_id}: .*index outside the KV pool "
               rf"this layer reads \({size} {unit}\)")
    return pytest.raises(RuntimeError, match=pattern)


@contextlib.contextmanager
def checks():
    """Records the message of every check the guard runs in the block."""
    seen = []
    real = guard.check_indices

    def spy(indices, limit, msg, *args, **kwargs):
        seen.append(msg)
        return real(indices, limit, msg, *args, **kwargs)

    with swapped(guard, "check_indices", spy):
        yield seen


@contextlib.contextmanager
def fa3_kernel_recorded(backend):
    """The fa3 attention kernel replaced by a recorder (under the guard when it is installed
    inside this block). Yields the list of the kernel's keyword arguments per call."""
    seen = []

    def kernel(*args, **kwargs):
        seen.append(kwargs)
        return torch.zeros(kwargs["q"].shape)

    owner = FA3 if FA3_FORM == "module" else backend
    with swapped(owner, guard.FA3_KERNEL_NAME, kernel), swapped(backend, "_get_scheduler_metadata", None):
        yield seen


def fa3_decode(bench, layer):
    q = torch.zeros(1, 4 * 8)
    kv = torch.zeros(1, 2 * 8)
    return bench.backend.forward_decode(q, kv, kv, layer, bench.batch, save_kv_cache=False)


# ------------------------------------------------------------------------ opt-in


def test_detection_names_both_guarded_backends():
    det = FIX.detect()
    assert det.verdict is Verdict.NEEDED, det
    assert "guard requested" in det.reason and "fa3" in det.reason and "trtllm_mha" in det.reason


@needs_clean_process
def test_guard_off_wraps_nothing():
    asked = []
    rec = decide(FIX, "builtin", config.parse({}), lambda name: asked.append(name) or DirectHooks(name))
    assert rec.status == DISABLED and "SGLANG_SWA_PLUGIN_GUARD is off" in rec.reason, rec
    assert asked == [] and rec.installed_targets == []
    for target in ALL_TARGETS:
        assert target_marked_by(target) != FIX.name, target


@needs_clean_process
def test_guard_on_wraps_every_guarded_place_and_undoes():
    made = []
    rec = decide(FIX, "builtin", config.parse({"SGLANG_SWA_PLUGIN_GUARD": "1"}),
                 lambda name: made.append(DirectHooks(name)) or made[-1])
    try:
        assert rec.status == APPLIED, rec
        assert sorted(rec.installed_targets) == sorted(ALL_TARGETS)
        assert rec.in_effect()
    finally:
        for hooks in made:
            hooks.undo()
    for target in ALL_TARGETS:
        assert target_marked_by(target) != FIX.name, target


LOAD = """
{trigger}
import sglang_swa_plugin
from sglang_swa_plugin.patching import target_marked_by
TARGETS = {targets!r}
print("RESULT=" + json.dumps([sglang_swa_plugin.status()["fixes"]["swa_index_guard"],
                              [t for t in TARGETS if target_marked_by(t) == "swa_index_guard"]]))
"""
# sglang's plugin loader (0.5.11+), or the start-up hook on the model runner import (0.5.10).
TRIGGER = ("from sglang.srt.plugins import load_plugins; load_plugins()" if HAS_PLUGIN_FRAMEWORK
           else "import sglang.srt.model_executor.model_runner")


@pytest.mark.parametrize("guard_env", ["1", None])
def test_real_loading_path_installs_the_guard_only_when_asked(guard_env):
    env = {"SGLANG_SWA_PLUGIN_GUARD": guard_env} if guard_env else {}
    rec, marked = child_json(run_child(LOAD.format(trigger=TRIGGER, targets=ALL_TARGETS), **env))
    if guard_env:
        assert rec["status"] == APPLIED and rec["in_effect"], rec
        assert rec["via"] == ("HookRegistry" if HAS_PLUGIN_FRAMEWORK else "direct"), rec
        assert sorted(marked) == sorted(ALL_TARGETS)
    else:
        assert rec["status"] == DISABLED and "SGLANG_SWA_PLUGIN_GUARD is off" in rec["reason"], rec
        assert marked == []


def test_message_fits_a_cuda_assert_and_names_everything():
    msg = guard.message("trtllm_mha", "DRAFT_EXTEND_V2", 123, "page-table", 10**9, "pages")
    assert len(msg) < 255  # torch's device-side assert message limit
    for part in ("swa_index_guard", "trtllm_mha", "DRAFT_EXTEND_V2", "SWA layer 123", str(10**9)):
        assert part in msg


# ------------------------------------------------------------------------ trtllm_mha


@pytest.fixture
def trt():
    bench = guard_check.decode_bench("trtllm_mha")
    bench.backend.forward_metadata = guard_check.trtllm_metadata(bench)
    return bench


def test_trtllm_checks_swa_layers_and_passes_swa_slots(trt):
    with guarded(), checks() as ran:
        swa = trt.backend._get_layer_page_table(trt.swa_layer, trt.batch)
        full = trt.backend._get_layer_page_table(trt.full_layer, trt.batch)
    assert swa[0].tolist() == [1, 2, 3, 4, 5, 6] and full[0].tolist() == trt.tokens.tolist()
    assert len(ran) == 1 and "trtllm_mha DECODE SWA layer 0:" in ran[0]  # the full layer is not checked


def test_trtllm_checks_live_entries_only(trt):
    """Past each row's KV length the table is padding the kernel never reads (0.5.14+:
    uninitialised memory); an entry inside the length is read."""
    meta = trt.backend.forward_metadata = guard_check.trtllm_metadata(trt, width=12)
    assert int(meta.swa_page_table[0, 6:].min()) >= SWA_POOL_PAGES
    with guarded():
        trt.backend._get_layer_page_table(trt.swa_layer, trt.batch)
        meta.swa_page_table[0, 5] = SWA_POOL_PAGES  # the last token's entry
        with named_error("trtllm_mha", "DECODE", 0, SWA_POOL_PAGES):
            trt.backend._get_layer_page_table(trt.swa_layer, trt.batch)


def test_trtllm_full_pool_indices_in_swa_page_table_raise_named_error(trt):
    meta = trt.backend.forward_metadata
    meta.swa_page_table = meta.page_table  # the mix-up seed 002 made on fa3
    with guarded(), named_error("trtllm_mha", "DECODE", trt.swa_layer.layer_id, SWA_POOL_PAGES):
        trt.backend._get_layer_page_table(trt.swa_layer, trt.batch)


def _forget_swa_state(backend):
    """The state seed 003's FROZEN_KV draft backend had while the views made it read the
    target's SWAKVPool: no SWA pool of its own."""
    backend._swa_kv_pool = None
    backend.use_sliding_window_kv_pool = False
    backend.forward_metadata.swa_page_table = None


def test_trtllm_backend_without_swa_state_reading_swa_pool_raises_named_error(trt):
    _forget_swa_state(trt.backend)
    with guarded(), named_error("trtllm_mha", "DECODE", trt.swa_layer.layer_id, SWA_POOL_PAGES):
        trt.backend._get_layer_page_table(trt.swa_layer, trt.batch)


@pytest.mark.skipif(not CACHE_LOC_TAKES_BATCH, reason="0.5.10 form: _get_layer_cache_loc gets no forward batch")
def test_trtllm_swa_kv_write_location_checked_and_passes(trt):
    with guarded(), checks() as ran:
        loc = trt.backend._get_layer_cache_loc(trt.swa_layer, trt.batch)
    assert loc.tolist() == [6]
    assert len(ran) == 1 and "trtllm_mha DECODE SWA layer 0: KV-write" in ran[0]


@pytest.mark.skipif(not CACHE_LOC_TAKES_BATCH, reason="0.5.10 form: _get_layer_cache_loc gets no forward batch")
def test_trtllm_full_pool_kv_write_location_raises_named_error(trt):
    _forget_swa_state(trt.backend)
    with guarded(), named_error("trtllm_mha", "DECODE", trt.swa_layer.layer_id, SWA_POOL_PAGES, "slots"):
        trt.backend._get_layer_cache_loc(trt.swa_layer, trt.batch)


@needs_clean_process
def test_check_scenario_without_and_with_guard():
    assert FIX.reproduce() is True  # nothing stops the mix-up
    with guarded():
        res = guard_check.scenario()
    assert not res.bug and "trtllm_mha DECODE SWA layer 0" in res.seen, res


# ------------------------------------------------------------------------ fa3


@pytest.fixture
def fa3():
    return guard_check.decode_bench("fa3")


def test_fa3_checks_swa_layers_and_passes_swa_slots(fa3):
    with fa3_kernel_recorded(fa3.backend) as seen, guarded(), checks() as ran:
        fa3.backend.init_forward_metadata(fa3.batch)
        fa3_decode(fa3, fa3.swa_layer)
        fa3_decode(fa3, fa3.full_layer)
    swa, full = seen
    assert swa["page_table"][0, :6].tolist() == [1, 2, 3, 4, 5, 6] and swa["k_cache"].shape[0] == SWA_POOL_PAGES
    assert full["page_table"][0].tolist() == fa3.tokens.tolist()
    assert len(ran) == 1 and "fa3 DECODE SWA layer 0:" in ran[0]  # the full layer is not checked


def test_fa3_decode_full_pool_indices_raise_named_error_before_the_kernel(fa3):
    with fa3_kernel_recorded(fa3.backend) as seen, guarded():
        fa3.backend.init_forward_metadata(fa3.batch)
        meta = fa3.backend.forward_metadata
        meta.swa_page_table = meta.page_table  # an SWA layer handed full-pool indices
        with named_error("fa3", "DECODE", fa3.swa_layer.layer_id, SWA_POOL_PAGES):
            fa3_decode(fa3, fa3.swa_layer)
    assert seen == []  # the kernel never ran


# -- seed 002: FA3 EAGLE3 topk > 1 TARGET_VERIFY on the real metadata path


def swa_spec_page_table(dst, a, b, seq_len_a, seq_len_b, num_draft_tokens):
    """Pure-torch equivalent of ``prepare_swa_spec_page_table_triton``: row m gets the first
    seq_len_a entries of request m // num_draft_tokens's row of ``a``, then the first
    seq_len_b[m] entries of row m of ``b``, written into ``dst`` in place."""
    for m in range(seq_len_b.numel()):
        r = m // num_draft_tokens
        la, lb = int(seq_len_a[r]), int(seq_len_b[m])
        dst[m, :la] = a[r, :la]
        dst[m, la:la + lb] = b[m, :lb]


def fa3_spec_method_alone():
    """sglang's own ``_init_sliding_window_attn_spec_metadata``, whatever this process
    installed on it (the start-up hook installs fa3_spec_translate on 0.5.10)."""
    return without_fix(FA3.FlashAttentionBackend, fa3_spec_translate.METHOD)


def verify_swa_layer(other_fixes=()):
    """Run the real TARGET_VERIFY metadata and forward_extend of an SWA layer (EAGLE3 topk 2)
    under the guard; returns what the kernel received."""
    bench = fa3_check.verify_bench()
    from sglang.srt.layers.radix_attention import RadixAttention

    layer = RadixAttention(num_heads=4, head_dim=8, scaling=1.0, num_kv_heads=2, layer_id=0, sliding_window_size=127)
    n = bench.batch.out_cache_loc.shape[0]
    q, kv = torch.zeros(n, 4 * 8), torch.zeros(n, 2 * 8)
    with swapped(FA3, "prepare_swa_spec_page_table_triton", swa_spec_page_table), \
            fa3_kernel_recorded(bench.backend) as seen, guarded(*other_fixes):
        bench.backend.init_forward_metadata(bench.batch)
        bench.backend.forward_extend(q, kv, kv, layer, bench.batch, save_kv_cache=False)
    return seen[-1]


def test_fa3_seed_002_bug_is_a_named_error_where_sglang_has_it():
    """sglang alone under the guard: 0.5.10/0.5.11 hand the SWA layer full-pool indices
    (#24617 absent) and the guard names it; from 0.5.12 the guard checks and passes."""
    with fa3_spec_method_alone(), checks() as ran:
        if SGLANG >= (0, 5, 12):
            assert int(verify_swa_layer()["page_table"].max()) < 33
        else:
            with named_error("fa3", "TARGET_VERIFY", 0, 33):
                verify_swa_layer()
    assert ran


def test_fa3_guard_passes_with_the_fa3_fix_where_needed():
    with fa3_spec_method_alone():
        needed = fa3_spec_translate.FIX.detect().verdict is Verdict.NEEDED
        with checks() as ran:
            seen = verify_swa_layer((fa3_spec_translate.FIX,) if needed else ())
    assert int(seen["page_table"].max()) < 33 and seen["k_cache"].shape[0] == 33
    assert ran and all("fa3 TARGET_VERIFY SWA layer 0:" in m for m in ran)


# ------------------------------------------------------------------------ composition


OTHER_FIXES = [f for f, src in load_fixes() if src == "builtin" and f.name != FIX.name and f.has_scenario()]


@pytest.mark.parametrize("other", OTHER_FIXES, ids=lambda f: f.name)
def test_guard_passes_every_scenario_the_other_fixes_make_correct(other):
    """Each fix's own CPU scenario, with that fix installed where this sglang needs it and
    the guard on: no named error, and the bug does not show."""
    made = []
    rec = decide(other, "builtin", config.parse({}), lambda name: made.append(DirectHooks(name)) or made[-1])
    try:
        if rec.status in PROBLEMS:
            pytest.skip(f"{other.name}: {rec.status} ({rec.reason})")
        with guarded():
            try:
                bug = other.reproduce()
            except ScenarioUnavailable as e:
                pytest.skip(f"{other.name}: {e}")
    finally:
        for hooks in made:
            hooks.undo()
    assert bug is False, f"{other.name}'s scenario still shows its bug with the fix {rec.status}"
