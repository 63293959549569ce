"""trtllm_swa_pool: every TRTLLMHAAttnBackend sglang builds resolves its SWA KV pool by
upstream's final rule (#27491), on the installed sglang's real classes.

Real SWAKVPool, real SWATokenToKVPoolAllocator (shared by target and drafts) and a real
full-only pool for the EAGLE draft; a few full-only slots are taken first so the full and
SWA index spaces diverge. Backends are built through sglang's own paths: the
``ATTENTION_BACKENDS["trtllm_mha"]`` registry factory, ``DraftBackendFactory`` (multi-step
decode and draft-extend backends) and, where it exists, the FROZEN_KV topk>1 builder.
Where detection says the fix is needed it is installed (and undone) around each test, or
is already in effect for good through the start-up hook (sglang without a plugin
framework). ``SGLANG_SWA_PLUGIN=0`` runs the same tests on stock sglang: on 0.5.10-0.5.12
the truth table, the behaviour test and the #26966 form then fail.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
from types import SimpleNamespace

import pytest
import torch

# On sglang without a plugin framework the start-up hook installs the plugin when the model
# runner module is imported, as in a server process: make that happen first, every time.
import sglang.srt.model_executor.model_runner  # noqa: F401
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from helpers import HAS_PLUGIN_FRAMEWORK, child_json, main_window_snapshot, run_child, sglang_release, snapshot_carries, without_fix

from sglang_swa_plugin import config
from sglang_swa_plugin.check import testbed as tb
from sglang_swa_plugin.core import temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import trtllm_swa_pool as mod
from sglang_swa_plugin.patching import marked_by
from sglang_swa_plugin.probe import normalized_source, own_function, swapped

FIX = mod.FIX
trt = importlib.import_module("sglang.srt.layers.attention.trtllm_mha_backend")
Backend = trt.TRTLLMHAAttnBackend

DETECTION = FIX.detect()
NEEDED = DETECTION.verdict is Verdict.NEEDED
HAS_FROZEN_KV = "FROZEN_KV_MTP" in SpeculativeAlgorithm.__members__
HAS_RESOLVER = own_function(Backend, mod.RESOLVER) is not None
# In the allocator form (0.5.10-0.5.12) the SWA guards read the flag; later they read the pool.
FLAG_IS_GUARD = "use_sliding_window_kv_pool" in normalized_source(Backend._alloc_swa_page_table)
# The form of the bug in the installed code: "allocator" (0.5.10-0.5.12), "#25103" or "#26966"
# (upstream main commits, tests/main_window.py), None (the final rule, #27491).
FORM = snapshot_carries(FIX.name) if main_window_snapshot() else ("allocator" if NEEDED else None)
SWA_LAYER, FULL_LAYER = 0, 1  # testbed's hybrid model: even layers sliding, odd layers full


def _plugin_enabled() -> bool:
    cfg = config.parse()
    return cfg.enabled and cfg.selected(FIX.name)


def _in_effect() -> bool:
    return marked_by(Backend.__dict__["__init__"]) == FIX.name


@contextlib.contextmanager
def fix_applied(needed: bool = NEEDED):
    """The fix in effect for the block where it is needed, as the plugin would have it
    (unless SGLANG_SWA_PLUGIN / SGLANG_SWA_PLUGIN_FIXES turn it off). On sglang without a
    plugin framework the start-up hook may have installed it for good already."""
    if needed and _plugin_enabled() and not _in_effect():
        with temporarily_installed(FIX):
            yield
    else:
        yield


def stock_sglang():
    """sglang's own constructor for the block, whatever installed the fix in this process."""
    return without_fix(Backend, "__init__", FIX.name)


# ---------------------------------------------------------------------------- world


def _full_allocator(pool):
    """A real plain TokenToKVPoolAllocator (the testbed has SWA allocators only)."""
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

    return TokenToKVPoolAllocator(size=pool.size, dtype=pool.dtype, device="cpu", kvcache=pool, need_sort=False)


def make_world():
    swa_pool = tb.make_swa_pool()
    allocator = tb.make_swa_allocator(swa_pool)
    tb.diverge(allocator)
    return SimpleNamespace(swa_pool=swa_pool, allocator=allocator, req_to_token=tb.make_req_to_token_pool())


