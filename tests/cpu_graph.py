"""A CPU stand-in for CUDA-graph capture and replay, for tests of code that runs inside
sglang's captured forward passes.

What a CUDA graph does, and what this reproduces on the CPU: while a pass is captured, Python
runs once and every device operation is recorded with the memory it reads and writes; at
replay no Python runs, the recorded operations run again on the same memory, whatever the
static buffers hold by then. ``CpuGraph.capture()`` records every torch operation of the
pass (a ``TorchDispatchMode``) and ``replay()`` runs them again on the same tensor objects,
copying each result into the tensor the captured pass got, so later operations and kernels
read the new values. Host-side state (Python caches, ints) is frozen at capture, exactly as on
the GPU. Kernel stand-ins registered with ``kernel()`` are recorded as one step and called
again at replay with the same arguments, their results written into the tensors they
returned at capture (a kernel writes the output buffer the captured pass got). A host-device
sync inside the captured region (``.item()``, ``.tolist()``: illegal in a real capture) is
recorded in ``syncs``.

While capturing, ``torch.cuda.is_current_stream_capturing()`` answers True, as on the GPU."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, List
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

SYNC_OPS = {"aten::_local_scalar_dense", "aten::item"}


def _returns_alias(func: Any) -> bool:
    """An op whose result is (a view of) one of its inputs: in-place and view ops."""
    return any(r.alias_info is not None for r in func._schema.returns)


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: "CpuGraph") -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.name in SYNC_OPS:
            self.graph.syncs.append(func._schema.name)
        out = func(*args, **kwargs)
        self.graph.program.append((func, args, kwargs, out))
        return out


class CpuGraph:
    def __init__(self) -> None:
        self.program: List[Any] = []
        self.syncs: List[str] = []
        self.capturing = False

    @contextlib.contextmanager
    def capture(self):
        assert not self.program, "one capture per graph"
        self.capturing = True
        try:
            with mock.patch.object(torch.cuda, "is_current_stream_capturing", lambda: True), _Recorder(self):
                yield self
        finally:
            self.capturing = False

    def kernel(self, fn: Callable) -> Callable:
        """``fn`` as a kernel: inside a capture it is recorded as one step (its own torch
        calls are not), and ``replay()`` calls it again with the same arguments."""

        def launch(*args: Any, **kwargs: Any) -> Any:
            if not self.capturing:
                return fn(*args, **kwargs)
            with _disable_current_modes():
                out = fn(*args, **kwargs)
            self.program.append((fn, args, kwargs, out))
            return out

        return launch

    def replay(self) -> None:
        with torch.no_grad():
            for func, args, kwargs, out in self.program:
                res = func(*args, **kwargs)
                if isinstance(func, torch._ops.OpOverload) and _returns_alias(func):
                    continue  # wrote its input in place, or is a view of it
                for old, new in zip(tree_flatten(out)[0], tree_flatten(res)[0]):
                    if isinstance(old, torch.Tensor):
                        old.copy_(new)


def replayed_tree_rail(backend, fb, build, next_lens, tree_batch, n: int):
    """A tree verify's rail (``build()``, e.g. a fix's fields of ``backend`` and ``fb``) built
    inside a capture, sglang's gather recorded as one kernel (its torch twin); then the next batch
    (``next_lens``; ``tree_batch(lens) -> (mask, positions)``) written into the batch buffers
    (lengths, positions, sglang's tree mask and its offsets) and the capture replayed. Returns
    ``(captured, eager, syncs)``: the replayed fields, the next batch's built eagerly, and the
    host syncs seen while capturing."""
    from sglang_swa_plugin import triton_rail
    from sglang_swa_plugin.check.flashinfer_swa_verify import KvIndicesTwin
    from sglang_swa_plugin.probe import optional_module, swapped

    graph = CpuGraph()

    class GraphedGather:
        def __getitem__(self, grid):
            return graph.kernel(KvIndicesTwin()[grid])

    md = backend.forward_metadata
    md.custom_mask = torch.cat([md.custom_mask, torch.zeros(4096, dtype=md.custom_mask.dtype)])  # static room
    with contextlib.ExitStack() as stack:
        for module in dict.fromkeys(optional_module(m) for m in triton_rail.GATHER_MODULES):
            if hasattr(module, triton_rail.GATHER):
                stack.enter_context(swapped(module, triton_rail.GATHER, GraphedGather()))
        with graph.capture():
            captured = build()
        mask, positions = tree_batch(next_lens)
        fb.seq_lens.copy_(torch.tensor(next_lens, dtype=fb.seq_lens.dtype))
        fb.positions.copy_(positions)
        md.custom_mask[: mask.numel()] = mask.to(md.custom_mask.dtype)
        md.mask_indptr[1:] = torch.cumsum(torch.tensor([n * (m + n) for m in next_lens]), 0).to(md.mask_indptr.dtype)
        graph.replay()
        eager = build()
    return captured, eager, list(graph.syncs)
