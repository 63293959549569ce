"""Hybrid SWA pool: each multi-step draft step writes its sliding layers' KV at its own SWA slots.
Bug
    Draft step i runs with its slice of the batch's ``out_cache_loc``, but the SWA write locations
    were translated once from the whole batch: on the batch (``out_cache_loc_swa``, installed by
    ``_forward_raw``; 0.5.10-0.5.12) or in each step backend's metadata (0.5.13+, fa3 and triton).
    MiMo-V2 NEXTN: shape mismatch; no server start with CUDA graphs (fa3: a size mismatch at
    capture, triton: no locations); eager, keys at other steps' slots (fewer drafts accepted).
    Fix: batch form, retranslate stale locations; fa3, the step's metadata from its own slice
    (``speculative_step_id``, topk 1); triton, a step writing without its own gets them translated.
Upstream PRs
    #25824 (0.5.13, the batch form's end); fa3 per step in 0.5.21, triton in 0.5.23 (no PR named).
Affected versions
    0.5.10-0.5.12 (batch form); 0.5.13-0.5.20 fa3 and 0.5.13-0.5.22 triton (metadata form).
    Status by release: applied 0.5.10-0.5.22; not needed 0.5.23+.
Detection
    Structural: ``init_new`` assigns ``out_cache_loc_swa`` and ``_forward_raw`` passes it to
    ``set_swa_loc``; else a backend whose ``forward_decode`` writes ``forward_metadata.swa_out_cache_loc``
    in a module that never calls ``per_step_draft_out_cache_loc``.
Delete when
    0.5.22 leaves the supported releases.
"""

from __future__ import annotations

import ast

from sglang_swa_plugin import state
from sglang_swa_plugin.fix import Detection, Fix, around
from sglang_swa_plugin.probe import callee, calls, function_tree, is_attribute, module_tree, nodes, optional_module, own_function

NAME = "swa_write_loc"
BATCH_MODULE = "sglang.srt.model_executor.forward_batch_info"
RUNNER_MODULE = "sglang.srt.model_executor.model_runner"
TARGET = RUNNER_MODULE + ".ModelRunner._forward_raw"
FIELD = "out_cache_loc_swa"
TRANSLATED_FROM = "swa_loc_of"  # in a forward batch's state: the out_cache_loc the batch's SWA locations are of
# 0.5.13+ (metadata form): the backends whose multi-step drafts take sliding-window layers (flashinfer's
# and trtllm_mha's refuse them: one wrapper per step), by module of sglang.srt.layers.attention.
BACKENDS = {"flashattention_backend": "FlashAttentionBackend", "triton_backend": "TritonAttnBackend"}
METADATA_FIELD = "swa_out_cache_loc"
STEP_LAYOUT = "per_step_draft_out_cache_loc"  # sglang's own per-step slicing of a draft's out_cache_loc
ATTN = "sglang.srt.layers.attention."
FA3_METADATA = tuple(ATTN + f"flashattention_backend.FlashAttentionBackend.{m}"
                     for m in ("init_forward_metadata", "init_forward_metadata_out_graph"))
TRITON_DECODE = ATTN + "triton_backend.TritonAttnBackend.forward_decode"
OWN = "step_swa_loc"  # in the backend's state: (metadata, out_cache_loc, its SWA locations)


def _own_swa_loc(original, self, forward_batch, *args, **kwargs):
    """Around ``ModelRunner._forward_raw``: where the batch's SWA locations are not those of its
    ``out_cache_loc`` (another length, or another tensor than the one they were taken from),
    translate ``out_cache_loc`` again. The batch's first forward takes init_new's translation
    where the lengths agree. Host-side tests only; one gather where stale."""
    swa, loc = getattr(forward_batch, FIELD, None), forward_batch.out_cache_loc
    if swa is not None and loc is not None:
        source = state.get(forward_batch, TRANSLATED_FROM)
        if swa.shape[0] != loc.shape[0] or (source is not None and source is not loc):
            forward_batch.out_cache_loc_swa = self.token_to_kv_pool_allocator.translate_loc_from_full_to_swa(loc)
        state.of(forward_batch)[TRANSLATED_FROM] = loc
    return original(self, forward_batch, *args, **kwargs)


def _draft_step(forward_batch) -> bool:
    """A multi-step draft's decode step: DECODE with the draft's input (the target verifies, the draft
    extends in other modes)."""
    spec = getattr(forward_batch, "spec_info", None)
    return spec is not None and forward_batch.forward_mode.is_decode() and getattr(spec, "is_draft_input", lambda: False)()