CASES = ("target", "no_spec_target", "eagle_draft", "eagle3_draft", "frozen_kv_draft", "non_swa_model")


def make_runner(w, case):
    """(model runner, the pool the final rule gives it)."""
    shared = dict(allocator=w.allocator, req_to_token_pool=w.req_to_token)
    if case == "non_swa_model":
        pool = tb.make_full_pool()
        runner = tb.make_model_runner(kv_pool=pool, allocator=_full_allocator(pool), req_to_token_pool=w.req_to_token,
                                      model="llama", spec_algorithm="EAGLE")
        return runner, None
    if case == "no_spec_target":
        return tb.make_model_runner(kv_pool=w.swa_pool, spec_algorithm=None, **shared), w.swa_pool
    algo = {"eagle3_draft": "EAGLE3", "frozen_kv_draft": "FROZEN_KV_MTP"}.get(case, "EAGLE")
    try:
        target = tb.make_model_runner(kv_pool=w.swa_pool, spec_algorithm=algo, **shared)
    except tb.Unavailable as e:
        pytest.skip(str(e))
    if case == "target":
        return target, w.swa_pool
    draft = tb.make_model_runner(kv_pool=tb.make_full_pool(), is_draft_worker=True, spec_algorithm=algo,
                                 server_args=target.server_args, model="llama", **shared)
    return draft, (w.swa_pool if case == "frozen_kv_draft" else None)


def _frozen_kv_topk_builder():
    """FROZEN_KV topk>1 builds its trtllm_mha draft backend directly (0.5.17+), or None."""
    if importlib.util.find_spec("sglang.srt.speculative.frozen_kv_mtp_worker_v2") is None:
        return None
    worker = importlib.import_module("sglang.srt.speculative.frozen_kv_mtp_worker_v2")
    return getattr(getattr(worker, "FrozenKVMTPDraftWorker", None), "_init_trtllm_mha_draft_attn_backend", None)


def build_backends(runner, case):
    """Every TRTLLMHAAttnBackend sglang builds for this runner, through sglang's paths."""
    out = {"registry": tb.build_backend_via_registry(runner, "trtllm_mha")}
    if case in ("eagle_draft", "eagle3_draft"):
        fac = tb.build_draft_backends_via_factory(runner)
        out["factory_draft_extend"] = fac.draft_extend
        for i, step in enumerate(b for b in fac.decode.attn_backends if b is not None):
            out[f"factory_decode_step{i}"] = step
    builder = _frozen_kv_topk_builder() if case == "frozen_kv_draft" else None
    if builder is not None:
        with tb.cpu_backend_patches():
            out["frozen_kv_topk_builder"] = builder(SimpleNamespace(draft_model_runner=runner))
    return out


def problems(backend, want, where=""):
    """What disagrees with ``want``: the resolved pool, the guards, state derived from the
    pool, and the SWA page-table CUDA-graph buffers after ``init_cuda_graph_state``."""
    out = []
    if not isinstance(backend, Backend):
        out.append(f"{where}: {type(backend).__name__} is not a TRTLLMHAAttnBackend")
    if backend._swa_kv_pool is not want:
        out.append(f"{where}: _swa_kv_pool is {type(backend._swa_kv_pool).__name__}, want {type(want).__name__}")
    if FLAG_IS_GUARD or _in_effect():
        if bool(backend.use_sliding_window_kv_pool) is not (want is not None):
            out.append(f"{where}: use_sliding_window_kv_pool={backend.use_sliding_window_kv_pool}")
    if hasattr(backend, "_swa_full_to_swa_mapping"):
        if backend._swa_full_to_swa_mapping is not (want.full_to_swa_index_mapping if want is not None else None):
            out.append(f"{where}: _swa_full_to_swa_mapping disagrees")
    backend.init_cuda_graph_state(4, 16)
    buffers = {f"{attr}[{key}]": v for attr, d in vars(backend).items() if isinstance(d, dict)
               for key, v in d.items() if isinstance(key, str) and key.startswith("swa_page_table")}
    if not buffers:
        out.append(f"{where}: no SWA page-table CUDA-graph buffer slot after init_cuda_graph_state")
    out += [f"{where}: {slot} is {'allocated' if buf is not None else 'None'}"
            for slot, buf in buffers.items() if (buf is not None) is not (want is not None)]
    return out


