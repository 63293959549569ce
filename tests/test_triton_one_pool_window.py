"""triton_one_pool_window on a real TritonAttnBackend built on a one-KV-pool model runner (CPU): a
real ``ModelConfig`` of a tiny MiMo-V2 read with ``disable_hybrid_swa_memory``, a real
``MHATokenToKVPool`` and allocator, the runner's window as sglang resolves it. Stock: the backend
gets no window and builds no window buffers; with the fix it gets the model's window for the
build only, and a sliding layer's decode reads the last window keys (the pool's own ids)."""

from __future__ import annotations

import importlib

import pytest
import torch

from sglang_swa_plugin.check import triton_one_pool_window as scen
from sglang_swa_plugin.core import temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import triton_one_pool_window as tw
from sglang_swa_plugin.probe import function_text, optional_module, own_function

from helpers import fix_in_effect, fixed_alone, methods_alone, scenario_or_skip, skip_unless_needed

FIX = tw.FIX
WINDOW = scen.WINDOW
# On 0.5.10 importing the model runner runs the start-up hook, which installs the needed fixes:
# imported first, so that the tests below peel the fix off what sglang really holds.
importlib.import_module("sglang.srt.model_executor.model_runner")


def _methods():
    mod = importlib.import_module(tw.MODULE)
    out = {mod.TritonAttnBackend: ("__init__",)}
    if hasattr(mod, "TritonMultiStepDraftBackend"):
        out[mod.TritonMultiStepDraftBackend] = ("__init__",)
    return out


def _scenario():
    return scenario_or_skip("triton_one_pool_window")


class _OwnWindowModel(torch.nn.Module):
    """A model with its own window method (as Gemma or GPT-OSS): the runner's window is its answer."""

    def get_attention_sliding_window_size(self):
        return None


def test_detection_is_decided():
    assert FIX.detect().verdict is not Verdict.UNKNOWN, FIX.detect().reason


def test_detection_reads_the_installed_code():
    """Needed exactly where triton copies the runner's window, the runner's rule takes the
    config's window only ``if model_config.is_hybrid_swa`` and ModelConfig sets that with
    ``disable_hybrid_swa_memory`` (read here as text); the multi-step draft backend is hooked
    where it reads the runner's window itself."""
    mod = optional_module(tw.MODULE)
    if mod is None:
        assert FIX.detect().verdict is Verdict.NOT_APPLICABLE
        return
    from sglang.srt.configs.model_config import ModelConfig

    rule = tw.window_rule()
    assert rule is not None and "get_attention_sliding_window_size" in function_text(rule)
    copies = "model_runner.sliding_window_size" in function_text(mod.TritonAttnBackend.__init__)
    gated = "model_config.is_hybrid_swa" in "".join(function_text(rule).split())
    derive = own_function(ModelConfig, "_derive_hybrid_model") or ModelConfig.__init__
    one_pool = "disable_hybrid_swa_memory" in function_text(derive).split("self.is_hybrid_swa =", 1)[1][:300]
    det = FIX.detect()
    assert (det.verdict is Verdict.NEEDED) == (copies and gated and one_pool), det
    multi = getattr(mod, "TritonMultiStepDraftBackend", None)
    reads = multi is not None and "model_runner.sliding_window_size" in function_text(multi.__init__)
    assert det.targets == ((tw.INIT, tw.MULTI_INIT) if reads else (tw.INIT,)), det.targets


def test_the_scenario_config_is_sglangs_one_pool_form():
    """The scenario's ModelConfig is sglang's: a hybrid SWA architecture with a window, made not
    hybrid by disable_hybrid_swa_memory alone; the runner's window as sglang resolves it."""
    from sglang.srt.configs.model_config import ModelConfig, is_hybrid_swa_model

    cfg = scen.model_config(one_pool=True)
    assert type(cfg) is ModelConfig and is_hybrid_swa_model(cfg.hf_config.architectures)
    assert (cfg.is_hybrid_swa, cfg.disable_hybrid_swa_memory, cfg.sliding_window_size) == (False, True, WINDOW)
    assert cfg.attention_chunk_size is None
    runner = scen.build_runner()
    if FIX.detect().verdict is Verdict.NEEDED:
        assert runner.sliding_window_size is None


def test_stock_triton_on_one_pool_has_no_window():
    skip_unless_needed(FIX)
    with methods_alone(FIX, _methods()):
        out = _scenario()
    assert out.bug, out.seen
    seen = out.seen
    assert (seen["runner_window"], seen["backend_window"], seen["window_buffers"]) == (None, None, False), seen
    assert not seen["graph_window_buffer"] and not seen["decode"]["right"], seen
    assert "None" in seen["decode"]["why"], seen


def test_the_fix_gives_the_backend_the_models_window_and_buffers():
    if FIX.detect().verdict is Verdict.NOT_APPLICABLE:
        pytest.skip(f"not applicable here: {FIX.detect().reason}")
    with fixed_alone(FIX, _methods()):
        out = _scenario()
    assert not out.bug, out.seen
    seen = out.seen
    assert (seen["backend_window"], seen["window_buffers"], seen["graph_window_buffer"]) == (WINDOW, True, True), seen
    assert seen["runner_window_after"] == seen["runner_window"], seen  # the runner keeps sglang's window
    assert seen["decode"]["right"], seen


