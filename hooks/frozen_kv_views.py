"""FROZEN_KV MTP: the draft backend's SWA state follows the target pool the views swap in.

Bug
    ``frozen_kv_target_view``/``target_kv_pool_view`` and the FROZEN_KV graph runner swap the
    target ``SWAKVPool`` in; a trtllm_mha backend whose SWA state came from the draft's own
    pool (#25103's rule) gives SWA layers full-pool pages (illegal memory access). Fix (fork
    PR#6): around both views, the runner's construction and each capture, the backend's SWA
    state describes the swapped-in pool and is restored after.
Upstream PRs
    Fork PR#6 (pyc96/sglang), #26531 (closed); upstream's equivalent: #26966 + #27491.
Affected versions
    No release: 0.5.10-0.5.11 have no FROZEN_KV MTP; later releases resolve the pool from
    the shared allocator. Builds carrying #25103 without #27491 are affected.
    Status by release: not applicable 0.5.10-0.5.11; not needed 0.5.12+.
Detection
    The backend's own SWA resolution runs for a FROZEN_KV draft on stand-ins, then each view
    is entered: the target SWAKVPool inside every view: not needed; else needed.
Delete when
    No supported build carries #25103 without #27491.
"""

from __future__ import annotations

import __future__
import ast
import inspect
import sys
from types import SimpleNamespace
from typing import Any, Optional

from ..fix import Detection, Fix, TargetMissing, around
from ..probe import function_tree, optional_module, swa_allocator_class, swa_pool_class, target_class
from ..trtllm_mha import MODULE as TRTLLM

UTILS = "sglang.srt.speculative.frozen_kv_mtp_utils"
VIEW_NAMES = ("frozen_kv_target_view", "target_kv_pool_view")
VIEWS = tuple(f"{UTILS}.{name}" for name in VIEW_NAMES)
RUNNER_MODULE = "sglang.srt.speculative.frozen_kv_mtp_cuda_graph_runner"
RUNNER = RUNNER_MODULE + ".FrozenKVMTPCudaGraphRunner"
RUNNER_INIT = RUNNER + ".__init__"
CAPTURE_METHODS = ("capture_one_shape", "capture_one_batch_size")  # 0.5.14+, 0.5.12-0.5.13
RESOLVER = "_resolve_swa_kv_pool"

# The backend's cached SWA state (the guards of each release read one or the other).
POOL, FLAG, MAPPING = "_swa_kv_pool", "use_sliding_window_kv_pool", "_swa_full_to_swa_mapping"


# ---------------------------------------------------------------------------- the fix


def follow(backend: Any, pool: Any) -> Optional[dict]:
    """Make ``backend``'s SWA state describe ``pool``; return the previous values (None
    when the backend keeps no SWA state or there is no pool). Attribute writes only."""
    state = getattr(backend, "__dict__", None)
    if pool is None or not state or POOL not in state:
        return None
    swa = pool if isinstance(pool, swa_pool_class()) else None
    want = [(POOL, swa), (FLAG, swa is not None)]
    if MAPPING in state:  # 0.5.23+: what the fused graph-metadata kernel reads
        translating = getattr(getattr(backend, "kv_index_translator", None), "is_translating", False)
        want.append((MAPPING, swa.full_to_swa_index_mapping if swa is not None and not translating else None))
    saved = {}
    for name, value in want:
        if name in state:
            saved[name] = state[name]
            setattr(backend, name, value)
    return saved


def restore(backend: Any, saved: Optional[dict]) -> None:
    for name, value in (saved or {}).items():
        setattr(backend, name, value)


class _FollowingView:
    """The original view, plus the draft backend's SWA state following the pool it swaps
    in; restored (before the pool itself) on exit, whatever happened inside."""

    __slots__ = ("view", "backend", "pool", "saved")

    def __init__(self, view, backend, pool):
        self.view, self.backend, self.pool, self.saved = view, backend, pool, None

    def __enter__(self):
        entered = self.view.__enter__()
        try:
            self.saved = follow(self.backend, self.pool)
        except BaseException:
            self.view.__exit__(*sys.exc_info())
            raise
        return entered

    def __exit__(self, *exc):
        try:
            restore(self.backend, self.saved)
        finally:
            suppress = self.view.__exit__(*exc)
        return suppress


