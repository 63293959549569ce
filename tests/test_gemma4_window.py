"""gemma4_window on sglang's real Gemma4Attention (CPU, tensor parallelism of one process): a
sliding layer's RadixAttention must attend the keys transformers' own mask gives the model
(``config.sliding_window`` keys, the query's own included), as the model runner's window does."""

from __future__ import annotations

import ast

import pytest

from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import gemma4_window as gw

from helpers import fixed_alone, methods_alone, scenario_or_skip, skip_unless_needed

FIX = gw.FIX


def _methods():
    from sglang_swa_plugin.probe import optional_module

    mod = optional_module(gw.MODULE)
    return {mod.Gemma4Attention: ("__init__",)} if mod is not None else {}


def _scenario():
    return scenario_or_skip("gemma4_window")


def test_detection_is_decided():
    assert FIX.detect().verdict is not Verdict.UNKNOWN, FIX.detect().reason


def test_stock_sliding_layers_attend_one_key_more_than_the_model():
    skip_unless_needed(FIX)
    with methods_alone(FIX, _methods()):
        out = _scenario()
    assert out.bug, out.seen
    sliding = out.seen["sliding_attention"]
    assert (sliding["model"], sliding["layer"], sliding["runner"]) == (16, 17, 16), out.seen


def test_every_layer_attends_the_models_keys_with_the_fix():
    """Where the fix is needed it makes the layer right; where it is not, stock is right."""
    if FIX.detect().verdict is Verdict.NOT_APPLICABLE:
        pytest.skip(f"not applicable here: {FIX.detect().reason}")
    with fixed_alone(FIX, _methods()):
        out = _scenario()
    assert not out.bug, out.seen
    assert out.seen["sliding_attention"]["sliding_window_size"] == 15, out.seen
    assert out.seen["full_attention"]["sliding_window_size"] == -1, out.seen


def test_the_hook_leaves_a_layer_with_the_models_window_alone():
    """A layer whose window is already ``sliding_window - 1`` (or a full layer) is not moved:
    applying the hook's work twice changes nothing."""
    from types import SimpleNamespace

    def init(self, layer_id, config):
        self.sliding_window = config.sliding_window - 1
        self.attn = SimpleNamespace(sliding_window_size=config.sliding_window - 1)

    layer, config = SimpleNamespace(), SimpleNamespace(sliding_window=16)
    gw._model_window(init, layer, 0, config)
    assert (layer.sliding_window, layer.attn.sliding_window_size) == (15, 15)

    def stock(self, layer_id, config):
        self.sliding_window = config.sliding_window
        self.attn = SimpleNamespace(sliding_window_size=config.sliding_window)

    gw._model_window(stock, layer, 0, config)
    assert (layer.sliding_window, layer.attn.sliding_window_size) == (15, 15)


def test_detection_reads_the_installed_assignment():
    """Needed exactly where the installed ``Gemma4Attention.__init__`` assigns
    ``config.sliding_window`` itself (read from its file, as the fix does)."""
    init = gw._init_tree()
    if init is None:
        assert FIX.detect().verdict is Verdict.NOT_APPLICABLE
        return
    text = ast.unparse(init)
    raw = "config.sliding_window if layer_type" in text
    assert (FIX.detect().verdict is Verdict.NEEDED) == raw, text[:400]
    assert (FIX.detect().verdict is Verdict.NOT_NEEDED) == ("get_attention_sliding_window_size(config)" in text)
