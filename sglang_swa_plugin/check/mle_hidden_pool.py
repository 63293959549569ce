"""CPU scenario of ``mle_hidden_pool``: does every request slot of a real ``ReqToTokenPool`` have a
row in the MTP hidden-state pool that ``MultiLayerEagleDraftWorker.__init__`` allocates? The pool
is made by sglang's own allocation expression (read from the installed ``__init__`` and evaluated
on a CPU stand-in of the worker), then what is installed on ``init_attention_backend`` runs (the
fix's hook, where installed; sglang's loop over the draft steps is given none, as its backends
need a GPU). Each slot's row is then written through torch indexing, which checks bounds on the
CPU where sglang's ``assign_hidden_states_pool_triton`` does not. Right: every slot writes a row.
``python -m sglang_swa_plugin.check.mle_hidden_pool`` prints one JSON line."""

from __future__ import annotations

from . import Outcome, print_outcome


def stand_in(cls, size: int = 4):
    """A ``MultiLayerEagleDraftWorker`` (``cls``) on the CPU with what sglang's pool allocation,
    its ``init_attention_backend`` and the fix read: a real ``ReqToTokenPool`` of ``size`` request
    slots, 3 draft steps, hidden size 8; no pool yet."""
    from types import SimpleNamespace

    import torch

    from . import testbed as tb

    worker = cls.__new__(cls)
    worker.req_to_token_pool = tb.make_req_to_token_pool(size=size, max_context_len=8)
    worker.speculative_num_steps, worker.device = 3, "cpu"
    worker.model_config = SimpleNamespace(hidden_size=8, dtype=torch.float32)
    return worker


def scenario() -> Outcome:
    """The MTP hidden-state pool sglang's multi-layer EAGLE worker allocates, after what is
    installed on its ``init_attention_backend``, written at every slot a real ``ReqToTokenPool``
    hands out: ``seen`` has the pool's rows, the slots and the error of the write, if any."""
    import ast

    import torch

    from sglang_swa_plugin.fix import ScenarioUnavailable
    from sglang_swa_plugin.hooks import mle_hidden_pool as mh
    from sglang_swa_plugin.probe import optional_module, own_function

    mod = optional_module(mh.MODULE)
    cls = getattr(mod, "MultiLayerEagleDraftWorker", None) if mod is not None else None
    init = own_function(cls, "__init__") if cls is not None else None
    call = mh.pool_allocation(init) if init is not None else None
    if call is None:
        raise ScenarioUnavailable(f"{mh.MODULE}: no multi-layer EAGLE worker with an MTP hidden-state pool")
    worker = stand_in(cls)
    slots = worker.req_to_token_pool
    expr = ast.Expression(body=call)
    setattr(worker, mh.POOL, eval(compile(expr, "<sglang's allocation>", "eval"), {"torch": torch}, {"self": worker}))
    worker.speculative_num_steps = 0  # sglang's per-step draft backends need a GPU: none are built
    cls.init_attention_backend(worker)
    pool = getattr(worker, mh.POOL)
    handed_out = sorted(slots.free_slots)
    seen = {"pool_rows": pool.shape[0], "slots": handed_out, "req_to_token_rows": slots.req_to_token.shape[0]}
    try:
        pool[torch.tensor(handed_out)] = 1.0  # what assign_hidden_states_pool_triton writes per request
    except IndexError as e:
        return Outcome(True, {**seen, "error": f"IndexError: {e}"})
    return Outcome(False, seen)


def reproduce() -> bool:
    return scenario().bug


if __name__ == "__main__":
    print_outcome(scenario)