# ---------------------------------------------------------------------------- detection


def test_detection_follows_the_installed_code():
    assert DETECTION.verdict is (Verdict.NEEDED if FORM else Verdict.NOT_NEEDED), (FORM, DETECTION)
    if not main_window_snapshot():
        # Releases: no resolver (allocator-type form) -> needed; the #27491 resolver -> not needed.
        assert DETECTION.verdict is (Verdict.NOT_NEEDED if HAS_RESOLVER else Verdict.NEEDED), DETECTION
    # Documented releases (the matrix): the bug is in 0.5.10-0.5.12, fixed from 0.5.13.
    rel = sglang_release()
    if len(rel) == 3 and (0, 5, 10) <= rel:
        assert NEEDED is (rel < (0, 5, 13)), (rel, DETECTION)


def test_resolver_probe_tells_the_final_rule():
    if not HAS_RESOLVER or FORM:
        pytest.skip(f"this sglang has no resolver of the final rule ({DETECTION.reason})")
    got = mod.probe_resolver(own_function(Backend, mod.RESOLVER))
    assert got == {"target": True, "eagle_draft": False, **({"frozen_kv_draft": True} if HAS_FROZEN_KV else {})}


# ---------------------------------------------------------------------------- truth table


def test_truth_table_every_construction_path():
    """target / no speculative decoding / EAGLE and EAGLE3 drafts / FROZEN_KV draft /
    non-SWA model, each backend built through every path sglang uses for it."""
    w = make_world()
    found, seen = [], []
    with fix_applied():
        for case in CASES:
            if case == "frozen_kv_draft" and not HAS_FROZEN_KV:
                continue  # no FROZEN_KV MTP in this sglang
            runner, want = make_runner(w, case)
            for where, backend in build_backends(runner, case).items():
                seen.append(f"{case}/{where}")
                found += problems(backend, want, f"{case}/{where}")
    assert not found, "\n".join(found)
    assert len(seen) >= 8, seen
    # eagle_worker_v2 whitelists the class by isinstance: it is still the class sglang holds.
    assert trt.TRTLLMHAAttnBackend is Backend
    if importlib.util.find_spec("sglang.srt.speculative.eagle_worker_v2") is not None:
        ew2 = importlib.import_module("sglang.srt.speculative.eagle_worker_v2")
        assert getattr(ew2, "TRTLLMHAAttnBackend", Backend) is Backend


# ---------------------------------------------------------------------------- behaviour


def _layer(layer_id):
    return RadixAttention(num_heads=4, head_dim=8, scaling=1.0, num_kv_heads=2, layer_id=layer_id, sliding_window_size=127)


def _storage(t):
    return t.untyped_storage().data_ptr()


def cache_loc_of(backend, layer, fb):
    """``_get_layer_cache_loc``: takes the batch from 0.5.11, the locations in 0.5.10."""
    takes_batch = "forward_batch" in inspect.signature(backend._get_layer_cache_loc).parameters
    return backend._get_layer_cache_loc(layer, fb if takes_batch else fb.out_cache_loc).long()


def _init_metadata(backend, fb):
    try:
        backend.init_forward_metadata(fb)
    except RuntimeError as e:
        if "active drivers" in str(e):
            pytest.skip("this sglang builds trtllm_mha page tables with a Triton kernel (not on CPU)")
        raise


def handed_to_kernel(backend, fb, layer):
    """(cache locations, page table, key buffer) the backend hands an SWA layer's KV write
    and decode kernel; flashinfer's decode kernel is replaced by a recorder."""
    calls = []

    def decode_kernel(**kw):
        calls.append(kw)
        q = kw["query"]
        return torch.zeros(q.shape[0], q.shape[1], q.shape[2], dtype=q.dtype)

    recorder = SimpleNamespace(decode=SimpleNamespace(trtllm_batch_decode_with_kv_cache=decode_kernel))
    _init_metadata(backend, fb)
    cache_loc = cache_loc_of(backend, layer, fb)
    q = torch.zeros(fb.batch_size, 4 * 8, dtype=torch.bfloat16)
    kv = torch.zeros(fb.batch_size, 2, 8, dtype=torch.bfloat16)
    with swapped(trt, "flashinfer", recorder):
        backend.forward_decode(q, kv, kv.clone(), layer, fb, save_kv_cache=False)
    (call,) = calls
    return cache_loc.long(), call["block_tables"].long(), call["kv_cache"][0]


