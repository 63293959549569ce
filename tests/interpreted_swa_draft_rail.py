"""``sglang_swa_plugin.rail_kernel.window_of_rail_layout`` (the Triton kernel of a draft step's
window rail, ``triton_swa_draft``) against the hook's torch form (``window_rails``), under
Triton's interpreter (run with ``TRITON_INTERPRET=1``; harness: tests/interpreted.py): random
rails of 1-40 requests shorter and longer than the window (windows of 1-7 and 300: rows longer
than the kernel's block), empty rows, rails claiming keys past the ``kv_indices`` slice, ids
outside the full pool, with the pool's mapping and without one. Per seed one JSON line: cases,
slots compared, and the slots and offsets that differ; then the draft-extend graph fill's
translation (``translate_head`` against ``translate_window``'s torch form): random window rails
of 1-40 requests (ids -1 among them, sglang's padding) in buffers longer and shorter than
``bs * (window + 1)``. The cases take a device: tests/gpu/rail_kernel_gpu.py runs them compiled on a GPU."""

from __future__ import annotations

import json
import os
import random
from types import SimpleNamespace

import torch

from sglang_swa_plugin.hooks import triton_swa_draft as tsd
from sglang_swa_plugin.rail_kernel import translate_head, window_of_rail_layout


def backend(window: int, mapping):
    """The fields ``window_rails`` reads of a backend: its window and its pool's mapping (the
    pool's own translation is ``mapping[ids]``, as SWAKVPool's)."""
    pool = SimpleNamespace(full_to_swa_index_mapping=mapping,
                           translate_loc_from_full_to_swa=(lambda ids: mapping[ids].to(torch.int32)))
    return SimpleNamespace(sliding_window_size=window, token_to_kv_pool=pool if mapping is not None else None)


def case(rng: random.Random, gen: torch.Generator, device: str = "cpu"):
    window = rng.choice([1, 2, 5, 7, 300])
    bs, size = rng.randint(1, 40), rng.randint(20, 2000)
    mapping = None
    if rng.random() < 0.8:  # the pool's full->SWA ids, its last entry -1 (sglang's padding sentinel)
        mapping = torch.cat([torch.randint(0, size, (size - 1,), generator=gen), torch.tensor([-1])])
    lens = [rng.choice([0, rng.randint(1, window + 3), rng.randint(0, 2 * window + 5)]) for _ in range(bs)]
    kv_indptr = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    total = int(kv_indptr[-1])
    n = max(1, total - rng.choice([0, 0, 3]))  # a stale capture: the rail claims keys past the slice
    kv_indices = torch.randint(-2, size + 4, (n,), generator=gen)  # some outside the pool
    kv_indptr, kv_indices = kv_indptr.to(device), kv_indices.to(device)
    mapping = mapping.to(device) if mapping is not None else None
    be = backend(window, mapping)
    cum, want = tsd.window_rails(be, kv_indptr[None], kv_indices[None], bs)
    out_indptr = torch.full((bs + 2,), -7, dtype=torch.int32, device=device)
    out_ids = torch.full((bs * window + 5,), -7, dtype=torch.int64, device=device)
    window_of_rail_layout(kv_indptr, kv_indices, tsd._rail_state(be)["mapping"], bs, window, out_indptr, out_ids)
    differ = int((out_indptr[1 : bs + 1].long() != cum[0].long()).sum())
    differ += int((out_ids[: bs * window] != want[0].long()).sum())
    differ += int((out_ids[bs * window :] != -7).sum()) + int(out_indptr[0] != -7) + int(out_indptr[bs + 1] != -7)
    return bs * window, differ


def translate_case(rng: random.Random, gen: torch.Generator, device: str = "cpu"):
    window, bs, size = rng.choice([1, 7, 300]), rng.randint(1, 40), rng.randint(20, 2000)
    mapping = torch.cat([torch.randint(0, size, (size - 1,), generator=gen), torch.tensor([-1])]).to(device)
    be = backend(window, mapping)
    lens = [rng.randint(0, window + 1) for _ in range(bs)]
    indptr = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    out = torch.randint(-1, size, (rng.choice([bs * (window + 1) + 9, max(1, int(indptr[-1]) - 2)]),), generator=gen)
    indptr, out = indptr.to(device), out.to(device)
    want, got = out.clone(), out.clone()
    state = tsd._rail_state(be)
    state["kernel"] = False
    tsd.translate_window(be, indptr, bs, want)  # the torch form
    state["kernel"] = True
    n = min(bs * (window + 1), got.shape[0])
    translate_head(got, indptr, bs, n, mapping)
    return got.shape[0], int((got != want).sum())


def seed_row(seed: int, device: str = "cpu") -> dict:
    """One seed's summary: 30 rail cases and 30 translation cases, the slots compared and those
    that differ."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    results = [case(rng, gen, device) for _ in range(30)]
    translated = [translate_case(rng, gen, device) for _ in range(30)]
    return {"seed": seed, "cases": len(results), "slots": sum(s for s, _ in results),
            "differ": sum(d for _, d in results), "translate_cases": len(translated),
            "translate_slots": sum(s for s, _ in translated), "translate_differ": sum(d for _, d in translated)}


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    for seed in (int(s) for s in os.environ.get("SEEDS", "0").split(",")):
        print(json.dumps(seed_row(seed)), flush=True)
