"""fa3_spec_translate: the page tables ``prepare_swa_spec_page_table_triton`` receives on the
real FA3 EAGLE3 topk>1 TARGET_VERIFY metadata path, on a real backend over a real
``SWAKVPool`` whose full and SWA index spaces diverge (every full index of the requests lies
beyond the SWA pool). The Triton kernel cannot run on a CPU: it is replaced by a recorder, and
``swa_spec_page_table`` below is a pure-torch equivalent of it, so the resulting SWA page table
can be read against the SWA pool's real KV buffer.

The plugin is as a server process has it: decided from the environment and installed where
needed. ``SGLANG_SWA_PLUGIN=0 pytest tests/test_fa3_spec_translate.py`` runs the same tests
without it: on 0.5.10/0.5.11 they fail, showing full-pool indices reaching the kernel.
Which releases carry upstream's fix (#24617, 0.5.12) is the research map's; the tests use it
for their expectations only, the fix never does."""

from __future__ import annotations

import contextlib
import importlib
import inspect
from types import SimpleNamespace

import pytest
import torch

# On sglang without a plugin framework the start-up hook installs the plugin when the model
# runner module is imported, as in a server process: make that happen before anything else.
import sglang.srt.model_executor.model_runner  # noqa: F401

from sglang_swa_plugin import state
from sglang_swa_plugin.config import parse
from sglang_swa_plugin.core import APPLIED, decide, temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import fa3_spec_translate as fa3
from sglang_swa_plugin.check import fa3_spec_translate as fa3_check
from sglang_swa_plugin.patching import DirectHooks
from sglang_swa_plugin.probe import swapped

from helpers import main_window_snapshot, sglang_release, snapshot_carries, without_fix

FIX = fa3.FIX
MOD = importlib.import_module(fa3.MODULE)
BACKEND = MOD.FlashAttentionBackend
SGLANG = sglang_release()
# #24617: from 0.5.12; on upstream main commits (tests/main_window.py) by what the commit carries.
UPSTREAM_FIXED = snapshot_carries(FIX.name) is None if main_window_snapshot() else SGLANG >= (0, 5, 12)
SWA_LAYER = 0  # gpt_oss-like testbed model: layers 0 and 2 slide


@contextlib.contextmanager
def decided(env=None):
    """The plugin's decision for this fix (from ``env``, default: this process's
    environment), installed where needed (or already installed by the start-up hook); what
    this installed is undone after."""
    trial = []
    rec = decide(FIX, "builtin", parse(env), lambda name: trial.append(DirectHooks(name)) or trial[-1])
    try:
        yield rec
    finally:
        for hooks in trial:
            hooks.undo()


@pytest.fixture
def plugin():
    with decided() as rec:
        yield rec


def sglang_alone():
    """sglang's own method in effect, whatever this process installed on it."""
    return without_fix(BACKEND, fa3.METHOD, FIX.name)


def swa_spec_page_table(dst, a, b, seq_len_a, seq_len_b, num_draft_tokens):
    """Pure-torch equivalent of ``_prepare_swa_spec_page_table_kernel`` (0.5.10
    flashattention_backend.py): draft row m of request m // num_draft_tokens gets that
    request's first seq_len_a entries of ``a`` followed by the first seq_len_b[m] entries of
    its row in ``b`` (0 where a column is past ``a``'s or ``b``'s width); the columns from
    seq_len_a + seq_len_b on are left as they are."""
    out = dst.clone()
    for m in range(seq_len_b.numel()):
        r = m // num_draft_tokens
        la, lb = int(seq_len_a[r]), int(seq_len_b[m])
        assert la + lb <= out.shape[1], "the kernel would write past the destination"
        for n in range(la + lb):
            if n < la:
                out[m, n] = a[r, n] if n < a.shape[1] else 0
            else:
                out[m, n] = b[m, n - la] if n - la < b.shape[1] else 0
    return out