@contextlib.contextmanager
def frozen_kv_view(fb, target_pool, backend):
    """sglang's own FROZEN_KV view: the draft reads the target's pool through a swap."""
    from sglang.srt.speculative import frozen_kv_mtp_utils as fkv
    from sglang.srt.speculative.frozen_kv_mtp_info import FrozenKVMTPContext

    ctx = FrozenKVMTPContext(target_token_to_kv_pool=target_pool, physical_layer_ids={0: 0, 1: 1})
    params = inspect.signature(fkv.target_kv_pool_view).parameters
    with fkv.target_kv_pool_view(*((fb, ctx, backend) if "draft_attn_backend" in params else (fb, ctx))):
        yield


def test_swa_layers_get_indices_of_the_resolved_pool():
    """What the backend hands the KV write and the decode kernel of an SWA layer: SWA index
    space inside the SWA pool for the target and the FROZEN_KV draft (which reads the
    target's pool through sglang's own view), untranslated full-pool indices for the
    EAGLE draft. Full layers stay in full index space."""
    w = make_world()
    tokens = tb.alloc_tokens(w.allocator, 6)
    rows, lens = tb.fill_requests(w.req_to_token, [tokens[:3].tolist(), tokens[3:].tolist()])
    loc = tokens[[2, 5]]
    full_rows = torch.stack([tokens[:3], tokens[3:]])
    swa_rows = tb.translate(w.swa_pool, full_rows)
    assert not torch.equal(swa_rows, full_rows), "index spaces must diverge for this test to mean anything"
    found = []
    for case in ("target", "eagle_draft") + (("frozen_kv_draft",) if HAS_FROZEN_KV else ()):
        runner, want = make_runner(w, case)
        with fix_applied():
            backend = tb.build_backend_via_registry(runner, "trtllm_mha")
        fb = tb.make_forward_batch(runner, "decode", req_pool_indices=rows, seq_lens=lens, out_cache_loc=loc)
        with frozen_kv_view(fb, w.swa_pool, backend) if case == "frozen_kv_draft" else contextlib.nullcontext():
            cache_loc, page_table, k_buffer = handed_to_kernel(backend, fb, _layer(SWA_LAYER))
            full_layer_loc = cache_loc_of(backend, _layer(FULL_LAYER), fb)
        if want is not None:  # SWA index space, inside the SWA pool, read from its buffer
            pool, expect = w.swa_pool, (tb.translate(w.swa_pool, loc), swa_rows // w.swa_pool.page_size)
            if int(page_table.max()) > w.swa_pool.size_swa // w.swa_pool.page_size:
                found.append(f"{case}: page ids beyond the SWA pool")
        else:  # the EAGLE draft's own full pool, untranslated
            pool, expect = runner.token_to_kv_pool, (loc, full_rows)
        if not torch.equal(cache_loc, expect[0]):
            found.append(f"{case}: SWA-layer cache loc {cache_loc.tolist()}, want {expect[0].tolist()}")
        if not torch.equal(page_table, expect[1]):
            found.append(f"{case}: SWA-layer page table {page_table.tolist()}, want {expect[1].tolist()}")
        if _storage(k_buffer) != _storage(pool.get_key_buffer(SWA_LAYER)):
            found.append(f"{case}: the kernel reads another pool's KV buffer")
        if not torch.equal(full_layer_loc, loc):
            found.append(f"{case}: full-layer cache loc {full_layer_loc.tolist()}, want {loc.tolist()}")
    assert not found, "\n".join(found)


def test_stock_allocator_form_gives_the_eagle_draft_the_wrong_pool():
    """The bug itself, plugin not installed: the scenarios above can see it."""
    if FORM != "allocator":
        pytest.skip(f"not the allocator-type form here ({DETECTION.reason})")
    w = make_world()
    draft, _ = make_runner(w, "eagle_draft")
    loc = tb.alloc_tokens(w.allocator, 2)
    with stock_sglang():
        fac = tb.build_draft_backends_via_factory(draft)
    for backend in [fac.draft_extend] + [b for b in fac.decode.attn_backends if b is not None]:
        assert backend._swa_kv_pool is w.swa_pool and backend.use_sliding_window_kv_pool
        fb = tb.make_forward_batch(draft, "decode", req_pool_indices=[0, 1], seq_lens=[1, 1], out_cache_loc=loc)
        # Its own full-pool indices are pushed through the target's SWA mapping.
        assert torch.equal(cache_loc_of(backend, _layer(SWA_LAYER), fb), tb.translate(w.swa_pool, loc))
        assert not torch.equal(tb.translate(w.swa_pool, loc), loc)


def _mtp_world():
    """A MiMo-V2 / Step3.5 MTP draft: the target's layer 0 is full attention; the draft's one
    layer (id 0) slides and lives in the draft's own SWAKVPool, which takes the shared
    allocator's full->SWA mapping (as ``ModelRunner`` does for a hybrid draft worker)."""
    target_pool = tb.make_swa_pool(swa_layers=(1, 3), full_layers=(0, 2))
    allocator = tb.make_swa_allocator(target_pool)
    tb.diverge(allocator)
    draft_pool = tb.make_swa_pool(swa_layers=(0,), full_layers=())
    draft_pool.full_to_swa_index_mapping = allocator.full_to_swa_index_mapping
    req_to_token = tb.make_req_to_token_pool()
    target = tb.make_model_runner(kv_pool=target_pool, allocator=allocator, req_to_token_pool=req_to_token,
                                  spec_algorithm="EAGLE")
    draft = tb.make_model_runner(kv_pool=draft_pool, allocator=allocator, req_to_token_pool=req_to_token,
                                 is_draft_worker=True, spec_algorithm="EAGLE", server_args=target.server_args)
    tokens = tb.alloc_tokens(allocator, 6)
    rows, lens = tb.fill_requests(req_to_token, [tokens[:3].tolist(), tokens[3:].tolist()])
    fb = tb.make_forward_batch(draft, "decode", req_pool_indices=rows, seq_lens=lens, out_cache_loc=tokens[[2, 5]])
    full_rows = torch.stack([tokens[:3], tokens[3:]])
    return SimpleNamespace(target_pool=target_pool, draft_pool=draft_pool, draft=draft, fb=fb,
                           loc=tokens[[2, 5]], full_rows=full_rows, swa_rows=tb.translate(draft_pool, full_rows))


@pytest.mark.parametrize("sglang_code", ["with_fix", "stock"])
def test_mtp_draft_with_its_own_swa_pool(sglang_code):
    """A hybrid MTP draft (MiMo-V2 multi-layer EAGLE with --speculative-attention-mode
    decode builds one trtllm_mha backend per MTP runner) must resolve its own SWA pool, so
    its sliding layer gets SWA-space cache locations and page table and reads its own SWA
    buffer. The allocator's pool is the target's, whose layer 0 is full attention: stock
    0.5.10-0.5.12 resolve that one and hand the draft's sliding layer full-pool indices."""
    if sglang_code == "stock" and FORM not in ("allocator", "#26966"):
        pytest.skip(f"this sglang resolves the draft's own SWA pool ({DETECTION.reason})")
    w = _mtp_world()
    assert not torch.equal(w.swa_rows, w.full_rows), "index spaces must diverge for this test to mean anything"
    with (fix_applied() if sglang_code == "with_fix" else stock_sglang()):
        backend = tb.build_backend_via_registry(w.draft, "trtllm_mha")
    cache_loc, page_table, k_buffer = handed_to_kernel(backend, w.fb, _layer(0))
    if sglang_code == "with_fix":
        assert backend._swa_kv_pool is w.draft_pool
        assert torch.equal(cache_loc, tb.translate(w.draft_pool, w.loc))
        assert torch.equal(page_table, w.swa_rows // w.draft_pool.page_size)
        assert _storage(k_buffer) == _storage(w.draft_pool.get_key_buffer(0))
    else:  # the bug: the target's pool, whose layer 0 is full: no translation at all
        assert backend._swa_kv_pool is w.target_pool
        assert torch.equal(cache_loc, w.loc) and torch.equal(page_table, w.full_rows)


# ---------------------------------------------------------------------------- forms from main


@pytest.mark.skipif(FORM not in ("#25103", "#26966"), reason="no main-only form here (nox -s mainwindow: S1, S2, S4)")
def test_form_from_main_is_detected_and_corrected():
    """Upstream main's own code carrying #25103 (pool type only) or #26966 (allocator only):
    detected by name, its bug shown on stock sglang, corrected by the fix."""
    det = FIX.detect()
    assert det.verdict is Verdict.NEEDED and FORM in det.reason, det
    w = make_world()
    runners = {c: make_runner(w, c) for c in ("target", "eagle_draft") + (("frozen_kv_draft",) if HAS_FROZEN_KV else ())}

    def resolved(case):
        return [b._swa_kv_pool for b in build_backends(runners[case][0], case).values()]

    with stock_sglang():
        if FORM == "#26966":  # the EAGLE draft takes the target's SWA pool
            assert all(p is w.swa_pool for p in resolved("eagle_draft"))
        else:  # the FROZEN_KV draft gets none
            assert HAS_FROZEN_KV and all(p is None for p in resolved("frozen_kv_draft"))
    with fix_applied():
        for case, (runner, want) in runners.items():
            found = [p for where, backend in build_backends(runner, case).items()
                     for p in problems(backend, want, f"{FORM}/{case}/{where}")]
            assert not found, "\n".join(found)


# ---------------------------------------------------------------------------- installation


def test_install_touches_only_the_constructor():
    """Resolution runs once per construction: no method used per forward step is wrapped."""
    if not NEEDED:
        pytest.skip(f"nothing is installed here ({DETECTION.reason})")
    with stock_sglang():
        before = dict(vars(Backend))
        with temporarily_installed(FIX):
            changed = sorted(k for k, v in vars(Backend).items() if before.get(k) is not v)
            assert changed == ["__init__"] and _in_effect()
            assert FIX.detect().verdict is Verdict.NEEDED  # detection reads through our wrapper
        assert dict(vars(Backend)) == before


def test_reproduce_for_check():
    with stock_sglang():
        assert FIX.reproduce() is NEEDED
        if NEEDED:
            with temporarily_installed(FIX):
                assert FIX.reproduce() is False


@pytest.mark.skipif(not HAS_PLUGIN_FRAMEWORK, reason="this sglang has no plugin framework")
@pytest.mark.parametrize("enabled", ("1", "0"))
def test_real_loading_path(enabled):
    """sglang's load_plugins() in a fresh process; then the EAGLE draft's backends."""
    if not NEEDED:
        pytest.skip(f"nothing is installed here ({DETECTION.reason})")
    proc = run_child(
        """
        from sglang.srt.plugins import load_plugins
        load_plugins()
        import sglang_swa_plugin
        from sglang_swa_plugin.check import testbed as tb
        swa = tb.make_swa_pool(); alloc = tb.make_swa_allocator(swa); tb.diverge(alloc)
        r2t = tb.make_req_to_token_pool()
        target = tb.make_model_runner(kv_pool=swa, allocator=alloc, req_to_token_pool=r2t, spec_algorithm="EAGLE")
        draft = tb.make_model_runner(kv_pool=tb.make_full_pool(), allocator=alloc, req_to_token_pool=r2t,
                                     is_draft_worker=True, spec_algorithm="EAGLE", server_args=target.server_args,
                                     model="llama")
        fac = tb.build_draft_backends_via_factory(draft)
        drafts = [fac.draft_extend] + [b for b in fac.decode.attn_backends if b is not None]
        print("RESULT=" + json.dumps({
            "fix": sglang_swa_plugin.status()["fixes"].get("trtllm_swa_pool"),
            "target_swa": tb.build_backend_via_registry(target)._swa_kv_pool is swa,
            "drafts_swa": [b._swa_kv_pool is swa for b in drafts],
        }))
        """,
        SGLANG_SWA_PLUGIN=enabled,
        HF_HUB_OFFLINE="1",
    )
    res = child_json(proc)
    assert res["target_swa"] is True
    if enabled == "1":
        assert res["fix"]["status"] == "applied" and res["fix"]["in_effect"], res["fix"]
        assert res["drafts_swa"] and not any(res["drafts_swa"])
    else:
        assert res["fix"]["status"] == "disabled"
        # Stock sglang: the bug (#25103's pool-type rule gets EAGLE drafts right, FROZEN_KV ones wrong).
        assert all(res["drafts_swa"]) if FORM != "#25103" else not any(res["drafts_swa"])
