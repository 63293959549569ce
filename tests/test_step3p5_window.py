"""step3p5_window on sglang's real Step3.5 target and MTP draft (CPU, tensor parallelism of one
process): a sliding layer's RadixAttention and the model runner's window must attend the keys
transformers' Step3p7 text model (the model type ``step3p5`` in transformers) gives the model
(``sliding_window`` keys, the query's own included)."""

from __future__ import annotations

import ast


from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import step3p5_window as sw

from helpers import assert_fixed_window_is_the_models, assert_stock_window_one_key_more, has_module

FIX = sw.FIX


def _methods():
    """The classes the fix may hook, as imported on this machine (Step3.7's wrapper only where
    its module imports on a CPU)."""
    import importlib

    out = {}
    for target in sw.TARGETS:
        module, cls = target.rsplit(".", 2)[:2]
        if has_module(module):
            try:
                out[getattr(importlib.import_module(module), cls)] = ("__init__",)
            except ImportError:
                continue
    return out


def test_detection_is_decided():
    assert FIX.detect().verdict is not Verdict.UNKNOWN, FIX.detect().reason


def test_stock_sliding_layers_and_the_runner_attend_one_key_more_than_the_model():
    assert_stock_window_one_key_more(FIX, _methods(), "step3p5_window")


def test_every_layer_and_the_runner_attend_the_models_keys_with_the_fix():
    """Where the fix is needed it makes the layers and the runner right; where it is not, stock is."""
    assert_fixed_window_is_the_models(FIX, _methods(), "step3p5_window", runners=("target_0", "mtp_0"))


def test_the_hooks_leave_full_layers_and_a_model_with_its_own_window_alone():
    from types import SimpleNamespace

    def attention(self, hidden_size, num_heads=4, num_kv_heads=1, layer_id=0, sliding_window_size=-1):
        self.window = sliding_window_size

    layer = SimpleNamespace()
    sw._layer_window(attention, layer, 64)
    assert layer.window == -1
    sw._layer_window(attention, layer, 64, 4, 1, 0, 16)
    assert layer.window == 15
    sw._layer_window(attention, layer, 64, sliding_window_size=16)
    assert layer.window == 15

    def model(self, config, quant_config=None):
        self.config = config

    plain, own = SimpleNamespace(), SimpleNamespace(get_attention_sliding_window_size=lambda: 7)
    sw._runner_window(model, plain, SimpleNamespace(sliding_window=16))
    sw._runner_window(model, own, SimpleNamespace(sliding_window=16))
    assert plain.get_attention_sliding_window_size() == 15 and own.get_attention_sliding_window_size() == 7
    wrapper = SimpleNamespace()  # Step3.7: the text config carries the window
    sw._runner_window(model, wrapper, SimpleNamespace(text_config=SimpleNamespace(sliding_window=16)))
    assert wrapper.get_attention_sliding_window_size() == 15
    bare = SimpleNamespace()
    sw._runner_window(model, bare, SimpleNamespace(sliding_window=None))
    assert not hasattr(bare, "get_attention_sliding_window_size")


def test_detection_reads_the_installed_layer():
    """Needed exactly where the installed decoder layer sets its window to
    ``config.sliding_window`` itself and the module has no window method (read from its file,
    as the fix does); the plan hooks the MTP and Step3.7 models where their modules exist."""
    tree = sw.module_tree(sw.MODULE)
    if tree is None:
        assert FIX.detect().verdict is Verdict.NOT_APPLICABLE
        return
    text = ast.unparse(tree)
    raw = "self.sliding_window = config.sliding_window" in text and "sliding_window_size=self.sliding_window" in text \
        and sw.MODEL_METHOD not in text
    det = FIX.detect()
    assert (det.verdict is Verdict.NEEDED) == raw, det.reason
    if raw:
        hooked = set(det.targets)
        assert {sw.LAYER, sw.MODELS[0]} <= hooked
        assert (sw.MODELS[1] in hooked) == has_module(sw.MTP_MODULE)
        assert (sw.MODELS[2] in hooked) == has_module(sw.VL_MODULE)


def test_detection_of_other_forms():
    """A window minus one, a model method or a changed layer are decided apart from the stock
    form (the detection reads these shapes from a module's tree)."""
    from sglang_swa_plugin.probe import swapped

    def decided(src: str) -> Verdict:
        with swapped(sw, "module_tree", lambda name: ast.parse(src) if name == sw.MODULE else None):
            return sw.classify().verdict

    layer = ("class Step3p5DecoderLayer:\n    def __init__(self, config):\n        self.sliding_window = -1\n"
             "        if config.x:\n            self.sliding_window = {value}\n"
             "        self.self_attn = Step3p5Attention(sliding_window_size=self.sliding_window)\n")
    assert decided(layer.format(value="config.sliding_window")) is Verdict.NEEDED
    assert decided(layer.format(value="config.sliding_window - 1")) is Verdict.NOT_NEEDED
    assert decided(layer.format(value="config.other_window")) is Verdict.UNKNOWN
    method = "\nclass M:\n    def get_attention_sliding_window_size(self):\n        return 1\n"
    assert decided(layer.format(value="config.sliding_window") + method) is Verdict.NOT_NEEDED
    assert decided("class Step3p5DecoderLayer:\n    pass\n") is Verdict.UNKNOWN


def test_an_mtp_module_without_its_model_is_target_moved():
    """The MTP module is there but its model class is gone (renamed upstream): the fix is
    skipped naming it ("target moved"), never installed without the draft's hook."""
    from sglang_swa_plugin.core import safe_detect
    from sglang_swa_plugin.probe import swapped

    layer = ("class Step3p5DecoderLayer:\n    def __init__(self, config):\n"
             "        self.sliding_window = config.sliding_window\n"
             "        self.self_attn = Step3p5Attention(sliding_window_size=self.sliding_window)\n")
    trees = {sw.MODULE: layer, sw.MTP_MODULE: "class Step3p5RenamedMTP:\n    pass\n"}
    with swapped(sw, "module_tree", lambda name: ast.parse(trees[name]) if name in trees else None):
        det = safe_detect(FIX)
    assert det.verdict is Verdict.TARGET_MOVED and "Step3p5MTP" in det.reason, det
