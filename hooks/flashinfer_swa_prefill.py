"""flashinfer: prefill on sliding-window layers is planned and run with the window.
Bug
    The ragged prefill wrapper is one wrapper for all layers, planned without ``window_left``
    and, without a cached prefix, run without it: sliding layers attend the whole prompt
    (requests wrong from the first token). With a cached prefix the sliding paged part reads
    keys up to the sequence's end, unwritten yet, unmasked (#26513, 0.5.10-0.5.12). Paged-only
    prefill (piecewise CUDA graphs) plans it without the window (#31501, 0.5.10-0.5.15).
    Fix: a ragged twin planned with the window runs the sliding layers; the paged sliding plan
    gets the window, and with a cached prefix the prefix's last window keys and a mask (#26513).
Upstream PRs
    None for the ragged branch (unchanged through 0.5.23); #26513 (0.5.13); #31501 (0.5.16).
Affected versions
    0.5.10-0.5.23 (cached prefix: 0.5.10-0.5.12; paged plan: 0.5.10-0.5.15). Status by release: applied 0.5.10+.
Detection
    Structural: ``forward_extend`` runs ``prefill_wrapper_ragged`` without ``window_left``: needed;
    the window plan passes no ``window_left`` (paged part) / has no ``if use_ragged`` branch
    (prefix part). No flashinfer backend: not applicable; no ragged wrapper: target moved;
    anything else: unknown.
Delete when
    sglang plans and runs the sliding layers' ragged prefill with the window.
"""

from __future__ import annotations

import ast
import functools

from sglang_swa_plugin.fix import Detection, Fix, argument, around, with_argument
from sglang_swa_plugin.probe import function_tree, nodes, optional_class, optional_module, own_function, swapped

MODULE = "sglang.srt.layers.attention.flashinfer_backend"
BACKEND = MODULE + ".FlashInferAttnBackend"
INIT, EXTEND = BACKEND + ".__init__", BACKEND + ".forward_extend"
UPDATER = MODULE + ".FlashInferIndicesUpdaterPrefill"
PAGED_PLAN = UPDATER + ".update_sliding_window"
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

    if type(self).forward_extend is not mod.FlashInferAttnBackend.forward_extend:
        return original(self, *args, **kwargs)  # a subclass with its own prefill (trtllm_mha): no twin to plan
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


def prefix_window_mask(prefix_lens: list, seq_lens: list, window: int, device=None):
    """The (query, key) mask of a sliding wrapper that reads each request's cached prefix keys
    ``[max(0, prefix - window), prefix)`` for its queries at ``prefix .. seq_len - 1`` (flattened
    per request, queries by rows): key k is in query q's window when k >= q - window. None where
    every key is (as #26513 builds it). Host lists in, one device tensor out."""
    import torch

    blocks, needed = [], False
    for prefix, seq in zip(prefix_lens, seq_lens):
        first = max(0, prefix - window)
        if prefix <= first or seq <= prefix:
            continue
        q = torch.arange(prefix, seq).view(-1, 1)
        k = torch.arange(first, prefix).view(1, -1)
        block = (k >= q - window).to(torch.uint8)
        needed |= not bool(block.all())
        blocks.append(block.view(-1))
    return torch.cat(blocks).to(device) if needed else None


def _prefix_window_plan(self, original, args, kwargs):
    """A ragged prefill with a cached prefix (#26513, 0.5.10-0.5.12): the sliding wrapper's paged
    part reads the prefix's last ``window`` keys only (sglang's read ``window`` + extend keys up
    to the sequence's end, whose KV the batch has not written yet), with a mask per (query, key).
    The lengths are read to the host once (two syncs of a prefill plan; upstream's form has more)."""
    import torch

    prefix_lens = argument(original, "prefix_lens", args, kwargs)
    prefix = prefix_lens.tolist()
    if not any(prefix):
        return original(self, *args, **kwargs)
    window, sliding = self.sliding_window_size, argument(original, "prefill_wrappers", args, kwargs)[0]
    seq = argument(original, "seq_lens", args, kwargs).tolist()
    first = [max(0, p - window) for p in prefix]
    lens = [p - f for p, f in zip(prefix, first)]
    device = prefix_lens.device
    replaced = {"paged_kernel_lens": torch.tensor(lens, dtype=prefix_lens.dtype, device=device),
                "paged_kernel_lens_sum": sum(lens),
                "kv_start_idx": torch.tensor(first, dtype=prefix_lens.dtype, device=device)}
    mask = prefix_window_mask(prefix, seq, window, device)
    call, plan = self.call_begin_forward, sliding.begin_forward

    def sliding_call(*a, **k):
        if argument(call, "wrapper_paged", a, k, method=False) is sliding:
            for name, value in replaced.items():
                a, k = with_argument(call, name, value, a, k, method=False)
        return call(*a, **k)

    def masked_plan(*a, **k):
        if mask is not None and k.get("custom_mask") is None:
            k["custom_mask"] = mask
        return plan(*a, **k)

    with swapped(self, "call_begin_forward", sliding_call), swapped(sliding, "begin_forward", masked_plan):
        return original(self, *args, **kwargs)