def write_swa_markers(bench, layer_id):
    """Write every token of every request (prefix, then draft tokens) into ``layer_id`` of the
    real pool with K = its marker (1, 2, ...), through ``SWAKVPool.set_kv_buffer`` with the
    write location each release takes. Returns per request the markers in token order."""
    pool = bench.pool
    params = inspect.signature(pool.set_kv_buffer).parameters
    k_shape = pool.get_key_buffer(layer_id).shape[1:]
    layer = SimpleNamespace(layer_id=layer_id)  # a RadixAttention only lends its layer_id here
    markers, next_marker = [], 1
    for prefix, draft in zip(bench.prefixes, bench.drafts):
        loc = torch.cat([prefix, draft])
        values = torch.arange(next_marker, next_marker + len(loc), dtype=torch.float32)
        next_marker += len(loc)
        k = values.view(-1, *([1] * len(k_shape))).expand(-1, *k_shape).to(pool.dtype).contiguous()
        if "loc_info" in params:  # 0.5.14+: KVWriteLoc carries the backend's SWA location
            from sglang.srt.mem_cache.memory_pool import KVWriteLoc

            pool.set_kv_buffer(layer, KVWriteLoc(loc, swa_loc=bench.swa_slots(loc)), k, k.clone())
        elif "swa_loc" in params:  # 0.5.13: the backend passes the SWA location
            pool.set_kv_buffer(layer, loc, k, k.clone(), swa_loc=bench.swa_slots(loc))
        else:  # <= 0.5.12: the pool translates the full location itself
            pool.set_kv_buffer(layer, loc, k, k.clone())
        markers.append(values)
    return markers


def expected_rows(bench, slots_of):
    """Per draft row: the slots (``slots_of`` full indices) its attention must read: the
    request's prefix, then the draft tokens the tree lets it see."""
    rows = []
    for prefix, draft in zip(bench.prefixes, bench.drafts):
        for attends in fa3_check.TREE:
            rows.append(torch.cat([slots_of(prefix), slots_of(draft[list(attends)])]))
    return rows


def run_verify(bench):
    res = fa3_check.verify_run(bench)
    return res.seen


# ------------------------------------------------------------------ detection


def test_detection_matches_the_real_path_and_the_release():
    with sglang_alone():
        det = FIX.detect()
        bug = fa3_check.verify_run(fa3_check.verify_bench()).bug_shows
    assert det.verdict in (Verdict.NEEDED, Verdict.NOT_NEEDED), det
    assert (det.verdict is Verdict.NEEDED) == bug == (not UPSTREAM_FIXED), (det, bug)
    if UPSTREAM_FIXED:
        assert "already fixed upstream" in det.reason


def test_the_plugin_installs_only_where_sglang_lacks_the_translation():
    with decided({}) as rec:  # default settings
        assert rec.status == ("not needed" if UPSTREAM_FIXED else APPLIED), rec
        assert rec.in_effect() != UPSTREAM_FIXED
        with sglang_alone():
            assert fa3_check.verify_run(fa3_check.verify_bench()).bug_shows != UPSTREAM_FIXED
        assert not fa3_check.verify_run(fa3_check.verify_bench()).bug_shows


# ------------------------------------------------------------------ the real metadata path


def test_kernel_receives_prefix_and_draft_tables_in_swa_space(plugin):
    bench = fa3_check.verify_bench()
    seen = run_verify(bench)
    full = expected_rows(bench, lambda t: t)
    swa = expected_rows(bench, bench.swa_slots)
    assert seen["a"].dtype == torch.int32 and seen["b"].dtype == torch.int32
    for r, prefix in enumerate(bench.prefixes):
        got = seen["a"][r, : len(prefix)].long()
        assert not torch.equal(got, prefix), f"request {r}: the kernel got full-pool prefix indices {got.tolist()}"
        assert torch.equal(got, bench.swa_slots(prefix)), (r, got)
    for m, attends in enumerate(fa3_check.TREE * len(bench.prefixes)):
        n = len(attends)
        got = seen["b"][m, :n].long()
        assert int(seen["seq_len_b"][m]) == n
        assert not torch.equal(got, full[m][-n:]), f"draft row {m}: the kernel got full-pool indices {got.tolist()}"
        assert torch.equal(got, swa[m][-n:]), (m, got)
    # The rest of the backend still sees the full-pool tables (full layers, cascade attention).
    md, expand = bench.backend.forward_metadata, bench.backend.forward_metadata_spec_decode_expand
    for r, prefix in enumerate(bench.prefixes):
        assert torch.equal(md.page_table[r, : len(prefix)].long(), prefix)
        assert torch.equal(md.swa_page_table[r, : len(prefix)].long(), bench.swa_slots(prefix))
    for m, attends in enumerate(fa3_check.TREE * len(bench.prefixes)):
        assert torch.equal(expand.page_table[m, : len(attends)].long(), full[m][-len(attends):])