def _fa3_step_locations(original, self, forward_batch, *args, **kwargs):
    """Around the fa3 step backend's metadata (eager, CUDA-graph capture and replay), topk 1: the
    SWA write locations are computed from the step's own slice of the batch's ``out_cache_loc``
    (sglang's own layout, ``speculative_step_id``), as upstream fa3 does from 0.5.21. At topk 1 the
    metadata reads ``out_cache_loc`` for nothing else."""
    loc, steps = forward_batch.out_cache_loc, getattr(self, "speculative_num_steps", 1)
    if (loc is None or steps < 2 or getattr(self, "topk", 0) != 1 or not getattr(self, "use_sliding_window_kv_pool", False)
            or loc.shape[0] % steps or loc.shape[0] // steps > forward_batch.batch_size or not _draft_step(forward_batch)):
        return original(self, forward_batch, *args, **kwargs)
    # The batch's requests (a CUDA-graph replay pads batch_size, not out_cache_loc), steps apart.
    forward_batch.out_cache_loc = _layout()(loc, loc.shape[0] // steps, 1, steps)[self.speculative_step_id]
    try:
        return original(self, forward_batch, *args, **kwargs)
    finally:
        forward_batch.out_cache_loc = loc


def _triton_step_writes(original, self, q, k, v, layer, forward_batch, *args, **kwargs):
    """Around triton's ``forward_decode``: a draft step whose metadata holds no SWA write locations
    (a CUDA-graph capture of more rows than its buffer) or the whole batch's (another length) writes
    through its own, translated from its ``out_cache_loc`` (a gather captured with the step where a
    graph is captured), once per step; the metadata's value is put back after the call."""
    metadata, loc = getattr(self, "forward_metadata", None), forward_batch.out_cache_loc
    swa = getattr(metadata, METADATA_FIELD, None)
    translator = getattr(self, "kv_index_translator", None)
    if (metadata is None or loc is None or not getattr(self, "use_sliding_window_kv_pool", False)
            or (swa is not None and swa.shape[0] == loc.shape[0]) or getattr(translator, "is_translating", False)
            or not _draft_step(forward_batch)):
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    own = state.get(self, OWN)
    if own is None or own[0] is not metadata or own[1] is not loc:
        own = state.of(self)[OWN] = (metadata, loc, self.token_to_kv_pool.translate_loc_from_full_to_swa(loc))
    setattr(metadata, METADATA_FIELD, own[2])
    try:
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    finally:
        setattr(metadata, METADATA_FIELD, swa)


def _layout():
    from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc

    return per_step_draft_out_cache_loc


def _writes_metadata_locations(module: str) -> "bool | None":
    """None: no such backend in this sglang. Else whether its ``forward_decode`` writes through
    ``self.forward_metadata.swa_out_cache_loc`` while the module never slices per draft step."""
    tree = module_tree(ATTN + module)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == BACKENDS[module]), None) if tree else None
    decode = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward_decode"), None) if cls else None
    if decode is None:
        return None
    reads = any(is_attribute(n, METADATA_FIELD, "forward_metadata") for n in ast.walk(decode))
    return reads and not calls(tree, frozenset({STEP_LAYOUT}))


def _assigns_field(fn) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == FIELD and isinstance(n.ctx, ast.Store)
               for n in nodes(function_tree(fn)[0]))


def _installs_field(fn) -> bool:
    return any(isinstance(n, ast.Call) and callee(n) == "set_swa_loc"
               and any(is_attribute(a, FIELD, "forward_batch") for a in n.args)
               for n in nodes(function_tree(fn)[0]))


def classify() -> Detection:
    batch = getattr(optional_module(BATCH_MODULE), "ForwardBatch", None)
    runner = getattr(optional_module(RUNNER_MODULE), "ModelRunner", None)
    if batch is None or runner is None or own_function(batch, "init_new") is None:
        return Detection.unknown("no ForwardBatch.init_new or ModelRunner in sglang.srt.model_executor")
    if FIELD not in getattr(batch, "__dataclass_fields__", {}):
        return _classify_metadata_form()
    raw = own_function(runner, "_forward_raw")
    if raw is None:
        return Detection.target_moved("ModelRunner._forward_raw is gone")
    if not _assigns_field(own_function(batch, "init_new")) or not _installs_field(raw):
        return Detection.unknown("out_cache_loc_swa is not set by init_new and installed by _forward_raw")
    return Detection.needed("init_new translates out_cache_loc once; _forward_raw installs it as the pool's "
                            "swa_loc for every forward of the batch, whatever its out_cache_loc then is",
                            around(TARGET, _own_swa_loc))


def _classify_metadata_form() -> Detection:
    forms = {m: _writes_metadata_locations(m) for m in BACKENDS}
    plans = {"flashattention_backend": [around(t, _fa3_step_locations) for t in FA3_METADATA],
             "triton_backend": [around(TRITON_DECODE, _triton_step_writes)]}
    needed = [m for m, v in forms.items() if v]
    if not needed:
        return Detection.not_needed("no multi-step draft backend writes a step through the whole batch's SWA "
                                    "locations: " + ", ".join(f"{m}: {'absent' if v is None else 'per step or none'}"
                                                              for m, v in forms.items()),
                                    *(h for m, v in forms.items() if v is not None for h in plans[m]))
    return Detection.needed("the draft steps' metadata translate the whole batch's out_cache_loc; each step writes "
                            "with its slice (" + ", ".join(needed) + ")", *(h for m in needed for h in plans[m]))


class SwaWriteLocFix(Fix):
    name = NAME
    summary = "hybrid SWA pool: each forward's SWA writes follow its own out_cache_loc (eager draft steps)"
    upstream_prs = ("#25824",)
    wraps = ("fa3_local_attn_tree_verify",)
    targets = (TARGET,) + FA3_METADATA + (TRITON_DECODE,)
    target_params = {TARGET: ("self", "forward_batch"), **{t: ("self", "forward_batch") for t in FA3_METADATA},
                     TRITON_DECODE: ("self", "q", "k", "v", "layer", "forward_batch")}
    check_module = "sglang_swa_plugin.check.swa_write_loc"

    def detect(self) -> Detection:
        return classify()


FIX = SwaWriteLocFix()