def _paged_only_window_plan(self, original, args, kwargs):
    """A paged-only prefill (#31501, 0.5.10-0.5.15): the sliding wrapper's plan gets ``window_left``."""
    sliding = argument(original, "prefill_wrappers", args, kwargs)[0]
    plan = sliding.begin_forward

    def windowed_plan(*a, **k):
        if k.get("window_left", -1) < 0:
            k["window_left"] = self.sliding_window_size
        return plan(*a, **k)

    with swapped(sliding, "begin_forward", windowed_plan):
        return original(self, *args, **kwargs)


def _window_plan(original, self, *args, paged: bool = True, prefix: bool = True, **kwargs):
    """Around the prefill updater's ``update_sliding_window`` (no speculative input): the sliding
    wrapper's plan of a paged-only prefill (``paged``) and of a ragged prefill with a cached
    prefix (``prefix``) as sglang plans them once fixed; anything else as sglang plans it."""
    use_ragged = argument(original, "use_ragged", args, kwargs)
    window = getattr(self, "sliding_window_size", None)
    if (argument(original, "spec_info", args, kwargs) is not None or window is None or window < 0
            or not argument(original, "prefill_wrappers", args, kwargs)):
        return original(self, *args, **kwargs)
    if not use_ragged and paged:
        return _paged_only_window_plan(self, original, args, kwargs)
    if use_ragged and prefix:
        return _prefix_window_plan(self, original, args, kwargs)
    return original(self, *args, **kwargs)


def _ragged_calls(fn, method_names) -> list:
    """Calls ``<...>.prefill_wrapper_ragged.<method>(...)`` in ``fn`` (syntax tree)."""
    tree = function_tree(fn)[0]
    return [n for n in nodes(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in method_names and isinstance(n.func.value, ast.Attribute)
            and n.func.value.attr == "prefill_wrapper_ragged"]


def classify() -> Detection:
    cls = optional_class(f"{MODULE}.FlashInferAttnBackend")
    if cls is None:
        return Detection.not_applicable("this sglang has no flashinfer attention backend")
    init, extend = own_function(cls, "__init__"), own_function(cls, "forward_extend")
    if init is None or extend is None:
        return Detection.unknown("FlashInferAttnBackend lacks __init__ or forward_extend")
    builds = [n for n in nodes(function_tree(init)[0]) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == WRAPPER]
    runs = _ragged_calls(extend, {"forward", "forward_return_lse"})
    if not builds:  # sglang's flashinfer backend has always built one: a rename is no healthy status
        return Detection.target_moved(f"target moved: FlashInferAttnBackend.__init__ builds no {WRAPPER}")
    if len(builds) != 1 or not runs:
        return Detection.unknown("FlashInferAttnBackend's ragged prefill is not one wrapper run from forward_extend")
    if all(any(k.arg == "window_left" for k in call.keywords) for call in runs):
        return Detection.unknown("every ragged prefill run passes window_left: check its plan before hooking")
    plan = [around(INIT, _with_windowed_ragged), around(EXTEND, _layer_window)]
    reason = "the ragged prefill of sliding-window layers runs without window_left (whole prompt)"
    updater = getattr(optional_module(MODULE), "FlashInferIndicesUpdaterPrefill", None)
    window_plan = own_function(updater, "update_sliding_window") if updater is not None else None
    if window_plan is not None:
        tree = function_tree(window_plan)[0]
        paged = not any(isinstance(n, ast.keyword) and n.arg == "window_left" for n in nodes(tree))
        # #26513 gives the ragged case its own branch: ``if use_ragged:`` in the window plan
        prefix = not any(isinstance(n, ast.If) and any(isinstance(x, ast.Name) and x.id == "use_ragged"
                                                       for x in ast.walk(n.test)) for n in nodes(tree))
        if paged or prefix:
            plan.append(around(PAGED_PLAN, functools.partial(_window_plan, paged=paged, prefix=prefix)))
        if paged:
            reason += "; the paged sliding prefill is planned without it"
        if prefix:
            reason += "; with a cached prefix its paged part reads keys past the prefix, unmasked"
    return Detection.needed(reason, *plan)


class FlashinferSwaPrefillFix(Fix):
    name = "flashinfer_swa_prefill"
    summary = "flashinfer ragged prefill on sliding-window layers: a twin wrapper planned and run with the window"
    upstream_prs = ("#26513", "#31501")
    wraps = ("flashinfer_swa_verify",)
    targets = (INIT, EXTEND, PAGED_PLAN)
    target_params = {INIT: ("self", "model_runner"), EXTEND: ("self", "q", "k", "v", "layer", "forward_batch"),
                      PAGED_PLAN: ("self", "req_pool_indices", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "prefix_lens",
                                   "prefill_wrappers", "use_ragged")}
    check_module = "sglang_swa_plugin.check.flashinfer_swa_prefill"

    def detect(self) -> Detection:
        return classify()


FIX = FlashinferSwaPrefillFix()
