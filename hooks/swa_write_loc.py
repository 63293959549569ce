"""Hybrid SWA pool: each forward writes its sliding layers' KV where its own out_cache_loc says.
Bug
    ``ForwardBatch.init_new`` translates ``out_cache_loc`` to the SWA pool once
    (``out_cache_loc_swa``) and every ``ModelRunner._forward_raw`` of the batch installs it as the
    pool's ``swa_loc``, which ``SWAKVPool.set_kv_buffer`` uses instead of the layer's locations.
    The eager multi-step draft decode runs each step with its slice of ``out_cache_loc``: a
    sliding-window draft (MiMo-V2 NEXTN) writes 7 keys through 21 locations (shape mismatch;
    CUDA graphs off, or a batch above the draft graphs' sizes). Fix: a forward whose
    ``out_cache_loc`` is not the one translated gets it translated again.
Upstream PRs
    #25824 (the pool translates each write's own locations; no ``set_swa_loc``).
Affected versions
    0.5.10-0.5.12 (0.5.13+ keep no SWA locations on the batch: the backends translate in their
    metadata, a form this fix does not read). Status by release: applied 0.5.10-0.5.12; not needed 0.5.13+.
Detection
    Structural: ``ForwardBatch.init_new`` assigns ``out_cache_loc_swa`` and
    ``ModelRunner._forward_raw`` installs it with ``set_swa_loc``: needed; a ``ForwardBatch``
    without that field: not needed.
Delete when
    0.5.12 leaves the supported releases.
"""

from __future__ import annotations

import ast

from sglang_swa_plugin.fix import Detection, Fix, around, hookimpl
from sglang_swa_plugin.probe import callee, function_tree, is_attribute, nodes, optional_module, own_function

NAME = "swa_write_loc"
BATCH_MODULE = "sglang.srt.model_executor.forward_batch_info"
RUNNER_MODULE = "sglang.srt.model_executor.model_runner"
TARGET = RUNNER_MODULE + ".ModelRunner._forward_raw"
FIELD = "out_cache_loc_swa"
TRANSLATED_FROM = "_sglang_swa_plugin_swa_loc_of"  # the out_cache_loc the batch's SWA locations are of


def _own_swa_loc(original, self, forward_batch, *args, **kwargs):
    """Around ``ModelRunner._forward_raw``: where the batch's SWA locations are not those of its
    ``out_cache_loc`` (another length, or another tensor than the one they were taken from),
    translate ``out_cache_loc`` again. The batch's first forward takes init_new's translation
    where the lengths agree. Host-side tests only; one gather where stale."""
    swa, loc = getattr(forward_batch, FIELD, None), forward_batch.out_cache_loc
    if swa is not None and loc is not None:
        source = vars(forward_batch).get(TRANSLATED_FROM)
        if swa.shape[0] != loc.shape[0] or (source is not None and source is not loc):
            forward_batch.out_cache_loc_swa = self.token_to_kv_pool_allocator.translate_loc_from_full_to_swa(loc)
        vars(forward_batch)[TRANSLATED_FROM] = loc
    return original(self, forward_batch, *args, **kwargs)


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
        return Detection.not_needed("ForwardBatch keeps no out_cache_loc_swa for the pool to install")
    raw = own_function(runner, "_forward_raw")
    if raw is None:
        return Detection.target_moved("ModelRunner._forward_raw is gone")
    if not _assigns_field(own_function(batch, "init_new")) or not _installs_field(raw):
        return Detection.unknown("out_cache_loc_swa is not set by init_new and installed by _forward_raw")
    return Detection.needed("init_new translates out_cache_loc once; _forward_raw installs it as the pool's "
                            "swa_loc for every forward of the batch, whatever its out_cache_loc then is")


class SwaWriteLocFix(Fix):
    name = NAME
    summary = "hybrid SWA pool: each forward's SWA writes follow its own out_cache_loc (eager draft steps)"
    upstream_prs = ("#25824",)
    targets = (TARGET,)
    target_params = {TARGET: ("self", "forward_batch")}
    check_module = "sglang_swa_plugin.check.swa_write_loc"

    def detect(self) -> Detection:
        return classify().with_plan(around(TARGET, _own_swa_loc))


FIX = SwaWriteLocFix()


@hookimpl
def sglang_swa_plugin_fixes():
    return [FIX]