def _view_parts(forward_batch, kv_context, draft_attn_backend=None, *_, **__):
    """(draft backend, target pool) of a view call: 0.5.13+ pass the backend; 0.5.12's
    views swap ``forward_batch.token_to_kv_pool``, read by ``forward_batch.attn_backend``."""
    backend = draft_attn_backend if draft_attn_backend is not None else getattr(forward_batch, "attn_backend", None)
    return backend, getattr(kv_context, "target_token_to_kv_pool", None)


def _around_view(original, *args, **kwargs):
    view = original(*args, **kwargs)
    try:
        backend, pool = _view_parts(*args, **kwargs)
    except TypeError:  # a call shape we do not know: sglang's own behaviour
        return view
    if backend is None or pool is None:
        return view
    return _FollowingView(view, backend, pool)


def _following(backend: Any, worker: Any, call):
    """``call()`` with ``backend``'s SWA state following the worker's target pool."""
    kv_context = getattr(worker, "kv_context", None)
    saved = follow(backend, getattr(kv_context, "target_token_to_kv_pool", None))
    try:
        return call()
    finally:
        restore(backend, saved)


def _around_runner_init(original, runner, frozen_kv_mtp_worker, *args, **kwargs):
    """Graph-runner construction: the backend's own ``init_cuda_graph_state`` allocates the
    SWA buffers (page tables, SWA write locations) because it sees the target's SWA state,
    and the captures made here bind them."""
    backend = getattr(frozen_kv_mtp_worker, "draft_attn_backend", None)
    return _following(backend, frozen_kv_mtp_worker,
                      lambda: original(runner, frozen_kv_mtp_worker, *args, **kwargs))


def _around_capture(original, runner, *args, **kwargs):
    """One capture (the manual pool swap of 0.5.13+ does not touch the SWA state)."""
    backend = getattr(runner, "draft_attn_backend", None)
    worker = getattr(runner, "frozen_kv_mtp_worker", None)
    return _following(backend, worker, lambda: original(runner, *args, **kwargs))


def capture_target() -> str:
    """The capture method of the installed ``FrozenKVMTPCudaGraphRunner``."""
    try:
        mod = optional_module(RUNNER_MODULE)
    except Exception:  # noqa: BLE001 - reported when the target is resolved
        mod = None
    cls = getattr(mod, "FrozenKVMTPCudaGraphRunner", None)
    name = next((n for n in CAPTURE_METHODS if hasattr(cls, n)), CAPTURE_METHODS[0])
    return f"{RUNNER}.{name}"


# ---------------------------------------------------------------------------- detection


