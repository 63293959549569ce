"""Which rows the selftest runs, and each row's server arguments: per target, every attention
backend the installed sglang has and the GPU can run, in plain decode and (targets with an
EAGLE3 draft) EAGLE3 topk 1 and 2 or (targets with MTP layers) multi-layer EAGLE and NEXTN
(topk 1 and 2), less the modes a target leaves out (its ``MODES``: Step3.5 has no NEXTN rows),
with the plugin and, where asked, stock; CUDA graphs on (sglang's default) and,
where asked, off; a large pool and, where asked, a small one that retracts; and, where asked,
the opt-in variants (``VARIANTS``: chunked prefill, prefix-cache hits, page sizes, trtllm_mha's
decode-mode verify, triton's deterministic inference; tensor parallelism and DP attention on a
set of GPUs per server). ``default_required`` gives the rows that must run.

What is decided before a server starts is only what needs no model: the backend is one of
sglang's ``--attention-backend`` choices, the GPU is new enough for it, the flags exist in this
sglang (read from its own argument parser, never from its version string). What sglang
accepts for a model and backend is left to sglang: such a row runs, and a refusal from its
argument handling is reported as that (``server.refusal``)."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional

BACKENDS = ("fa3", "flashinfer", "triton", "trtllm_mha")


class Spec(NamedTuple):
    """A speculative mode: the draft kind it needs, sglang's algorithm, topk, steps, draft tokens."""

    draft: str
    algorithm: str
    topk: int
    steps: int
    draft_tokens: int


# EAGLE3 with the target's real-weight draft (as the GPU results); MTP layers: EAGLE (sglang
# runs MiMo-V2's MTP layers as multi-layer EAGLE, one layer per step) and NEXTN (one MTP layer,
# draft decode steps; topk 1, and 2: a tree of drafts).
MODES = {"plain": None, "k1": Spec("eagle3", "EAGLE3", 1, 3, 4), "k2": Spec("eagle3", "EAGLE3", 2, 3, 4),
         "mtp": Spec("mtp", "EAGLE", 1, 3, 4), "nextn": Spec("mtp", "NEXTN", 1, 3, 4),
         "nextn_k2": Spec("mtp", "NEXTN", 2, 3, 4)}
# The pools: "large" holds every request; "small" (--max-total-tokens 4096) holds a third of
# 32 requests of 194 tokens: sglang retracts and recomputes requests.
POOLS = {"large": 16384, "small": 4096}
HOPPER, BLACKWELL = (9, 0), (10, 0)

# Flags that were renamed between releases: the first alternative whose flags this sglang's
# parser has (the older names first: the GPU results were measured with them).
NO_PREFILL_GRAPHS = (["--disable-piecewise-cuda-graph"], ["--disable-prefill-cuda-graph"])
GRAPH_MAX_BS = (["--cuda-graph-max-bs", "32"], ["--cuda-graph-max-bs-decode", "32"])
EAGER = (["--disable-cuda-graph"], ["--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"])


class SglangOptions(NamedTuple):
    """What the installed sglang's command line accepts: its option strings and its
    ``--attention-backend`` choices."""

    flags: frozenset
    backends: tuple


