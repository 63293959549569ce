"""flashinfer: ragged prefill on sliding-window layers attends to the window.
Bug
    The ragged prefill wrapper (the extend keys of every prefill, alone without a cached
    prefix) is one wrapper for all layers, planned without ``window_left``; without a prefix
    it also runs without it: sliding layers attend the whole prompt. On an H100 (0.5.11,
    Gemma 4 target) 38 of 96 requests differ from the model at the first token. With a
    prefix (0.5.13+) the window is passed at run time only, against a plan without it.
    Fix: a second ragged wrapper, planned with the sliding window, runs the sliding layers.
Upstream PRs
    None for the prefix-free branch (unchanged through 0.5.23); related: #26513, #31501.
Affected versions
    0.5.10-0.5.23. Status by release: applied 0.5.10+.
Detection
    Structural: ``FlashInferAttnBackend.__init__`` builds one
    ``BatchPrefillWithRaggedKVCacheWrapper`` and ``forward_extend`` calls its ``forward``
    without ``window_left``: needed; every ragged call with ``window_left`` and a plan with
    it: not needed; no ragged wrapper: not applicable; anything else: unknown.
Delete when
    sglang plans and runs the sliding layers' ragged prefill with the window.
"""

from __future__ import annotations

import ast

from sglang_swa_plugin.fix import Detection, Fix, argument, around, hookimpl
from sglang_swa_plugin.probe import function_tree, nodes, optional_module, own_function, swapped

MODULE = "sglang.srt.layers.attention.flashinfer_backend"
BACKEND = MODULE + ".FlashInferAttnBackend"
INIT, EXTEND = BACKEND + ".__init__", BACKEND + ".forward_extend"
WRAPPER = "BatchPrefillWithRaggedKVCacheWrapper"


class WindowedRagged:
    """sglang's ragged prefill wrapper and a twin planned with the sliding window: every plan
    goes to both; a run goes to the twin while a layer with that window runs (``layer_window``,
    set around ``forward_extend``), else to sglang's. Anything else reads sglang's wrapper."""

    def __init__(self, full, windowed, window: int):
        self.full, self.windowed, self.window, self.layer_window = full, windowed, window, None

    def begin_forward(self, *args, **kwargs):
        self.full.begin_forward(*args, **kwargs)
        self.windowed.begin_forward(*args, **{**kwargs, "causal": True, "window_left": self.window})

    plan = begin_forward

    def _run(self, method: str, args, kwargs):
        if self.layer_window == self.window:
            return getattr(self.windowed, method)(*args, **{**kwargs, "window_left": self.window})
        return getattr(self.full, method)(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self._run("forward", args, kwargs)

    def forward_return_lse(self, *args, **kwargs):
        return self._run("forward_return_lse", args, kwargs)

    def __getattr__(self, name):
        return getattr(self.full, name)


def _with_windowed_ragged(original, self, *args, **kwargs):
    """Around ``FlashInferAttnBackend.__init__``: the ragged wrapper sglang builds is paired with
    a twin built alike, where the backend serves sliding-window layers."""
    mod = optional_module(MODULE)
    cls, made = getattr(mod, WRAPPER), []

    def build(*a, **k):
        made.append((a, k, cls(*a, **k)))
        return made[-1][2]

    with swapped(mod, WRAPPER, build):
        result = original(self, *args, **kwargs)
    window = getattr(argument(original, "model_runner", args, kwargs), "sliding_window_size", None)
    ragged = getattr(self, "prefill_wrapper_ragged", None)
    if window is None or window < 0 or len(made) != 1 or ragged is not made[0][2]:
        return result
    a, k, _ = made[0]
    pair = WindowedRagged(ragged, cls(*a, **k), window)
    for owner in (self, getattr(self, "indices_updater_prefill", None)):
        if getattr(owner, "prefill_wrapper_ragged", None) is ragged:
            owner.prefill_wrapper_ragged = pair
    return result


def _layer_window(original, self, *args, **kwargs):
    """Around ``forward_extend``: the ragged pair knows which window the running layer has."""
    pair = getattr(self, "prefill_wrapper_ragged", None)
    if not isinstance(pair, WindowedRagged):
        return original(self, *args, **kwargs)
    pair.layer_window = getattr(argument(original, "layer", args, kwargs), "sliding_window_size", None)
    try:
        return original(self, *args, **kwargs)
    finally:
        pair.layer_window = None


def _ragged_calls(fn, method_names) -> list:
    """Calls ``<...>.prefill_wrapper_ragged.<method>(...)`` in ``fn`` (syntax tree)."""
    tree = function_tree(fn)[0]
    return [n for n in nodes(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in method_names and isinstance(n.func.value, ast.Attribute)
            and n.func.value.attr == "prefill_wrapper_ragged"]


def classify() -> Detection:
    mod = optional_module(MODULE)
    cls = getattr(mod, "FlashInferAttnBackend", None) if mod is not None else None
    if cls is None:
        return Detection.not_applicable("this sglang has no flashinfer attention backend")
    init, extend = own_function(cls, "__init__"), own_function(cls, "forward_extend")
    if init is None or extend is None:
        return Detection.unknown("FlashInferAttnBackend lacks __init__ or forward_extend")
    builds = [n for n in nodes(function_tree(init)[0]) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == WRAPPER]
    runs = _ragged_calls(extend, {"forward", "forward_return_lse"})
    if not builds:
        return Detection.not_applicable("FlashInferAttnBackend builds no ragged prefill wrapper")
    if len(builds) != 1 or not runs:
        return Detection.unknown("FlashInferAttnBackend's ragged prefill is not one wrapper run from forward_extend")
    if all(any(k.arg == "window_left" for k in call.keywords) for call in runs):
        return Detection.unknown("every ragged prefill run passes window_left: check its plan before hooking")
    return Detection.needed("the ragged prefill of sliding-window layers runs without window_left (whole prompt)",
                            around(INIT, _with_windowed_ragged), around(EXTEND, _layer_window))


class FlashinferSwaPrefillFix(Fix):
    name = "flashinfer_swa_prefill"
    summary = "flashinfer ragged prefill on sliding-window layers: a twin wrapper planned and run with the window"
    upstream_prs = ("#26513", "#31501")
    targets = (INIT, EXTEND)
    target_params = {INIT: ("self", "model_runner"), EXTEND: ("self", "q", "k", "v", "layer", "forward_batch")}
    check_module = "sglang_swa_plugin.check.flashinfer_swa_prefill"

    def detect(self) -> Detection:
        return classify()


FIX = FlashinferSwaPrefillFix()


@hookimpl
def sglang_swa_plugin_fixes():
    return [FIX]