def test_swa_spec_page_table_reads_each_requests_tokens_from_the_swa_pool(plugin):
    bench = fa3_check.verify_bench()
    markers = write_swa_markers(bench, SWA_LAYER)
    seen = run_verify(bench)
    table = swa_spec_page_table(
        seen["dst"], seen["a"], seen["b"], seen["seq_len_a"], seen["seq_len_b"], seen["num_draft_tokens"]
    )
    k_cache = bench.pool.get_key_buffer(SWA_LAYER)
    for m, attends in enumerate(fa3_check.TREE * len(bench.prefixes)):
        r = m // len(fa3_check.TREE)
        n_prefix = len(bench.prefixes[r])
        row = table[m, : n_prefix + len(attends)].long()
        assert int(row.max()) < k_cache.shape[0], (
            f"draft row {m}: SWA page table {row.tolist()} leaves the SWA pool ({k_cache.shape[0]} slots)"
        )
        want = torch.cat([markers[r][:n_prefix], markers[r][n_prefix:][list(attends)]])
        got = k_cache[row][:, 0, 0].float()
        assert torch.equal(got, want), f"draft row {m}: read tokens {got.tolist()}, want {want.tolist()}"


def test_adds_two_gathers_on_the_topk_gt1_swa_path_only(plugin):
    """The fix's cost is the two translations of upstream's own fix; a backend without a SWA
    pool (EAGLE draft-like: full-only pool, shared SWA allocator) and topk 1 are untouched."""
    bench = fa3_check.verify_bench()
    calls = []
    translate = bench.pool.translate_loc_from_full_to_swa

    def counting(idx, *args, **kwargs):
        calls.append(tuple(idx.shape))
        return translate(idx, *args, **kwargs)

    def spec_calls():
        calls.clear()
        with swapped(bench.pool, "translate_loc_from_full_to_swa", counting):
            bench.backend._init_sliding_window_attn_spec_metadata(md, expand)
        return list(calls)

    run_verify(bench)
    md, expand = bench.backend.forward_metadata, bench.backend.forward_metadata_spec_decode_expand
    with swapped(MOD, fa3.KERNEL, lambda *a: None):
        assert spec_calls() == [tuple(md.page_table.shape), tuple(expand.page_table.shape)]

    no_swa = fa3_check.verify_bench(swa_pool=False)
    assert not no_swa.backend.use_sliding_window_kv_pool and no_swa.backend.has_swa
    seen = run_verify(no_swa)  # the kernel still runs: it must get the full-pool tables
    for r, prefix in enumerate(no_swa.prefixes):
        assert torch.equal(seen["a"][r, : len(prefix)].long(), prefix)
    for m, row in enumerate(expected_rows(no_swa, lambda t: t)):
        n = len(fa3_check.TREE[m % len(fa3_check.TREE)])
        assert torch.equal(seen["b"][m, :n].long(), row[-n:])

    topk1 = fa3_check.verify_bench(topk=1)
    assert fa3.kernel_inputs(MOD, lambda: topk1.backend.init_forward_metadata(topk1.batch)) is None