def sglang_options() -> SglangOptions:
    """Read from sglang's own parser (``ServerArgs.add_cli_args``), as ``launch_server``
    builds it."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    actions = parser._option_string_actions  # noqa: SLF001 - the parser's own table of options
    choices = actions["--attention-backend"].choices if "--attention-backend" in actions else ()
    return SglangOptions(frozenset(actions), tuple(choices or ()))


def pick(flags: Iterable[str], alternatives) -> Optional[list]:
    """The first alternative whose options all exist in ``flags``; None: none does."""
    have = set(flags)
    for alt in alternatives:
        if all(a in have for a in alt if a.startswith("--")):
            return list(alt)
    return None


class Gpu(NamedTuple):
    name: str
    capability: tuple  # (major, minor)
    count: int = 1  # the CUDA devices the servers see


GPU_PROBE = ("import json, torch\n"
             "ok = torch.cuda.is_available()\n"
             "print(json.dumps(ok and [torch.cuda.get_device_name(0), list(torch.cuda.get_device_capability(0)),"
             " torch.cuda.device_count()]))")


def detect_gpu() -> Optional[Gpu]:
    """The first CUDA device sglang's servers will see (CUDA_VISIBLE_DEVICES applies): asked in
    a child process, so that this one holds no CUDA context while the servers size their pools."""
    try:
        proc = subprocess.run([sys.executable, "-c", GPU_PROBE], capture_output=True, text=True, timeout=180)
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception:  # noqa: BLE001 - no torch, no driver, no output: no GPU
        return None
    return Gpu(found[0], tuple(found[1]), *found[2:3]) if found else None


def backend_args(backend: str, capability: tuple, options: SglangOptions):
    """(server arguments, None) for ``backend`` on a GPU of ``capability``, or (None, why not).
    fa3 runs on Hopper; trtllm_mha on sm90 and newer: on Hopper its decode (XQA) with fa3's
    prefill, as sglang releases before 0.5.19 refuse its prefill there; flashinfer and triton
    everywhere."""
    if backend not in options.backends:
        return None, f"this sglang has no {backend} attention backend"
    if backend == "fa3" and capability[0] != HOPPER[0]:
        return None, f"fa3 runs on Hopper (sm90); this GPU is sm{capability[0]}{capability[1]}"
    if backend == "trtllm_mha":
        if capability < HOPPER:
            return None, f"trtllm_mha needs sm90 or newer; this GPU is sm{capability[0]}{capability[1]}"
        if capability[0] == HOPPER[0]:
            args = ["--decode-attention-backend", "trtllm_mha", "--prefill-attention-backend", "fa3"]
            missing = [a for a in args if a.startswith("--") and a not in options.flags]
            return (None, f"this sglang has no {missing[0]}") if missing else (args, None)
    return ["--attention-backend", backend], None


def eagle3(draft: str, topk: int, steps: int, draft_tokens: int, algorithm: str = "EAGLE3") -> list:
    """Server arguments for a draft with real weights (its checkpoint; EAGLE3 unless
    ``algorithm`` says otherwise)."""
    return ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", draft,
            "--speculative-eagle-topk", str(topk), "--speculative-num-steps", str(steps),
            "--speculative-num-draft-tokens", str(draft_tokens)]


class Saved(NamedTuple):
    """A saved target: its checkpoint, its draft's (None: none), the draft's kind (MODES' Spec.draft),
    the server arguments it needs (e.g. --trust-remote-code), those it needs on one backend
    (``{backend: args}``) and the modes it runs (keys of MODES; None: every mode of its draft's
    kind)."""

    target: str
    draft: Optional[str]
    draft_kind: Optional[str] = "eagle3"
    server_args: tuple = ()
    backend_server_args: tuple = ()  # ((backend, args), ...)
    modes: Optional[tuple] = None


def saved_target(target, checkpoint: str, draft: Optional[str]) -> Saved:
    """The Saved of a target module (``targets``' attributes) whose checkpoints are saved at
    ``checkpoint`` and ``draft``."""
    from . import targets

    modes = getattr(target, "MODES", None)
    return Saved(checkpoint, draft, targets.draft_kind(target), tuple(getattr(target, "SERVER_ARGS", ())),
                 tuple(getattr(target, "BACKEND_SERVER_ARGS", {}).items()), None if modes is None else tuple(modes))


def exact_base(target: str, total: int = 16384, piecewise: bool = False, swa_ratio: float = 0.25,
               mem_fraction: float = 0.5, flags: Optional[Iterable[str]] = None) -> list:
    """sglang's defaults (CUDA graphs on, the backend's page size) for rows judged against the
    model's output; piecewise (prefill) CUDA graphs only where asked: they compile for about
    two minutes per server and are not what these rows test. ``flags``: the installed sglang's
    options (``sglang_options().flags``), which pick the renamed flags; None: the names of
    sglang 0.5.10-0.5.22."""
    no_prefill_graphs = NO_PREFILL_GRAPHS[0] if flags is None else (pick(flags, NO_PREFILL_GRAPHS) or [])
    graph_max_bs = GRAPH_MAX_BS[0] if flags is None else (pick(flags, GRAPH_MAX_BS) or [])
    return ["--skip-tokenizer-init", *([] if piecewise else no_prefill_graphs),
            "--mem-fraction-static", str(mem_fraction),
            "--max-total-tokens", str(total), "--swa-full-tokens-ratio", str(swa_ratio), "--random-seed", "0",
            "--model-path", target, *graph_max_bs]


# The opt-in row variants (each a row of its own per target, backend and mode, CUDA graphs on,
# large pool, with the variant's name in its key), and what they add to the server:
# - chunk64: ``--chunked-prefill-size 64``: the 130-token prompts are prefilled in chunks of 64
#   tokens, each chunk boundary inside some layer's window (the next chunk's first queries read
#   keys the previous chunk wrote);
# - prefix: every request sent twice, the second time once the first have finished: it finds its
#   prompt in sglang's prefix (radix) cache, and both times are judged;
# - page1, page64: ``--page-size 1`` / ``64`` (the rows' default is the backend's own size); no
#   such rows where the target sets a page size for the backend (Llama 4's chunk on trtllm_mha);
# - decodeverify: trtllm_mha's speculative rows with ``--speculative-attention-mode decode``
#   (verify through the decode backend, XQA; on Hopper every other trtllm_mha verify runs fa3);
# - deterministic: triton's rows with ``--enable-deterministic-inference``;
# - tpN, tpNdpattn: the row on N GPUs, ``--tp-size N`` (and ``--enable-dp-attention --dp-size
#   N``), each server on its own set of N devices (``CUDA_VISIBLE_DEVICES``).
# Each variant needs its flags in this sglang's parser (else: not run, and why). sglang may
# change such a setting on its own (trtllm_mha takes pages of 16, 32 or 64 and makes a page
# size of 1 into 64): ``Planned.settings`` are the fields the server must keep, read back from
# its log; a server that changed one is reported as refused by sglang.
CHUNK = 64
PAGE_SIZES = (1, 64)
VARIANTS = ("chunk64", "prefix", "page1", "page64", "decodeverify", "deterministic")


def variant_of(variant: str, backend: str, spec: Optional[Spec], saved: Optional["Saved"] = None) -> bool:
    """Whether ``variant`` has a row for ``backend``, the mode's ``spec`` and the target
    ``saved`` (no page-size rows where the target sets the backend's page size itself)."""
    if variant.startswith("page") and saved is not None:
        return "--page-size" not in [*saved.server_args, *dict(saved.backend_server_args).get(backend, ())]
    if variant == "decodeverify":
        return backend == "trtllm_mha" and spec is not None
    if variant == "deterministic":
        return backend == "triton"
    return True


def _variant_args(variant: str, options: "SglangOptions", gpus: int) -> tuple:
    """(server arguments, {ServerArgs field: value sglang must keep}, repeats, ranks) of a
    variant, or (None, why not)."""
    def needs(*flags):
        missing = [f for f in flags if f not in options.flags]
        return f"this sglang has no {missing[0]}" if missing else None

    if variant == "chunk64":
        why = needs("--chunked-prefill-size")
        return (None, why) if why else (["--chunked-prefill-size", str(CHUNK)], {"chunked_prefill_size": str(CHUNK)}, 1, 1)
    if variant == "prefix":
        return [], {"disable_radix_cache": "False"}, 2, 1
    if variant.startswith("page"):
        size = variant[len("page"):]
        why = needs("--page-size")
        return (None, why) if why else (["--page-size", size], {"page_size": size}, 1, 1)
    if variant == "decodeverify":
        why = needs("--speculative-attention-mode")
        return (None, why) if why else (["--speculative-attention-mode", "decode"],
                                        {"speculative_attention_mode": "decode"}, 1, 1)
    if variant == "deterministic":
        why = needs("--enable-deterministic-inference")
        return (None, why) if why else (["--enable-deterministic-inference"], {"enable_deterministic_inference": "True"}, 1, 1)
    if variant.startswith("tp"):
        n, dp = int(variant[2:].removesuffix("dpattn")), variant.endswith("dpattn")
        why = needs("--tp-size", *(("--enable-dp-attention", "--dp-size") if dp else ()))
        if why:
            return None, why
        if gpus < n:
            return None, f"needs {n} GPUs; {gpus} here"
        args = ["--tp-size", str(n)] + (["--enable-dp-attention", "--dp-size", str(n)] if dp else [])
        settings = {"tp_size": str(n), **({"enable_dp_attention": "True", "dp_size": str(n)} if dp else {})}
        return args, settings, 1, n
    raise ValueError(f"unknown row variant {variant!r}")


# The default required rows (``--require`` unset, no ``--rows``): per target the installed sglang
# serves (its model class is in sglang's models; an unavailable target whose model sglang
# serves is then missing), every row of each attention backend the GPU's architecture runs and
# this sglang offers (its --attention-backend choices, never its version string). A required
# row that was not run, or a pattern no row matches, is a failure; a row sglang refuses, or a
# plugin row excused as sglang's own failure, did run.
ARCH_BACKENDS = {9: ("fa3", "flashinfer", "triton", "trtllm_mha"),  # Hopper (trtllm_mha: its decode, XQA)
                 10: ("flashinfer", "triton", "trtllm_mha")}  # Blackwell (sm100, sm103)
OTHER_ARCH_BACKENDS = ("flashinfer", "triton")


def default_required(served_targets: Iterable[str], backends: Iterable[str], capability: Optional[tuple],
                     options: "SglangOptions") -> list:
    """The default required row patterns (``target/backend/*``) for the targets sglang serves
    among those asked for, the backends asked for, the GPU's ``capability`` and sglang's
    ``options``."""
    if capability is None:
        return []
    arch = ARCH_BACKENDS.get(capability[0], OTHER_ARCH_BACKENDS)
    return [f"{t}/{b}/*" for t in served_targets for b in backends if b in arch and b in options.backends]


def devices(count: int, environ: Optional[dict] = None) -> list:
    """The CUDA device ids the servers may use: CUDA_VISIBLE_DEVICES's where set, else 0..count-1."""
    import os

    visible = (environ if environ is not None else os.environ).get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        return [d.strip() for d in visible.split(",") if d.strip()]
    return [str(i) for i in range(count)]


@dataclass(frozen=True)
class Row:
    """One server of the matrix: a target, an attention backend, a mode (a key of MODES), with
    the plugin or stock, CUDA graphs on or off, a large or a small pool."""

    target: str
    backend: str
    mode: str
    plugin: bool
    graphs: bool = True
    pool: str = "large"
    variant: str = ""  # one of VARIANTS, "tpN" or "tpNdpattn"; "": none

    @property
    def key(self) -> str:
        """``target/backend/mode[/eager][/small][/variant]/plugin|stock``: what ``--rows`` patterns match."""
        return "/".join([self.target, self.backend, self.mode, *([] if self.graphs else ["eager"]),
                         *([] if self.pool == "large" else [self.pool]), *([self.variant] if self.variant else []),
                         "plugin" if self.plugin else "stock"])


class Planned(NamedTuple):
    """A row with its server arguments (None: not run, ``why_not`` says why), the environment
    it adds (``env``: ``((name, value), ...)``, e.g. its GPUs), the ServerArgs fields sglang
    must keep as set (``settings``), how many times its requests are sent (``repeats``) and
    its tensor-parallel size (``ranks``)."""

    row: Row
    args: Optional[list]  # None: not run
    why_not: Optional[str]
    env: tuple = ()
    settings: tuple = ()
    repeats: int = 1
    ranks: int = 1


def plan(targets: dict, backends: Iterable[str], capability: Optional[tuple], options: SglangOptions,
         stock: bool = False, graphs_off: bool = False, patterns: Iterable[str] = (),
         mem_fraction: float = 0.85, small_pool: bool = False, variants: Iterable[str] = (), tp: int = 1,
         dp_attention: bool = False, gpus: Optional[list] = None) -> list:
    """The rows, in order, each with its server arguments or why it is not run. ``targets``:
    ``{name: Saved (or a tuple of its fields) or a reason the target is not available}`` (an
    unavailable target has no rows: the target checks say why); ``capability``: the GPU's
    (None: no GPU); ``patterns``: ``--rows`` (fnmatch on Row.key, empty: every row; a pattern
    that names ``stock``, ``eager`` or ``small`` as one of its parts plans the rows of that kind it
    matches, as ``stock``, ``graphs_off`` or ``small_pool`` plan them all);
    ``variants``: of VARIANTS, the opt-in rows; ``tp`` > 1: every default row also on ``tp``
    GPUs (and with ``dp_attention``, with DP attention too), each server on its own set of
    ``gpus`` (device ids, ``devices()``; default: one device)."""
    patterns, gpus = list(patterns), list(gpus if gpus is not None else ["0"])
    extra = list(variants) + ([f"tp{tp}"] + ([f"tp{tp}dpattn"] if dp_attention else []) if tp > 1 else [])
    device_sets = [gpus[k * tp:(k + 1) * tp] for k in range(len(gpus) // tp)] if tp > 1 else []
    out, sets = [], {}
    for name, saved in targets.items():
        if isinstance(saved, str):
            continue
        saved = Saved(*saved)
        for backend in backends:
            for mode, spec in MODES.items():
                if spec is not None and (saved.draft is None or spec.draft != saved.draft_kind):
                    continue  # the target has no draft of this kind: no such rows (said once per target)
                if saved.modes is not None and mode not in saved.modes:
                    continue  # a mode the target leaves out (its MODES say why)
                for graphs in (True, False):
                    for pool in ("large", "small"):
                        for variant in [""] + (extra if graphs and pool == "large" else []):
                            if variant and not variant_of(variant, backend, spec, saved):
                                continue
                            for plugin in (True, False):
                                row = Row(name, backend, mode, plugin, graphs, pool, variant)
                                if patterns and not any(fnmatch.fnmatchcase(row.key, p) for p in patterns):
                                    continue
                                if not ((graphs or graphs_off or _named(patterns, row.key, "eager"))
                                        and (pool == "large" or small_pool or _named(patterns, row.key, "small"))
                                        and (plugin or stock or _named(patterns, row.key, "stock"))):
                                    continue
                                p = _planned(row, saved, spec, capability, options, mem_fraction, len(gpus))
                                if p.ranks > 1 and p.args is not None and device_sets:
                                    # a row and its stock twin on the same set of devices, the sets in turn
                                    twin = dataclasses.replace(row, plugin=True)
                                    ds = sets.setdefault(twin, device_sets[len(sets) % len(device_sets)])
                                    p = p._replace(env=(("CUDA_VISIBLE_DEVICES", ",".join(ds)),))
                                out.append(p)
    return out


def _named(patterns: list, key: str, part: str) -> bool:
    """True where a pattern that has ``part`` as one of its /-parts matches ``key``: that
    kind of row was asked for by name (``mimo_v2/triton/nextn/eager/stock``)."""
    return any(part in p.split("/") and fnmatch.fnmatchcase(key, p) for p in patterns)


def _planned(row: Row, saved: Saved, spec: Optional[Spec], capability, options, mem_fraction, gpus: int = 1) -> Planned:
    if capability is None:
        return Planned(row, None, "no CUDA GPU")
    args, why_not = backend_args(row.backend, capability, options)
    if args is None:
        return Planned(row, None, why_not)
    args = exact_base(saved.target, POOLS[row.pool], mem_fraction=mem_fraction, flags=options.flags) + args
    args += list(saved.server_args) + list(dict(saved.backend_server_args).get(row.backend, ()))
    if spec is not None:
        args += eagle3(saved.draft, spec.topk, spec.steps, spec.draft_tokens, spec.algorithm)
    if not row.graphs:
        eager = pick(options.flags, EAGER)
        if eager is None:
            return Planned(row, None, "this sglang has no flag that turns CUDA graphs off")
        args += eager
    if not row.variant:
        return Planned(row, args, None)
    got = _variant_args(row.variant, options, gpus)
    if got[0] is None:
        return Planned(row, None, got[1])
    more, settings, repeats, ranks = got
    return Planned(row, args + more, None, (), tuple(settings.items()), repeats, ranks)
