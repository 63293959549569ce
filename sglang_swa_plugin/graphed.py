"""A fix's per-step device work replayed from a small CUDA graph of its own.

The fixes' replay-time refreshes are fixed-shape device ops without host-device syncs, a few
dozen torch calls each; on the host every call costs several µs, which is most of the step.
``run(owner, key, fn, inputs)`` calls ``fn()`` eagerly the first time it sees ``key`` with these
``inputs`` (the tensors ``fn`` reads or writes, as addresses, shapes and strides), captures it
into a CUDA graph the second time and replays that graph from then on: one launch per step.
The graph reads and writes the same memory ``fn`` would, so a replay is ``fn()`` as long as
``inputs`` are the same tensors, which is checked at every call; a change of any of them runs
``fn()`` eagerly again (and captures anew once they hold still). ``fn`` must depend on nothing
but ``key`` and ``inputs`` (every Python value it uses is part of ``key``), leave its results in
``inputs`` (nothing it allocates outlives the call) and cache nothing it allocates, except in
its first, eager call. Off CUDA, or while a CUDA graph is being captured (the refresh is then
part of that graph), ``fn()`` runs as it is. A capture that fails leaves ``key`` eager for good
(logged once). ``capturing()``, whether a CUDA graph is being captured now, is the one query of
capture state the fixes share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from . import state
from .log import logger

ATTR = "graphed"  # in the owner's (a backend's) state: {key: Entry}
POOL = "graph_pool"  # in the owner's state: one memory pool for its graphs
MAX_CAPTURES = 4  # per key: inputs that keep moving stay eager
_streams: dict = {}  # per device: the side stream captures run on


@dataclass
class Entry:
    inputs: tuple
    graph: Any = None
    captures: int = 0
    eager_only: bool = False


def signature(tensors: Sequence) -> tuple:
    """The inputs as the graph reads them: address, shape, strides and dtype of each. ``t.shape``
    as it is (a torch.Size, itself a tuple): copying it into a tuple doubled the check's cost,
    which runs before every replay."""
    return tuple((t.data_ptr(), t.shape, t.stride(), t.dtype) for t in tensors)


def capturing() -> bool:
    """True while the current CUDA stream is being captured into a graph (a host-side query, no
    sync); False on a machine without CUDA."""
    import torch

    try:
        return torch.cuda.is_current_stream_capturing()
    except (RuntimeError, AssertionError, AttributeError):  # a torch built without CUDA
        return False


def run(owner, key, fn: Callable[[], None], inputs: Sequence) -> None:
    if not inputs[0].is_cuda or capturing():
        fn()
        return
    cache = state.of(owner).setdefault(ATTR, {})
    sig, entry = signature(inputs), cache.get(key)
    if entry is None or entry.inputs != sig:
        captures = entry.captures if entry is not None else 0
        cache[key] = Entry(sig, captures=captures, eager_only=captures >= MAX_CAPTURES)
        fn()
        return
    if entry.eager_only:
        fn()
        return
    if entry.graph is None:
        entry.captures += 1
        entry.graph = _capture(fn, inputs[0].device, key, owner)
        if entry.graph is None:  # for good, whatever the inputs later
            entry.eager_only, entry.captures = True, MAX_CAPTURES
            fn()
            return
    entry.graph.replay()


def _capture(fn: Callable[[], None], device, key, owner) -> Optional[Any]:
    """``fn`` captured on a side stream into a graph whose temporaries live in the owner's
    pool: one owner's graphs replay one after the other on its stream and keep nothing in
    the pool between replays, so they can share it."""
    import torch

    if device not in _streams:
        _streams[device] = torch.cuda.Stream(device=device)
    pool = state.get(owner, POOL)
    if pool is None:
        pool = state.of(owner)[POOL] = torch.cuda.graph_pool_handle()
    graph, stream, current = torch.cuda.CUDAGraph(), _streams[device], torch.cuda.current_stream(device)
    stream.wait_stream(current)
    try:
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                fn()
            finally:
                graph.capture_end()
    except Exception as e:  # noqa: BLE001 - the step still runs, eagerly
        logger.warning("sglang-swa-plugin: %s: its per-step work could not be captured into a CUDA graph, it runs "
                       "op by op: %s: %s", key[0] if isinstance(key, tuple) else key, type(e).__name__, e)
        current.wait_stream(stream)
        return None
    current.wait_stream(stream)
    return graph
