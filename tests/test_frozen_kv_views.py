"""frozen_kv_views (seed 003): FROZEN_KV MTP views and CUDA-graph capture keep the draft
trtllm_mha backend's SWA state in step with the target SWAKVPool they swap in.

Real objects throughout: the target's SWAKVPool and SWA allocator (index spaces diverged
so that the request's full indices lie beyond the SWA pool), the draft's own full-only
pool, a real TRTLLMHAAttnBackend built on CPU, a real ForwardBatch, a real
FrozenKVMTPContext, sglang's own view functions, worker methods and CUDA-graph runner
(constructor, capture, replay). Only the Triton page-table kernels (0.5.14+, 0.5.15+) run as
CPU stand-ins; around the graph runner, torch's CUDA-graph runtime runs on the CPU
(tests/cpu_graph.py), the capture loop's process-group and GPU-memory queries are answered
for one CPU rank, and the draft model's forward (there is no model) is its SWA layer's
page-table read. The worker is sglang's class, not constructed (that loads a model): only
the attributes its methods read are set.

No release needs the fix. Seed 003's root cause (the backend resolves its SWA state from
the draft's own pool, #25103's pool-only rule) is upstream main's own code in the
``mainwindow`` nox sessions S1 and S4 (tests/main_window.py); there the tests check that the
fix corrects it, on releases that the released code needs nothing. Run with
FROZEN_KV_VIEWS_TEST_WITHOUT_FIX=1 to see them fail without the fix on S1/S4.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import statistics
import time
from types import SimpleNamespace

import pytest

from cpu_graph import CpuGraph
from helpers import child_json, has_module, needs_framework, run_child, snapshot_carries

from sglang_swa_plugin import core
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import frozen_kv_views as fkv
from sglang_swa_plugin.check import frozen_kv_views as fkv_check
from sglang_swa_plugin.patching import marked_by
from sglang_swa_plugin.probe import swapped

HAS_FROZEN_KV = has_module(fkv.UTILS)
needs_frozen_kv = pytest.mark.skipif(not HAS_FROZEN_KV, reason="this sglang has no FROZEN_KV MTP")
WITHOUT_FIX = os.environ.get("FROZEN_KV_VIEWS_TEST_WITHOUT_FIX") == "1"
# The installed code carries seed 003's root cause (upstream main with #25103, S1 and S4).
SEED_003 = snapshot_carries(fkv.FIX.name) is not None


def fixed():
    """The fix, installed for the block (nothing when demonstrating the tests without it)."""
    return contextlib.nullcontext() if WITHOUT_FIX else core.temporarily_installed(fkv.FIX)


def trtllm():
    return importlib.import_module(fkv.TRTLLM)


def utils():
    return importlib.import_module(fkv.UTILS)


def draft():
    d = fkv_check.frozen_kv_draft()
    if SEED_003:  # the seed's evidence: (False, None) cached at __init__
        assert d.backend._swa_kv_pool is None and not d.backend.use_sliding_window_kv_pool
    return d


def swa_state(backend):
    return {n: backend.__dict__[n] for n in (fkv.POOL, fkv.FLAG, fkv.MAPPING) if n in backend.__dict__}


def pools(d):
    """The pools the views swap: the backend's (0.5.13+), the batch's (0.5.12)."""
    return getattr(d.backend, "token_to_kv_pool", None), getattr(d.batch, "token_to_kv_pool", None)


def assert_follows_target(d):
    """The backend's SWA state describes the target pool, as its own code reads it: the SWA
    pool it translates with, its buffer guard, and the SWA layer's page table (SWA space,
    inside the SWA pool). (0.5.13 keeps use_sliding_window_kv_pool pool-based, False for a
    draft: there it guards KV writes only, which a frozen draft never does.)"""
    assert d.backend._swa_kv_pool is d.target_pool
    assert d.backend._alloc_swa_page_table(1, 1) is not None
    if fkv.MAPPING in d.backend.__dict__:
        assert d.backend._swa_full_to_swa_mapping is d.target_pool.full_to_swa_index_mapping
    assert fkv_check.swa_layer_pages(d) == fkv_check.expected_swa_pages(d)


def enter(view_name, d):
    view = getattr(utils(), view_name)
    return view(*fkv_check.view_args(view, d))


# ------------------------------------------------------------------------ detection


def test_detection_on_the_installed_sglang():
    det = core.safe_detect(fkv.FIX)
    if not HAS_FROZEN_KV:
        assert det.verdict is Verdict.NOT_APPLICABLE, det
    else:  # 0.5.12: allocator rule; 0.5.13+: _resolve_swa_kv_pool; main with #25103: needed
        assert det.verdict is (Verdict.NEEDED if SEED_003 else Verdict.NOT_NEEDED), det


@pytest.mark.skipif(not SEED_003, reason="needs upstream main carrying #25103 (nox -s mainwindow: S1, S4)")
def test_seed_003_root_cause_on_main_is_corrected():
    assert fkv.FIX.reproduce(), "the root cause must show the bug without the fix"
    with fixed():
        assert not fkv.FIX.reproduce()
        assert core.safe_detect(fkv.FIX).verdict is Verdict.NOT_NEEDED  # views now follow


@needs_frozen_kv
def test_not_needed_with_the_trtllm_swa_pool_fix_installed():
    """trtllm_swa_pool re-resolves every trtllm_mha backend's SWA pool (0.5.10-0.5.12);
    a FROZEN_KV draft must keep the target SWAKVPool under it."""
    with core.temporarily_installed(core.find_fix("trtllm_swa_pool")):
        assert fkv_check.scenario().seen == {name: True for name in fkv.VIEW_NAMES}
        det = core.safe_detect(fkv.FIX)
    if SEED_003 and det.verdict is Verdict.NEEDED:
        pytest.xfail("on #25103's constructor the detection executes sglang's own statements, not "
                     "trtllm_swa_pool's wrapper: both fixes install (redundant, harmless)")
    assert det.verdict is Verdict.NOT_NEEDED, det


@needs_frozen_kv
def test_check_shows_the_bug_where_the_code_has_it():
    assert fkv.FIX.has_scenario()
    assert fkv.FIX.reproduce() is SEED_003


# ------------------------------------------------------------------------ views


@needs_frozen_kv
@pytest.mark.parametrize("view_name", fkv.VIEW_NAMES)
def test_inside_each_view_the_swa_state_follows_the_pool(view_name):
    d = draft()
    before, pools_before = swa_state(d.backend), pools(d)
    with fixed():
        with enter(view_name, d):
            assert any(p is d.target_pool for p in pools(d))
            assert_follows_target(d)
            if SEED_003:  # cached False at __init__: the fix sets it
                assert d.backend.use_sliding_window_kv_pool is True
        assert swa_state(d.backend) == before and pools(d) == pools_before


@needs_frozen_kv
@pytest.mark.parametrize("view_name", fkv.VIEW_NAMES)
def test_state_is_restored_when_the_body_raises(view_name):
    d = draft()
    before, pools_before = swa_state(d.backend), pools(d)
    with fixed():
        with pytest.raises(KeyError, match="inside"):
            with enter(view_name, d):
                assert_follows_target(d)
                raise KeyError("inside")
    assert swa_state(d.backend) == before and pools(d) == pools_before


@needs_frozen_kv
def test_nested_views_restore_each_level():
    d = draft()
    before, pools_before = swa_state(d.backend), pools(d)
    with fixed():
        with enter("frozen_kv_target_view", d):
            outer = swa_state(d.backend)
            with enter("target_kv_pool_view", d):
                assert_follows_target(d)
                with enter("frozen_kv_target_view", d):
                    assert_follows_target(d)
                assert_follows_target(d)
            assert swa_state(d.backend) == outer
            assert_follows_target(d)
    assert swa_state(d.backend) == before and pools(d) == pools_before


def worker_class():
    for module, name in (("frozen_kv_mtp_worker_v2", "FrozenKVMTPDraftWorker"),
                         ("frozen_kv_mtp_worker", "FrozenKVMTPWorker")):
        mod = f"sglang.srt.speculative.{module}"
        if has_module(mod) and hasattr(importlib.import_module(mod), name):
            return importlib.import_module(mod), getattr(importlib.import_module(mod), name)
    pytest.skip("no FROZEN_KV MTP worker class")


def worker_for(d):
    """The real worker class, not constructed (that needs a GPU): only the two attributes
    its view and metadata methods read."""
    _, cls = worker_class()
    worker = object.__new__(cls)
    worker.kv_context, worker.draft_attn_backend = d.kv_context, d.backend
    return worker


@needs_frozen_kv
def test_worker_modules_call_the_wrapped_views():
    """The worker imported the views by name; its methods must reach the hooked ones."""
    mod, _ = worker_class()
    d = draft()
    worker = worker_for(d)
    with fixed():
        for name in fkv.VIEW_NAMES:
            assert marked_by(getattr(mod, name)) == fkv.FIX.name
            assert getattr(mod, name) is getattr(utils(), name)
        with worker._frozen_kv_target_view(d.batch):
            assert_follows_target(d)
        with worker._target_kv_pool_view(d.batch):
            assert_follows_target(d)


# ------------------------------------------------------------------------ capture


def runner_class():
    mod = importlib.import_module(fkv.RUNNER_MODULE)
    return mod.FrozenKVMTPCudaGraphRunner


class _CpuCudaGraph(CpuGraph):
    """``torch.cuda.CUDAGraph`` on the CPU (tests/cpu_graph.py), with the memory-pool handle
    sglang passes on to the next capture."""

    def pool(self):
        return None


@contextlib.contextmanager
def _cpu_cuda_graphs():
    """torch's CUDA-graph runtime on the CPU: ``torch.cuda.CUDAGraph``/``graph`` record and
    replay (cpu_graph.CpuGraph), ``torch.cuda.synchronize`` has nothing to wait for."""
    import torch

    with swapped(torch.cuda, "CUDAGraph", _CpuCudaGraph), \
            swapped(torch.cuda, "graph", lambda graph, pool=None, stream=None: graph.capture()), \
            swapped(torch.cuda, "synchronize", lambda *a, **k: None):
        yield


@contextlib.contextmanager
def _single_rank_capture_loop(module):
    """What sglang's generic capture loop (``CudaGraphRunner.capture``) asks of the GPU and
    of the process groups, answered for one CPU rank: the TP group's capture stream context,
    rank 0, attention TP/CP sizes 1, and the free GPU memory it prints."""
    patches = {"graph_capture": lambda *a, **k: contextlib.nullcontext(SimpleNamespace(stream=None)),
               "get_tensor_model_parallel_rank": lambda: 0, "get_attention_tp_size": lambda: 1,
               "get_attention_cp_size": lambda: 1, "get_available_gpu_memory": lambda *a, **k: 0.0}
    with contextlib.ExitStack() as stack:
        for name, stand_in in patches.items():
            if hasattr(module, name):
                stack.enter_context(swapped(module, name, stand_in))
        stack.enter_context(swapped(module, "global_graph_memory_pool", None))
        yield


def _graph_runner_world(d):
    """The real worker (not constructed: that needs a GPU) with what the real graph runner
    reads from it, and the draft model's forward pass (there is no model) replaced by what
    its SWA attention layer reads: the page table the backend hands the kernel, as the
    draft tokens' output (so a replayed graph shows what the kernel would read)."""
    worker = worker_for(d)
    worker._model_runner = d.runner  # TpModelWorker.model_runner, the draft_model_runner
    d.runner.model.backbone_hidden_size = 8  # what the worker's _recurrent_hidden_size reads
    d.runner.tp_group = SimpleNamespace(barrier=lambda: None)  # one rank
    d.runner.is_hybrid_swa = False  # the draft's own pool is full-only
    seen = []

    def draft_forward(forward_batch, **_):
        table = d.backend._get_layer_page_table(d.swa_layer, forward_batch)
        seen.append((d.backend._swa_kv_pool, table))
        pages = table[:, : len(d.tokens)].clone()
        return pages, pages, pages

    worker.draft_forward = draft_forward
    return worker, seen


