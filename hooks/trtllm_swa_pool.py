"""trtllm_mha: every ``TRTLLMHAAttnBackend`` resolves its SWA KV pool by upstream's final rule.

Bug
    0.5.10-0.5.12 choose "SWA" from the allocator type: an EAGLE draft (own full pool, the
    target's SWA allocator) translates its indices through the target's SWA mapping, reads
    wrong KV, and acceptance drops. Fix: an AROUND hook on the constructor applies #27491's
    rule (active pool; draft-worker guard; allocator), once per backend.
Upstream PRs
    #25103 (pool type only), #26966 (allocator only), #27491 (the final rule).
Affected versions
    0.5.10-0.5.12 (allocator-type form); builds of main carrying #25103 or #26966 alone.
    Status by release: applied 0.5.10-0.5.12; not needed 0.5.13+.
Detection
    ``_resolve_swa_kv_pool`` run for a target, an EAGLE draft and a FROZEN_KV draft on
    stand-ins (pool / None / pool is the final rule); without it, the constructor's
    allocator-type or pool-type test. Else unknown.
Delete when
    The oldest supported sglang is 0.5.13 or later.
"""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace
from typing import Any, Optional

from sglang_swa_plugin.fix import Detection, Fix, argument, around
from sglang_swa_plugin.probe import (compact, normalized_source, optional_module, own_function, swa_allocator_class,
                                     swa_pool_class)
from sglang_swa_plugin.trtllm_mha import CLASS, MODULE, backend_class

logger = logging.getLogger("sglang.srt.plugins.swa_plugin")

INIT = CLASS + ".__init__"
RESOLVER = "_resolve_swa_kv_pool"

# Known buggy constructor forms (whitespace-free source).
_ALLOCATOR_FORM = "isinstance(allocator,SWATokenToKVPoolAllocator)"
_POOL_FORM = re.compile(r"isinstance\((kv_pool|model_runner\.token_to_kv_pool),SWAKVPool\)")


def _is_frozen_kv_mtp(model_runner: Any) -> bool:
    """False where this sglang has no FROZEN_KV MTP (no ``is_frozen_kv_mtp``)."""
    check = getattr(getattr(model_runner, "spec_algorithm", None), "is_frozen_kv_mtp", None)
    return bool(check()) if check is not None else False


def resolve_swa_kv_pool(model_runner: Any) -> Optional[Any]:
    """Upstream's final rule (#27491): the SWAKVPool a trtllm_mha backend must use, or None."""
    swa_pool_cls = swa_pool_class()
    active_pool = model_runner.token_to_kv_pool
    if isinstance(active_pool, swa_pool_cls):
        return active_pool
    # A draft worker owns its pool; only FROZEN_KV MTP reads the target's SWA pool
    # through the shared allocator.
    if model_runner.is_draft_worker and not _is_frozen_kv_mtp(model_runner):
        return None
    kvcache = model_runner.token_to_kv_pool_allocator.get_kvcache()
    return kvcache if isinstance(kvcache, swa_pool_cls) else None


def _init_with_final_rule(original, self, *args, **kwargs):
    model_runner = argument(original, "model_runner", args, kwargs)
    try:
        pool = resolve_swa_kv_pool(model_runner)
    except Exception as e:  # noqa: BLE001 - an odd runner: leave sglang's own behaviour
        logger.warning("sglang-swa-plugin: trtllm_swa_pool could not resolve the SWA pool (%s); keeping sglang's", e)
        return original(self, *args, **kwargs)
    shadow = own_function(type(self), RESOLVER) is not None
    if shadow:
        # Whatever the constructor derives from its resolver agrees with the final rule.
        self.__dict__[RESOLVER] = lambda _runner: pool
    try:
        result = original(self, *args, **kwargs)
    finally:
        if shadow:
            self.__dict__.pop(RESOLVER, None)
    self._swa_kv_pool = pool
    self.use_sliding_window_kv_pool = pool is not None
    return result


# ---------------------------------------------------------------------------- detection


def probe_resolver(resolver) -> dict:
    """What ``resolver`` answers for a target, an EAGLE draft and a FROZEN_KV draft that
    share one SWA allocator: True where it returns the SWA pool."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    swa_pool = object.__new__(swa_pool_class())
    full_pool = object()
    allocator = object.__new__(swa_allocator_class())
    allocator.get_kvcache = lambda: swa_pool

    def runner(pool, draft, algo):
        return SimpleNamespace(token_to_kv_pool=pool, token_to_kv_pool_allocator=allocator,
                               is_draft_worker=draft, spec_algorithm=algo)

    cases = {"target": runner(swa_pool, False, SpeculativeAlgorithm.EAGLE),
             "eagle_draft": runner(full_pool, True, SpeculativeAlgorithm.EAGLE)}
    frozen = getattr(SpeculativeAlgorithm, "FROZEN_KV_MTP", None)
    if frozen is not None:
        cases["frozen_kv_draft"] = runner(full_pool, True, frozen)
    return {name: resolver(r) is swa_pool for name, r in cases.items()}


def classify() -> Detection:
    if optional_module(MODULE) is None:
        return Detection.not_applicable("this sglang has no trtllm_mha backend")
    cls = backend_class()
    resolver = own_function(cls, RESOLVER)
    if resolver is not None:
        try:
            got = probe_resolver(resolver)
        except Exception as e:  # noqa: BLE001
            return Detection.unknown(f"{RESOLVER} could not be probed: {type(e).__name__}: {e}")
        if not got["target"]:
            return Detection.unknown(f"{RESOLVER} does not give a target its SWAKVPool")
        if got["eagle_draft"]:
            return Detection.needed(f"{RESOLVER} reads the allocator for an EAGLE draft with its own full pool (#26966 form)")
        if got.get("frozen_kv_draft") is False:
            return Detection.needed(f"{RESOLVER} drops the target SWAKVPool of a FROZEN_KV MTP draft (#25103 form)")
        return Detection.not_needed(f"{RESOLVER} follows the final rule (#27491)")
    src = compact(normalized_source(cls.__init__))
    by_allocator, by_pool = _ALLOCATOR_FORM in src, bool(_POOL_FORM.search(src))
    if by_allocator and not by_pool:
        return Detection.needed("SWA pool chosen by allocator type: an EAGLE draft reads through the target's SWA mapping")
    if by_pool and not by_allocator:
        return Detection.needed("SWA pool chosen by active pool type only (#25103 form): a FROZEN_KV MTP draft loses it")
    return Detection.unknown("TRTLLMHAAttnBackend.__init__ chooses its SWA pool in an unrecognised way")


class TrtllmSwaPoolFix(Fix):
    name = "trtllm_swa_pool"
    summary = "trtllm_mha resolves its SWA KV pool by upstream's final rule for target and every draft backend"
    upstream_prs = ("#25103", "#26966", "#27491")
    targets = (INIT,)
    target_params = {INIT: ("self", "model_runner")}
    check_module = "sglang_swa_plugin.check.trtllm_swa_pool"

    def detect(self) -> Detection:
        return classify().with_plan(around(INIT, _init_with_final_rule))


FIX = TrtllmSwaPoolFix()
