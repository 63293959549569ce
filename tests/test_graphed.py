"""sglang_swa_plugin.graphed: when a fix's per-step work runs eagerly, is captured, or is
replayed. CUDA graphs need a GPU; here the capture is a recorder (it runs the work once, as
a capture records it) and the inputs are stand-ins with CUDA tensors' attributes, so what is
checked is the bookkeeping: which call does what, and that moved inputs never replay a graph
captured over other memory."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from sglang_swa_plugin import graphed, state


@dataclass
class FakeCuda:
    ptr: int
    shape: tuple = (4,)
    dtype: object = torch.int32
    is_cuda: bool = True
    device: str = "cuda:0"

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return (1,)


class Graph:
    def __init__(self, log):
        self.log = log

    def replay(self):
        self.log.append("replay")


def harness(monkeypatch, fail=False):
    log = []

    def capture(fn, device, key, owner):
        log.append("capture")
        if fail:
            return None
        fn()  # what a capture records; nothing runs on the device
        return Graph(log)

    monkeypatch.setattr(graphed, "capturing", lambda: False)
    monkeypatch.setattr(graphed, "_capture", capture)
    owner = SimpleNamespace()
    return owner, log, lambda: log.append("eager")


def test_first_call_eager_second_captured_then_replayed(monkeypatch):
    owner, log, fn = harness(monkeypatch)
    a, b = FakeCuda(100), FakeCuda(200)
    for _ in range(4):
        graphed.run(owner, ("fix", 8), fn, [a, b])
    assert log == ["eager", "capture", "eager", "replay", "replay", "replay"]


def test_moved_inputs_run_eagerly_and_are_captured_anew(monkeypatch):
    owner, log, fn = harness(monkeypatch)
    a, b = FakeCuda(100), FakeCuda(200)
    graphed.run(owner, "k", fn, [a, b])
    graphed.run(owner, "k", fn, [a, b])
    log.clear()
    for moved in (FakeCuda(300), FakeCuda(200, shape=(5,)), FakeCuda(200, dtype=torch.int64)):
        graphed.run(owner, "k", fn, [a, moved])
        assert log == ["eager"], moved
        log.clear()
    graphed.run(owner, "k", fn, [a, b])  # back: eager (inputs changed since the last call), then captured again
    graphed.run(owner, "k", fn, [a, b])
    assert log == ["eager", "capture", "eager", "replay"]


def test_keys_are_separate_and_inputs_that_keep_moving_stay_eager(monkeypatch):
    owner, log, fn = harness(monkeypatch)
    a = FakeCuda(100)
    graphed.run(owner, ("fix", 1), fn, [a])
    graphed.run(owner, ("fix", 2), fn, [a])
    assert log == ["eager", "eager"]
    log.clear()
    for i in range(graphed.MAX_CAPTURES + 2):
        ptr = FakeCuda(1000 + i)
        graphed.run(owner, "moving", fn, [ptr])
        graphed.run(owner, "moving", fn, [ptr])
    assert log.count("capture") == graphed.MAX_CAPTURES
    assert log[-2:] == ["eager", "eager"]


def test_a_failed_capture_stays_eager(monkeypatch):
    owner, log, fn = harness(monkeypatch, fail=True)
    a = FakeCuda(100)
    for _ in range(4):
        graphed.run(owner, "k", fn, [a])
    assert log == ["eager", "capture", "eager", "eager", "eager"]
    log.clear()
    for moved in (FakeCuda(200), FakeCuda(200), FakeCuda(200)):  # other inputs: still no second try
        graphed.run(owner, "k", fn, [moved])
    assert log == ["eager"] * 3


def test_off_cuda_and_inside_a_capture_the_work_runs_as_it_is(monkeypatch):
    owner, log, fn = harness(monkeypatch)
    for _ in range(3):
        graphed.run(owner, "cpu", fn, [torch.zeros(3)])
    monkeypatch.setattr(graphed, "capturing", lambda: True)
    for _ in range(3):
        graphed.run(owner, "in-capture", fn, [FakeCuda(100)])
    assert log == ["eager"] * 6
    assert "in-capture" not in state.get(owner, graphed.ATTR, {})