def _draft_input(d):
    """sglang's own draft-loop input for one request (what the runner's replay copies)."""
    import torch

    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.frozen_kv_mtp_info import FrozenKVMTPDraftInput

    from sglang_swa_plugin.check import testbed

    return testbed._call_with_supported(
        FrozenKVMTPDraftInput, topk_p=torch.ones(1, 1), topk_index=torch.zeros(1, 1, dtype=torch.int64),
        hidden_states=torch.zeros(1, 8, dtype=d.runner.dtype), bonus_tokens=torch.zeros(1, dtype=torch.int64),
        capture_hidden_mode=CaptureHiddenMode.LAST)


@needs_frozen_kv
def test_real_graph_runner_allocates_binds_and_replays_the_swa_page_table():
    """sglang's own ``FrozenKVMTPCudaGraphRunner``: its constructor (which allocates the
    backend's CUDA-graph state, then captures every batch size through sglang's generic
    capture loop), its capture method (manual pool swap, the worker's real capture-metadata
    method) and its ``replay`` (the worker's real replay-metadata method, then the graph).
    Only torch's CUDA-graph runtime runs on the CPU (tests/cpu_graph.py), the single-rank
    process group and GPU-memory queries of the capture loop are answered for one CPU rank,
    and the draft model's forward is the SWA layer's page-table read (no model). The graph
    must read the request's SWA-space pages inside the SWA pool, from the buffer that
    ``init_cuda_graph_state`` allocated before capture."""
    cls = runner_class()
    capture_name = fkv.capture_target().rpartition(".")[2]
    if capture_name != "capture_one_batch_size":
        pytest.skip("0.5.14+ capture through DecodeCudaGraphRunner's graph backends (not emulated on CPU); "
                    "the fix is needed only on upstream main with #25103 (mainwindow S1, S4: this form)")
    from sglang.srt.model_executor import cuda_graph_runner

    d = draft()
    worker, seen = _graph_runner_world(d)
    args = d.runner.server_args
    before = swa_state(d.backend)
    with fixed(), _cpu_cuda_graphs(), _single_rank_capture_loop(cuda_graph_runner), \
            swapped(args, "cuda_graph_bs", [1]), fkv_check.cpu_kernels():
        runner = cls(worker)
        assert swa_state(d.backend) == before  # restored after construction and capture
        buffer = d.backend.decode_cuda_graph_metadata.get("swa_page_table")
        assert buffer is not None, "no SWA page-table buffer allocated before capture"
        assert seen and all(pool is d.target_pool for pool, _ in seen), "capture ran without the target SWA pool"
        assert all(t.data_ptr() == buffer.data_ptr() for _, t in seen), "capture read another table than the buffer"
        # A replay through the real runner: the request's batch, the graph then re-reads the buffer.
        d.batch.spec_info = _draft_input(d)
        out = runner.replay(d.batch)
    assert out[0][0].tolist() == fkv_check.expected_swa_pages(d), "the replayed graph read other pages"
    assert swa_state(d.backend) == before


