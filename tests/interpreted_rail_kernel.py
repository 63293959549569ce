"""``sglang_swa_plugin.rail_kernel`` (the Triton kernel that lays out a tree verify's rail) against
``triton_rail``'s torch form of the same layout, under Triton's interpreter (run with
``TRITON_INTERPRET=1``; harness: tests/interpreted.py): random EAGLE trees after random request
lengths, both rules, windows and chunks small (drafts cross chunk and window edges, trees deeper
than the window) and of 2000 (rows longer than the kernel's block); and the decode's chunk rail
(``chunk_rail_layout``) for random lengths. Per seed one JSON line: cases, cells compared, and
the cells and offsets that differ, for each."""

from __future__ import annotations

import json
import os
import random

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402

from sglang_swa_plugin import triton_rail  # noqa: E402
from sglang_swa_plugin.check.testbed import tree_inputs  # noqa: E402
from sglang_swa_plugin.rail_kernel import chunk_rail_layout, tree_rail_layout  # noqa: E402


class Metadata:  # the two fields of sglang's metadata a rail reads
    def __init__(self, mask, lens, n):
        self.custom_mask = mask
        self.mask_indptr = torch.zeros(len(lens) + 1, dtype=torch.int64)
        self.mask_indptr[1:] = torch.cumsum(torch.tensor([n * (m + n) for m in lens]), 0)


def case(rng, rule: str, size: int, longest: int):
    n = rng.randint(1, 6)
    parents = [-1] + [rng.randint(-1, i - 1) for i in range(1, n)]
    lens = [rng.randint(1, longest) for _ in range(rng.randint(1, 5))]
    mask, positions = tree_inputs(parents)(lens)
    md = Metadata(mask, lens, n)
    seq = torch.tensor(lens, dtype=torch.int64)
    kernel = tree_rail_layout(seq, positions, mask, md.mask_indptr, triton_rail.RULES[rule], size, n, torch.int64)
    torch_form = triton_rail._layout(seq, positions, md, rule, size, n)
    used = int(torch_form[4][-1])  # cells past the last row are never read
    offsets = zip(kernel[:3] + kernel[4:], torch_form[:3] + torch_form[4:])  # all but the mask
    differ = sum(int((a.long() != b.long()).sum()) for a, b in offsets)
    differ += int((kernel[3][:used] != torch_form[3][:used]).sum())
    return used, differ


def decode_case(rng):
    """A decode's chunk rail (``chunk_slots``' offsets): lengths across and at chunk edges."""
    chunk = rng.choice([1, 3, 4, 2000])
    # 0: a padded row of a CUDA graph
    seq = torch.tensor([rng.randint(0, 3 * chunk + 1) for _ in range(rng.randint(1, 40))], dtype=torch.int64)
    kernel, torch_form = chunk_rail_layout(seq, chunk), triton_rail._chunk_layout(seq, chunk)
    return sum(int((a.long() != b.long()).sum()) for a, b in zip(kernel, torch_form)), int(torch_form[0][-1])


if __name__ == "__main__":
    for seed in (int(s) for s in os.environ.get("SEEDS", "0").split(",")):
        rng, cases, cells, differ = random.Random(seed), 0, 0, 0
        for rule, size, longest in [("window", 2, 14), ("window", 5, 14), ("chunk", 3, 14), ("chunk", 4, 14),
                                    ("window", 2000, 2600), ("chunk", 2000, 4100)] * 4:
            used, bad = case(rng, rule, size, longest)
            cases, cells, differ = cases + 1, cells + used, differ + bad
        decode = [decode_case(rng) for _ in range(24)]
        print(json.dumps({"seed": seed, "cases": cases, "cells": cells, "differ": differ,
                          "decode_cases": len(decode), "decode_keys": sum(k for _, k in decode),
                          "decode_differ": sum(d for d, _ in decode)}), flush=True)
