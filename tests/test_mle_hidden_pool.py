"""mle_hidden_pool: the MTP hidden-state pool of sglang's multi-layer EAGLE worker against the
request slots of a real ``ReqToTokenPool``. Detection on the installed worker's code and pool;
the pool made by sglang's own allocation expression (read from the installed ``__init__``), the
hook on sglang's real ``init_attention_backend``. The kernel that writes one row per request
(``assign_hidden_states_pool_triton``) and the draft backends need a GPU (GPU rows)."""

from __future__ import annotations

import ast

import pytest
import torch

from sglang_swa_plugin.check import mle_hidden_pool as sc, testbed as tb
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.hooks import mle_hidden_pool as mh
from sglang_swa_plugin.probe import optional_module, own_function

from helpers import methods_alone, scenario_or_skip, skip_unless_needed

FIX = mh.FIX


def _worker_class():
    # the model runner first: on 0.5.10 importing it runs the start-up hook, which must not
    # meet the worker's speculative modules half imported
    optional_module("sglang.srt.model_executor.model_runner")
    mod = optional_module(mh.MODULE)
    return getattr(mod, "MultiLayerEagleDraftWorker", None) if mod is not None else None


def test_detection_is_decided():
    assert FIX.detect().verdict is not Verdict.UNKNOWN, FIX.detect().reason


def test_detection_reads_the_pool_and_the_slots():
    """Needed exactly where sglang's pool has ``size`` rows and a real ReqToTokenPool hands out
    slot ``size``; the verdict follows both facts, read independently here."""
    pool = tb.make_req_to_token_pool(size=3)
    slot_size = max(pool.free_slots) == pool.size
    cls = _worker_class()
    call = mh.pool_allocation(own_function(cls, "__init__")) if cls is not None else None
    short = call is not None and "req_to_token_pool.size" in ast.unparse(call.args[0])
    assert (FIX.detect().verdict is Verdict.NEEDED) == (slot_size and short), FIX.detect().reason


def _stand_in(short: bool, size: int = 4):
    """A ``MultiLayerEagleDraftWorker`` with what ``init_attention_backend`` and the hook read, its
    pool one row shorter than ``req_to_token`` (``short``) or as long; sglang's loop over draft
    steps gets none (its backends need a GPU)."""
    cls = _worker_class()
    if cls is None:
        pytest.skip("no multi-layer EAGLE draft worker in this sglang")
    worker = sc.stand_in(cls, size)
    worker.speculative_num_steps = 0
    rows = worker.req_to_token_pool.req_to_token.shape[0] - int(short)
    setattr(worker, mh.POOL, torch.full((rows, 2, 8), 7.0, dtype=torch.bfloat16))
    return worker


def test_a_short_pool_gets_a_row_per_slot_before_sglang_builds_the_backends():
    worker = _stand_in(short=True)
    seen = {}

    def original(self):  # what runs next in sglang: the backends, then the graphs capture the pool
        seen["rows"] = getattr(self, mh.POOL).shape[0]

    mh._rows_for_every_slot(original, worker)
    pool = getattr(worker, mh.POOL)
    assert seen["rows"] == worker.req_to_token_pool.req_to_token.shape[0]
    assert pool.shape[1:] == (2, 8) and pool.dtype is torch.bfloat16 and pool.device.type == "cpu"
    pool[torch.tensor(sorted(worker.req_to_token_pool.free_slots))] = 1.0  # every slot has its row


def test_a_pool_with_every_row_is_kept():
    worker = _stand_in(short=False)
    before = getattr(worker, mh.POOL)
    mh._rows_for_every_slot(lambda self: None, worker)
    assert getattr(worker, mh.POOL) is before


def test_the_scenario_shows_the_missing_row_on_stock_and_every_row_with_the_fix():
    from sglang_swa_plugin.core import temporarily_installed

    skip_unless_needed(FIX)
    cls = _worker_class()
    with methods_alone(FIX, {cls: ("init_attention_backend",)}):
        out = scenario_or_skip("mle_hidden_pool")
        assert out.bug and out.seen["pool_rows"] == 4 and 4 in out.seen["slots"], out.seen
        assert "out of bounds" in out.seen["error"], out.seen
        with temporarily_installed(FIX):
            out = scenario_or_skip("mle_hidden_pool")
    assert not out.bug and out.seen["pool_rows"] == out.seen["req_to_token_rows"] == 5, out.seen


def test_the_scenario_is_right_where_sglang_sizes_the_pool_itself():
    if FIX.detect().verdict is Verdict.NEEDED:
        pytest.skip("needed here: the test above")
    out = scenario_or_skip("mle_hidden_pool")
    assert not out.bug, out.seen
