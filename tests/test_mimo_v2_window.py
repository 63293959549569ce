"""mimo_v2_window on sglang's real MiMo-V2 target and MTP draft (CPU, tensor parallelism of one
process): a sliding layer's RadixAttention and the model runner's window must attend the keys
transformers' MiMoV2FlashForCausalLM gives the model (``sliding_window`` keys, the query's own
included). On the GPU (sglang 0.5.11, the selftest's MiMo-V2 target, fa3 and triton, three
prompt seeds): stock's tokens are the float32 reference's at window 17, 32/32 of every seed;
with the fix, the model's (window 16), 32/32 on fa3 and triton, plain and with multi-layer
EAGLE (tests/gpu/RESULTS.md)."""

from __future__ import annotations

import ast


from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import mimo_v2_window as mw

from helpers import assert_fixed_window_is_the_models, assert_stock_window_one_key_more

FIX = mw.FIX


def _methods():
    from sglang_swa_plugin.probe import optional_module

    out = {}
    for module, nextn, model in mw.FORMS:
        mod, draft = optional_module(module), optional_module(nextn)
        if mod is not None:
            out.update({mod.MiMoV2Attention: ("__init__",), getattr(mod, model): ("__init__",)})
        if draft is not None:
            out[draft.MiMoV2MTP] = ("__init__",)
    return out


def test_detection_is_decided():
    assert FIX.detect().verdict is not Verdict.UNKNOWN, FIX.detect().reason


def test_stock_sliding_layers_and_the_runner_attend_one_key_more_than_the_model():
    assert_stock_window_one_key_more(FIX, _methods(), "mimo_v2_window")


def test_every_layer_and_the_runner_attend_the_models_keys_with_the_fix():
    """Where the fix is needed it makes the layers and the runner right; where it is not, stock is."""
    assert_fixed_window_is_the_models(FIX, _methods(), "mimo_v2_window")


def test_the_hooks_leave_full_layers_and_a_model_with_its_own_window_alone():
    from types import SimpleNamespace

    def attention(self, hidden_size, sliding_window_size=-1):
        self.window = sliding_window_size

    layer = SimpleNamespace()
    mw._layer_window(attention, layer, 64)
    assert layer.window == -1
    mw._layer_window(attention, layer, 64, sliding_window_size=16)
    assert layer.window == 15

    def model(self, config):
        self.config = config

    plain, own = SimpleNamespace(), SimpleNamespace(get_attention_sliding_window_size=lambda: 7)
    mw._runner_window(model, plain, SimpleNamespace(sliding_window_size=16))
    mw._runner_window(model, own, SimpleNamespace(sliding_window_size=16))
    assert plain.get_attention_sliding_window_size() == 15 and own.get_attention_sliding_window_size() == 7
    bare = SimpleNamespace()
    mw._runner_window(model, bare, SimpleNamespace(sliding_window_size=None))
    assert not hasattr(bare, "get_attention_sliding_window_size")


def test_detection_reads_the_installed_layer():
    """Needed exactly where the installed decoder layer passes ``config.sliding_window_size``
    itself and the module has no window method (read from its file, as the fix does)."""
    form = mw._form()
    if form is None:
        assert FIX.detect().verdict is Verdict.NOT_APPLICABLE
        return
    text = ast.unparse(mw.module_tree(form[0]))
    raw = "sliding_window_size=config.sliding_window_size" in text and mw.MODEL_METHOD not in text
    assert (FIX.detect().verdict is Verdict.NEEDED) == raw, FIX.detect().reason
