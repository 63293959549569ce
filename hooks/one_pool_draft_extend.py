"""Multi-layer EAGLE on one KV pool: the draft-extend CUDA-graph capture starts.
Bug
    ``MultiLayerEagleDraftExtendCudaGraphRunner`` translates the next step's write locations
    with ``token_to_kv_pool.translate_loc_from_full_to_swa`` unconditionally while capturing.
    With one pool (``--disable-hybrid-swa-memory``, what users set to get around SWA bugs) the
    pool is an ``MHATokenToKVPool`` without that method: the server stops at start-up with an
    AttributeError.
    Fix: while a batch size is captured, a pool without the method translates as the
    identity (one pool: its ids are the sliding layers' ids; sglang's MHA pool reads no SWA
    locations).
Upstream PRs
    #25824 (SWA locations kept inside SWAKVPool; the runner no longer translates, 0.5.13).
Affected versions
    0.5.10-0.5.12. Status by release: applied 0.5.10-0.5.12; not needed 0.5.13+.
Detection
    Structural: the runner's ``capture_one_batch_size`` calls
    ``...token_to_kv_pool.translate_loc_from_full_to_swa`` with no test of the pool: needed; no
    such call: not needed; no multi-layer EAGLE runner: not applicable.
Delete when
    0.5.13 is the oldest supported release.
"""

from __future__ import annotations

import ast
import inspect

from sglang_swa_plugin.fix import Detection, Fix, around
from sglang_swa_plugin.probe import function_tree, nodes, optional_class, own_function, swapped

MODULE = "sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner"
RUNNER = MODULE + ".MultiLayerEagleDraftExtendCudaGraphRunner"
TARGET = RUNNER + ".capture_one_batch_size"
METHOD = "translate_loc_from_full_to_swa"


def _identity(loc):
    return loc


def _one_pool_capture(original, self, *args, **kwargs):
    """Around ``capture_one_batch_size``: a pool without SWA translation translates as the
    identity for the capture (only there does sglang call it unconditionally)."""
    pool = getattr(getattr(self, "model_runner", None), "token_to_kv_pool", None)
    if pool is None or hasattr(pool, METHOD):
        return original(self, *args, **kwargs)
    with swapped(pool, METHOD, _identity):
        return original(self, *args, **kwargs)


def _pool_translations(fn) -> list:
    """``<...>.token_to_kv_pool.translate_loc_from_full_to_swa(...)`` calls in ``fn``."""
    return [n for n in nodes(function_tree(fn)[0]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == METHOD and isinstance(n.func.value, ast.Attribute)
            and n.func.value.attr == "token_to_kv_pool"]


def _guarded(fn) -> bool:
    """Some ``if`` of ``fn`` tests the pool or SWA before translating."""
    tree, src = function_tree(fn)
    tests = [ast.get_source_segment(src, n.test) or "" for n in nodes(tree) if isinstance(n, ast.If)]
    return any(w in test for test in tests for w in ("swa", "SWA", "hybrid", METHOD))


def classify() -> Detection:
    cls = optional_class(RUNNER)
    if cls is None:
        return Detection.not_applicable("this sglang has no multi-layer EAGLE draft-extend graph runner")
    capture = own_function(cls, "capture_one_batch_size")
    if capture is None:  # 0.5.14+: the capture moved to a shared runner
        if METHOD in inspect.getsource(inspect.getmodule(cls)):
            return Detection.unknown("the draft-extend runner translates somewhere other than its capture")
        return Detection.not_needed("the draft-extend graph runner does not translate through the pool")
    if not _pool_translations(capture):
        return Detection.not_needed("the draft-extend capture does not translate through the pool")
    if _guarded(capture):
        return Detection.unknown("the draft-extend capture tests the pool before translating: check it")
    return Detection.needed("the draft-extend capture calls the pool's SWA translation whatever the pool",
                            around(TARGET, _one_pool_capture))


class OnePoolDraftExtendFix(Fix):
    name = "one_pool_draft_extend"
    summary = "multi-layer EAGLE with one KV pool: the draft-extend graph capture no longer needs an SWA pool"
    upstream_prs = ("#25824",)
    targets = (TARGET,)
    target_params = {TARGET: ("self", "bs", "forward")}
    check_module = "sglang_swa_plugin.check.one_pool_draft_extend"

    def detect(self) -> Detection:
        return classify()


FIX = OnePoolDraftExtendFix()
