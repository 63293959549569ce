"""Multi-layer EAGLE: the MTP hidden-state pool has a row for every request slot.
Bug
    ``MultiLayerEagleDraftWorker`` sizes ``req_to_hidden_states_pool`` by
    ``req_to_token_pool.size`` while the request slots run 1..size (row 0 is padding, #24243):
    the request in slot ``size`` (48 under EAGLE's default) has its target hidden states written
    one row past the pool, after every prefill and CUDA-graph draft extend, into whatever was
    allocated next: the draft-extend backend's ``kv_indptr`` (triton, CUDA graphs off: an
    illegal memory access), elsewhere silently.
    Fix: before sglang builds the draft backends and graphs, the pool gets req_to_token's rows.
Upstream PRs
    #24439 (the off-by-one after #24243; 0.5.12 sizes the pool by ``req_to_token.shape[0]``).
Affected versions
    0.5.11. Status by release: not needed 0.5.10; applied 0.5.11; not needed 0.5.12+.
Detection
    Behavioural, then structural: a real ``ReqToTokenPool`` hands out slot ``size``, and
    ``__init__`` allocates the pool with ``req_to_token_pool.size`` rows before it calls
    ``init_attention_backend``: needed; slots 0..size-1 (0.5.10), rows from ``req_to_token``, or
    no pool (0.5.17+): not needed; no multi-layer EAGLE worker: not applicable.
Delete when
    0.5.12 is the oldest supported release.
"""

from __future__ import annotations

import ast
from typing import Optional

from sglang_swa_plugin.fix import Detection, Fix, around
from sglang_swa_plugin.probe import compact, function_tree, nodes, optional_class, optional_module, own_function

MODULE = "sglang.srt.speculative.multi_layer_eagle_worker_v2"
WORKER = MODULE + ".MultiLayerEagleDraftWorker"
TARGET = WORKER + ".init_attention_backend"
POOL = "req_to_hidden_states_pool"
SHORT_ROWS = "self.req_to_token_pool.size"


def _rows_for_every_slot(original, self, *args, **kwargs):
    """Around ``init_attention_backend`` (called once in ``__init__``, after the pool and before
    the CUDA graphs that capture its address): a pool shorter than ``req_to_token`` is
    replaced by one with its rows (same dtype, device and row shape)."""
    pool = getattr(self, POOL, None)
    rows = self.req_to_token_pool.req_to_token.shape[0]
    if pool is not None and pool.shape[0] < rows:
        setattr(self, POOL, pool.new_empty((rows, *pool.shape[1:])))
    return original(self, *args, **kwargs)


def pool_allocation(init) -> Optional[ast.Call]:
    """The call whose result ``__init__`` assigns to ``self.req_to_hidden_states_pool``."""
    for n in nodes(function_tree(init)[0]):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and any(
                isinstance(t, ast.Attribute) and t.attr == POOL for t in n.targets):
            return n.value
    return None


def _line_of_call(init, name: str) -> Optional[int]:
    return min((n.lineno for n in nodes(function_tree(init)[0]) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute) and n.func.attr == name), default=None)


def slot_size_is_handed_out() -> Optional[bool]:
    """Whether a real ``ReqToTokenPool`` of size 2 (on the CPU) hands out slot 2; None where it
    cannot be built."""
    mod = optional_module("sglang.srt.mem_cache.memory_pool")
    try:
        pool = mod.ReqToTokenPool(size=2, max_context_len=1, device="cpu", enable_memory_saver=False)
        return max(pool.free_slots) >= pool.size
    except Exception:  # another constructor: the caller says unknown
        return None


def classify() -> Detection:
    handed_out = slot_size_is_handed_out()  # first: 0.5.10's worker module is not imported mid-start-up
    if handed_out is False:
        return Detection.not_needed("request slots run 0..size-1 (no padding row): a pool of size rows covers them")
    cls = optional_class(WORKER)
    if cls is None:
        return Detection.not_applicable("this sglang has no multi-layer EAGLE draft worker")
    init = own_function(cls, "__init__")
    call = pool_allocation(init) if init is not None else None
    if call is None:
        return Detection.not_needed("the multi-layer EAGLE draft worker keeps no MTP hidden-state pool")
    shape = call.args[0] if call.args and isinstance(call.args[0], ast.Tuple) else None
    rows = compact(ast.unparse(shape.elts[0])) if shape is not None and shape.elts else ""
    if "req_to_token.shape[0]" in rows or "_alloc_size" in rows:
        return Detection.not_needed("the MTP hidden-state pool has req_to_token's rows")
    if rows != SHORT_ROWS:
        return Detection.unknown(f"the MTP hidden-state pool is sized by {rows or 'an unknown shape'}: check it")
    if handed_out is None:
        return Detection.unknown("ReqToTokenPool could not be built to read its request slots")
    backend_line = _line_of_call(init, "init_attention_backend")
    if backend_line is None or backend_line < call.lineno:
        return Detection.unknown("__init__ does not build the draft backends after the MTP hidden-state pool")
    return Detection.needed("the MTP hidden-state pool has size rows while request slots run 1..size",
                            around(TARGET, _rows_for_every_slot))


class MleHiddenPoolFix(Fix):
    name = "mle_hidden_pool"
    summary = "multi-layer EAGLE: the MTP hidden-state pool has a row for the last request slot"
    upstream_prs = ("#24439",)
    targets = (TARGET,)
    target_params = {TARGET: ("self",)}
    check_module = "sglang_swa_plugin.check.mle_hidden_pool"

    def detect(self) -> Detection:
        return classify()


FIX = MleHiddenPoolFix()