def test_a_failing_translation_leaves_both_page_tables_as_they_were():
    """The draft table holds an index past the pool (the real translation raises): neither
    table stays translated, and the error reaches the caller."""
    bench = fa3_check.verify_bench()
    run_verify(bench)
    md, expand = bench.backend.forward_metadata, bench.backend.forward_metadata_spec_decode_expand
    full_a = md.page_table
    expand.page_table = expand.page_table.clone()
    expand.page_table[0, 0] = 1 << 20  # beyond the full-to-SWA mapping
    full_b = expand.page_table
    with sglang_alone():
        original = getattr(BACKEND, fa3.METHOD)
    with pytest.raises(IndexError):
        fa3._translate_page_tables(original, bench.backend, md, expand)
    assert md.page_table is full_a and expand.page_table is full_b


# ------------------------------------------------------------------ the check scenario


def test_check_scenario_reproduces_and_the_fix_corrects_it():
    with sglang_alone():
        bug_without = FIX.reproduce()
        assert bug_without == (not UPSTREAM_FIXED)
        if bug_without:
            with temporarily_installed(FIX):
                assert not FIX.reproduce()


def _graph_metadata(md, expand, bs: int):
    """A batch of the first ``bs`` requests as sglang's CUDA-graph path hands it over: views
    of the bench's tables, and a SWA spec metadata of static buffers (``metadata_swa``)."""
    n = len(fa3_check.TREE)
    small, small_expand, swa = MOD.FlashAttentionMetadata(), MOD.FlashAttentionMetadata(), MOD.FlashAttentionMetadata()
    small.page_table, small.cache_seqlens_int32, small.max_seq_len_k = (md.page_table[:bs], md.cache_seqlens_int32[:bs],
                                                                        md.max_seq_len_k)
    small_expand.page_table = expand.page_table[: bs * n]
    small_expand.cache_seqlens_int32 = expand.cache_seqlens_int32[: bs * n]
    small_expand.cu_seqlens_q = expand.cu_seqlens_q[: bs * n + 1]
    swa.page_table = torch.zeros(bs * n, md.max_seq_len_k + expand.page_table.shape[1], dtype=torch.int32)
    swa.cache_seqlens_int32 = torch.zeros(bs * n, dtype=torch.int32)
    swa.cu_seqlens_k = torch.zeros(bs * n + 1, dtype=torch.int32)
    return small, small_expand, swa


def test_graph_path_translates_into_kept_tables_as_the_eager_path_does():
    """CUDA-graph replays (a ``metadata_swa`` of static buffers) translate into two int32
    tables kept on the backend (views per batch size, grown for a larger batch): the kernel
    gets what the eager path gives it, and the metadata keeps its full-pool tables."""
    if UPSTREAM_FIXED:
        pytest.skip("not needed: this sglang translates the tables itself")
    bench = fa3_check.verify_bench()
    run_verify(bench)
    md, expand = bench.backend.forward_metadata, bench.backend.forward_metadata_spec_decode_expand
    with sglang_alone():
        original = getattr(BACKEND, fa3.METHOD)
    be, bs_all = bench.backend, len(bench.prefixes)
    for bs in (1, bs_all, 1, bs_all):  # the second bs 1 reuses the grown tables
        small, small_expand, swa = _graph_metadata(md, expand, bs)
        full_a, full_b = small.page_table, small_expand.page_table
        eager = fa3.kernel_inputs(MOD, lambda: fa3._translate_page_tables(original, be, small, small_expand))
        graph = fa3.kernel_inputs(MOD, lambda: fa3._translate_page_tables(original, be, small, small_expand, swa))
        assert small.page_table is full_a and small_expand.page_table is full_b
        for key in ("a", "b", "seq_len_a", "seq_len_b"):
            assert graph[key].dtype == eager[key].dtype and torch.equal(graph[key], eager[key]), (bs, key)
        kept = state.get(be, fa3.TABLES)
        assert kept[0].shape[0] >= bs and kept[0].dtype == torch.int32
    assert kept[0].shape[0] == bs_all and kept[1].shape[0] == bs_all * len(fa3_check.TREE)