# ------------------------------------------------------------------------ installation


@needs_framework
@needs_frozen_kv
def test_installs_through_sglangs_hook_registry():
    """The permanent path (sglang >= 0.5.11): registered on HookRegistry, applied by
    apply_hooks(), reaching the worker module's by-name copies."""
    proc = run_child(
        """
        import importlib
        from sglang_swa_plugin.hooks import frozen_kv_views as fkv
        from sglang_swa_plugin.patching import RegistryHooks, marked_by, target_marked_by
        from sglang.srt.plugins.hook_registry import HookRegistry
        for m in ("frozen_kv_mtp_worker", "frozen_kv_mtp_worker_v2"):
            try:
                importlib.import_module("sglang.srt.speculative." + m)
            except ImportError:
                pass
        hooks, det = RegistryHooks(fkv.FIX.name), fkv.FIX.detect()
        if WITH_FIX:
            hooks.install(det.plan)
        HookRegistry.apply_hooks()
        copies = {f"{m}.{n}": marked_by(getattr(mod, n))
                  for m, mod in list(sys.modules.items()) if m.startswith("sglang.")
                  for n in fkv.VIEW_NAMES if callable(getattr(mod, n, None))}
        print("RESULT=" + json.dumps({
            "targets": {t: target_marked_by(t) for t in det.targets}, "copies": copies}))
        """.replace("WITH_FIX", str(not WITHOUT_FIX))
    )
    got = child_json(proc)
    assert set(got["targets"].values()) == {fkv.FIX.name}, got
    assert len(got["copies"]) >= 4 and set(got["copies"].values()) == {fkv.FIX.name}, got


