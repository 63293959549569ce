"""Known gaps: stock sglang bugs seen on a GPU against the model (``tests/gpu/RESULTS.md``), or
read in sglang's source and shown on the CPU (their ``what`` says so), on paths the plugin
leaves as they are, each with what to use instead. One list for ``doctor``
(text and ``--json``) and README's "What it does not fix yet" table (``tests/test_records.py``
holds the two equal): an operator who reads ``applied`` for a model's fix also reads which of
that model's paths stay wrong.

A gap is listed whatever sglang is installed (its ``path`` names the releases where it was
seen, where it is bound to some): which model, backend and mode a server runs is not known
before it starts. A fix that meets a gap's path at
run time says so once in the server log (``warned_by``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class Gap:
    model: str
    path: str  # backend, speculative mode, and the releases where it was seen
    what: str  # what happens, stock and with the plugin
    instead: str  # a backend or mode that gives the model's tokens
    warned_by: Optional[str] = None  # the fix whose one-time server-log warning names this path

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


GAPS: Tuple[Gap, ...] = (
    Gap("Llama 4", "trtllm_mha's prefill (Blackwell's context kernel; Hopper's fmha_v2, sglang 0.5.19+), "
                   "prompts longer than a chunk (8192)",
        "stock: its chunked layers attend the whole prompt; the plugin's virtual requests for it "
        "(`trtllm_local_attn`'s decode and verify ran on a GPU) are a preview, not run on a GPU: "
        "SGLANG_SWA_PLUGIN_PREVIEW=trtllm_local_attn_prefill", "fa3, or triton", warned_by="trtllm_local_attn"),
    Gap("MiMo-V2", "fa3, NEXTN topk > 1, sglang 0.5.11 and 0.5.17 (CUDA graphs on and off)",
        "the server does not start (`shape '[-1, 1, 1, 192]' is invalid`: fa3's topk > 1 (cascade) call views "
        "the value cache with the key head size; not in 0.5.23's source)",
        "topk 1, or triton"),
    Gap("any model (seen on GPT-OSS, Llama 4, MiMo-V2)",
        "triton, EAGLE3/NEXTN topk > 1 (or any topk with --disable-overlap-schedule), CUDA graphs on, sglang 0.5.11",
        "the model's tokens, but 1.3-1.5 tokens accepted per step where eager accepts 2.4-3.3: the non-overlap worker "
        "packs each request's accepted tokens for the draft extend, triton's draft-extend CUDA graph lays out "
        "steps + 1 per request (not a sliding-window bug; by the source 0.5.12 too, gone from 0.5.13)",
        "topk 1 (on the default overlap scheduler)"),
    Gap("MiMo-V2", "trtllm_mha without speculation; flashinfer, sglang 0.5.11",
        "the server does not start: sglang views the value cache with the key head size (trtllm_mha; "
        "0.5.17 stock too), or passes attention sinks its flashinfer backend does not take", "fa3, or triton"),
    Gap("GPT-OSS", "trtllm_mha without speculation (page 64), sglang 0.5.17, CUDA graphs on and off",
        "other tokens than the model on about 2 requests of 3, most from their first tokens (stock the same; "
        "its EAGLE3 topk 1 rows give the model's tokens)", "fa3, or triton"),
    Gap("any hybrid SWA model", "fa3, EAGLE/NEXTN, CUDA graphs on, requests within the draft tokens of the context "
                                "length (sglang 0.5.11 and 0.5.23 read; #34239, fix #35985 open)",
        "expected an illegal memory access (shown on the CPU, not yet on a GPU): the graph's page tables are "
        "context_len wide while a verify or draft extend hands FA3 seq_len + draft tokens keys, so its last "
        "rows are read past the table (on the CPU at context_len 4096, 4 drafts: 4099 keys over a 4096-wide row)",
        "triton, or --disable-cuda-graph (eager FA3 reads req_to_token, context_len + 4 + draft tokens wide)"),
    Gap("any hybrid SWA model", "triton, --enable-deterministic-inference, EAGLE/NEXTN verify (any topk)",
        "expected wrong tokens once a request is longer than the window (shown on the CPU through sglang's kernels, "
        "not yet on a GPU): the unified kernel reads the window's keys under a mask laid out for the whole prefix; "
        "the plugin's rail for it is a preview, not run on a GPU: "
        "SGLANG_SWA_PLUGIN_PREVIEW=triton_swa_tree_verify_deterministic (0.5.12+; sglang 0.5.11 also reads the new "
        "keys at full-pool ids in the SWA cache, prefill too: #23984, fixed 0.5.12)",
        "no --enable-deterministic-inference"),
    Gap("any hybrid SWA model (seen upstream on Gemma 4)", "--enable-unified-memory (opt-in, sglang 0.5.23; #37560, "
        "#36403 merged; #37627, #40491, #40326-#40331 open)",
        "expected a device-side index assert (read in the source, not run): req_to_token holds virtual ids and the "
        "SWA virtual-to-physical table is sized by SWA pages; the plugin's rails do not translate virtual ids, so "
        "`triton_swa_tree_verify` leaves this pool as sglang runs it (one warning)",
        "the default pools (no --enable-unified-memory)"),
    Gap("EAGLE-3 drafters with sliding-window layers",
        "--speculative-draft-window-size over a hybrid SWA target (#24664; sglang 0.5.12+, not in 0.5.10-0.5.11): "
        "triton on 0.5.12, flashinfer on 0.5.12 and 0.5.13",
        "expected fewer accepted drafts, the target's tokens unchanged (triton shown on the CPU, flashinfer read in "
        "the source; not run on a GPU): the draft owns a full-only pool but shares the target's SWA allocator, and "
        "these releases translate the drafter's window ids through that allocator's full->SWA mapping: its sliding "
        "layers read other keys of the draft pool (the plugin's triton rails follow sglang's helper there). "
        "triton 0.5.13+, fa3, trtllm_mha (0.5.12 with `trtllm_swa_pool`) and flashinfer 0.5.14+ read the draft's own pool",
        "fa3 or trtllm_mha, or sglang 0.5.14+ (or no draft window)"),
    Gap("Gemma 4", "--swa-full-tokens-ratio 0.1 (#23375 open, sglang main of 0.5.10's time, H200)",
        "an illegal memory access in sliding-window attention, upstream; no root cause there, none found here "
        "(not reproduced on the CPU: no small-SWA-pool scenario yet)", "the default --swa-full-tokens-ratio"),
)

NOT_RUN: Tuple[str, ...] = ()  # paths never run against the model (README: "Not run yet: ...")


def report() -> dict:
    """What ``doctor --json`` shows under ``gaps``."""
    return {"gaps": [g.as_dict() for g in GAPS], "not_run": list(NOT_RUN)}


def print_gaps(rep: dict, p=print) -> None:
    """``doctor``'s section from its report (``report()``'s keys): one line per gap, what to use
    instead on the next."""
    p("not fixed yet (stock bugs seen against the model on a GPU; the plugin leaves them as they are):")
    w = max([len(g["model"]) for g in rep["gaps"]] + [1])
    for g in rep["gaps"]:
        p(f"  {g['model']:<{w}}  {g['path']}: {g['what']}")
        p(f"  {'':<{w}}  instead: {g['instead']}")
    for path in rep["not_run"]:
        p(f"  not run yet: {path}")