def _frozen_draft_stand_ins() -> SimpleNamespace:
    """Target SWAKVPool, the draft's own pool, the shared SWA allocator and a FROZEN_KV
    draft runner, as bare stand-ins (only identities and types matter to the probe)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    target_pool = object.__new__(swa_pool_class())
    allocator = object.__new__(swa_allocator_class())
    allocator.get_kvcache = lambda: target_pool
    runner = SimpleNamespace(token_to_kv_pool=object(), token_to_kv_pool_allocator=allocator,
                             is_draft_worker=True, spec_algorithm=SpeculativeAlgorithm.FROZEN_KV_MTP)
    return SimpleNamespace(target_pool=target_pool, runner=runner)


def _constructor_swa_state(cls: type, runner: Any) -> Any:
    """Execute the statements of the installed constructor that set the SWA state (and
    the local names they read) with ``self`` a blank object; return its ``_swa_kv_pool``."""
    init = inspect.unwrap(cls.__init__)
    func = function_tree(init)[0]
    self_name, runner_name = list(inspect.signature(init).parameters)[:2]
    picked, needed = [], set()
    for stmt in reversed(func.body):
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
            continue
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        attrs = {t.attr for t in targets if isinstance(t, ast.Attribute) and getattr(t.value, "id", None) == self_name}
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        if attrs & {POOL, FLAG} or names & needed:
            picked.insert(0, stmt)
            needed |= {n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)}
    code = compile(ast.Module(body=picked, type_ignores=[]), inspect.getsourcefile(init) or "<init>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    probe = SimpleNamespace()
    namespace = {**init.__globals__, **inspect.getclosurevars(init).nonlocals}
    exec(code, namespace, {self_name: probe, runner_name: runner})  # noqa: S102
    if not hasattr(probe, POOL):
        raise LookupError(f"{cls.__name__}.__init__ sets no {POOL}")
    return getattr(probe, POOL)


def draft_swa_pool(cls: type, runner: Any) -> "tuple[Any, str]":
    """(SWA pool, how): what a trtllm_mha backend built for ``runner`` caches."""
    resolver = getattr(cls, RESOLVER, None)
    if resolver is not None:
        return resolver(runner), RESOLVER
    return _constructor_swa_state(cls, runner), "the constructor's rule"


def views_follow(utils: Any, target_pool: Any, draft_pool: Any, cached_pool: Any) -> dict:
    """Per installed view: None when it swaps in no target pool, else whether, inside it,
    a draft backend whose cached SWA pool is ``cached_pool`` has the swapped-in pool as
    its SWA pool. The stand-in backend's flag follows its pool, as in 0.5.12 (both from the
    allocator) and 0.5.14+ (derived from the resolver); 0.5.13 keeps the flag pool-based,
    but there it guards only KV writes, which a frozen draft never does."""
    from sglang.srt.speculative.frozen_kv_mtp_info import FrozenKVMTPContext

    ctx = FrozenKVMTPContext(target_token_to_kv_pool=target_pool, physical_layer_ids={})
    out = {}
    for name in VIEW_NAMES:
        view = getattr(utils, name)
        backend = SimpleNamespace(token_to_kv_pool=draft_pool, **{POOL: cached_pool, FLAG: cached_pool is not None})
        fb = SimpleNamespace(spec_info=None, token_to_kv_pool=draft_pool, attn_backend=backend)
        nparams = len(inspect.signature(view).parameters)
        if nparams not in (2, 3):
            raise TargetMissing(f"{UTILS}.{name}", f"unexpected signature {inspect.signature(view)}")
        with view(*(fb, ctx, backend)[:nparams]):
            swapped_in = backend.token_to_kv_pool is target_pool or fb.token_to_kv_pool is target_pool
            agrees = getattr(backend, POOL) is target_pool and bool(getattr(backend, FLAG))
        out[name] = agrees if swapped_in else None
    return out


def classify() -> Detection:
    utils = optional_module(UTILS)
    if utils is None:
        return Detection.not_applicable("this sglang has no FROZEN_KV MTP (no frozen_kv_mtp_utils)")
    trtllm = optional_module(TRTLLM)
    if trtllm is None:
        return Detection.not_applicable("this sglang has no trtllm_mha backend")
    s = _frozen_draft_stand_ins()
    cached, how = draft_swa_pool(target_class(f"{TRTLLM}.TRTLLMHAAttnBackend"), s.runner)
    got = views_follow(utils, s.target_pool, s.runner.token_to_kv_pool, cached)
    if None in got.values():
        return Detection.unknown(f"{', '.join(n for n, v in got.items() if v is None)} swaps in no target pool")
    plan = (*(around(view, _around_view) for view in VIEWS), around(RUNNER_INIT, _around_runner_init),
            around(capture_target(), _around_capture))  # the capture method was renamed in 0.5.14
    if all(got.values()):
        return Detection.not_needed(
            f"inside both views the draft backend's SWA pool is the target SWAKVPool ({how} "
            "takes it from the shared allocator for a FROZEN_KV draft)", *plan)
    return Detection.needed(
        f"{how} gives a FROZEN_KV draft SWA pool {cached!r}, but the views swap in the target "
        "SWAKVPool: SWA layers would read full-pool page indices", *plan)


class FrozenKVViewsFix(Fix):
    name = "frozen_kv_views"
    summary = "FROZEN_KV MTP views and graph capture keep the draft backend's SWA state in step with the swapped-in target pool"
    upstream_prs = ("fork PR#6", "#26531", "#26966", "#27491")
    check_module = "sglang_swa_plugin.check.frozen_kv_views"

    targets = VIEWS + (RUNNER_INIT,) + tuple(f"{RUNNER}.{name}" for name in CAPTURE_METHODS)
    target_params = {**{v: ("forward_batch", "kv_context") for v in VIEWS}, RUNNER_INIT: ("self", "frozen_kv_mtp_worker"),
                     **{f"{RUNNER}.{name}": ("self",) for name in CAPTURE_METHODS}}

    def detect(self) -> Detection:
        return classify()


FIX = FrozenKVViewsFix()