# ------------------------------------------------------------------------ cost


@needs_frozen_kv
def test_per_step_cost_is_attribute_swaps_only():
    """Per draft step the hook adds attribute reads/writes only: no torch call at all (so
    no tensor work and no host-device sync). Timing is printed (pytest -s)."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    class CountOps(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            CountOps.ops += 1
            return func(*args, **(kwargs or {}))

    d = draft()
    with fixed():
        wrapped = utils().target_kv_pool_view
        assert marked_by(wrapped) == fkv.FIX.name
        original = wrapped.__wrapped__
        args = fkv_check.view_args(wrapped, d)
        with Count(), CountOps():
            for _ in range(10):
                with wrapped(*args):
                    pass
        assert (Count.calls, CountOps.ops) == (0, 0)

        def per_step(view, n=2000):
            samples = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(n):
                    with view(*args):
                        pass
                samples.append((time.perf_counter() - t0) / n * 1e6)
            return statistics.median(samples)

        base, hooked = per_step(original), per_step(wrapped)
    print(f"\n[frozen_kv_views] view enter+exit: sglang {base:.2f} us, with the fix {hooked:.2f} us "
          f"(+{hooked - base:.2f} us per view, attribute swaps only; 0 torch calls)")
    # The figure is printed, not asserted: timing on a shared CPU is no test. What is
    # asserted above is structural: the wrapper makes no torch call at all.