def test_it_composes_with_triton_swa_window():
    """Both fixes in effect: the backend has the model's window, and triton_swa_window's decode
    reads window + 1 keys, its CUDA-graph buffer sized for them."""
    from sglang_swa_plugin.hooks import triton_swa_window

    skip_unless_needed(FIX)
    skip_unless_needed(triton_swa_window.FIX)
    with fixed_alone(FIX, _methods()), fix_in_effect(triton_swa_window.FIX):
        runner = scen.build_runner()
        backend = scen.make_backend(runner)
        backend.init_cuda_graph_state(4, 4)
        decode = scen._decode(runner, backend)
    assert backend.sliding_window_size == WINDOW and runner.sliding_window_size is None
    assert backend.cuda_graph_window_kv_indices.numel() >= 4 * (WINDOW + 1)
    assert decode == {"right": True, "keys": [WINDOW + 1, 5, WINDOW + 1]}, decode


def test_the_multi_step_draft_backend_gets_the_window_too():
    """The MTP draft's multi-step decode backend (one TritonAttnBackend per step; 0.5.23+ it reads
    the runner's window itself, for its own window rail): the window on every step, stock none."""
    mod = importlib.import_module(tw.MODULE)
    if not hasattr(mod, "TritonMultiStepDraftBackend"):
        pytest.skip("no multi-step draft backend")
    skip_unless_needed(FIX)
    runner = scen.build_runner(spec_algorithm="EAGLE")
    with methods_alone(FIX, _methods()):
        stock = scen.make_backend(runner, "TritonMultiStepDraftBackend", 1, 3)
    with fixed_alone(FIX, _methods()):
        fixed = scen.make_backend(runner, "TritonMultiStepDraftBackend", 1, 3)
    assert [b.sliding_window_size for b in stock.attn_backends] == [None, None]
    assert [b.sliding_window_size for b in fixed.attn_backends] == [WINDOW, WINDOW]
    assert all(b.window_kv_indptr is not None for b in fixed.attn_backends)
    if "sliding_window_size" in vars(fixed):  # 0.5.23+: the multi-step backend's own window rail
        assert (stock.sliding_window_size, fixed.sliding_window_size) == (None, WINDOW)
        assert stock.window_kv_indptr is None and fixed.window_kv_indptr is not None
    assert runner.sliding_window_size is None


def test_the_runners_window_is_the_models_only_inside_init_and_restored_after_an_error():
    runner = scen.build_runner()
    if runner.sliding_window_size is not None:
        pytest.skip("this sglang gives a one-pool runner its window")
    seen = []

    def init(self, model_runner, *args, **kwargs):
        seen.append(model_runner.sliding_window_size)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        tw._one_pool_window(init, object(), runner)
    assert seen == [WINDOW] and runner.sliding_window_size is None
    assert "sliding_window_size" in vars(runner)  # restored as the attribute it was


def test_nested_hooks_are_a_no_op():
    """The multi-step draft backend's hook around the backends it builds (0.5.23+), or the hook
    applied twice: the inner one sees the window set and changes nothing; both restore."""
    runner = scen.build_runner()
    if runner.sliding_window_size is not None:
        pytest.skip("this sglang gives a one-pool runner its window")
    seen = []

    def init(self, model_runner):
        seen.append(model_runner.sliding_window_size)
        return tw._one_pool_window(lambda self, mr: seen.append(mr.sliding_window_size), self, model_runner)

    tw._one_pool_window(init, object(), runner)
    assert seen == [WINDOW, WINDOW] and runner.sliding_window_size is None


def test_a_hybrid_pool_runner_is_left_untouched():
    """Two pools: ModelConfig says hybrid, sglang gives the runner the window itself; the hook
    does nothing, even where the runner's window were None."""
    runner = scen.build_runner(one_pool=False)
    assert runner.model_config.is_hybrid_swa and runner.sliding_window_size == WINDOW
    assert tw.one_pool_window(runner) is None
    runner.sliding_window_size = None
    assert tw.one_pool_window(runner) is None
    with fix_in_effect(FIX):
        runner.sliding_window_size = WINDOW
        backend = scen.make_backend(runner)
    assert backend.sliding_window_size == WINDOW and runner.sliding_window_size == WINDOW


def test_a_model_with_its_own_window_method_is_left_untouched():
    """The runner's window is the model's answer (None here): the hybrid pool would give the
    backend that too, so the hook keeps it."""
    runner = scen.build_runner(model=_OwnWindowModel())
    assert runner.sliding_window_size is None
    assert tw.one_pool_window(runner) is None
    with fixed_alone(FIX, _methods()):
        backend = scen.make_backend(runner)
    assert backend.sliding_window_size is None and runner.sliding_window_size is None


def test_a_model_that_is_not_hybrid_swa_is_left_untouched():
    """The same config (a window field included) under an architecture sglang does not call
    hybrid SWA, with disable_hybrid_swa_memory: sglang gives it no window, nor does the hook."""
    runner = scen.build_runner(arch="LlamaForCausalLM")
    assert runner.model_config.sliding_window_size == WINDOW and runner.sliding_window_size is None
    assert tw.one_pool_window(runner) is None


def test_the_hook_reads_only_a_one_pool_runner():
    """With one pool, a hybrid SWA architecture and a config window: that window (the hybrid
    pool's); a chunked config (Llama 4 keeps its chunk) or no config window: nothing."""
    runner = scen.build_runner()
    runner.sliding_window_size = None
    assert tw.one_pool_window(runner) == WINDOW
    runner.model_config.attention_chunk_size = 32
    assert tw.one_pool_window(runner) is None
    runner.model_config.attention_chunk_size = None
    runner.model_config.sliding_window_size = None
    assert tw.one_pool_window(runner) is None


def test_check_runs_the_scenario_without_and_with_the_fix():
    skip_unless_needed(FIX)
    with methods_alone(FIX, _methods()):
        assert FIX.reproduce() is True
        with temporarily_installed(FIX):
            assert FIX.reproduce() is False
