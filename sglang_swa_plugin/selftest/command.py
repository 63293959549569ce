"""``sglang-swa-plugin selftest``: the GPU matrix of tests/gpu/RESULTS.md as a command for the
operator's own machine. It builds the tiny targets, prints their checks (bf16 gives the float32
tokens, the margins, a window or chunk changed by one changes most outputs: the target sees a
window error), starts one real sglang server per row, sends every row the same greedy requests
(32 prompts of 130 tokens per prompt seed, 64 new tokens, 32 at once) while transformers'
float32 output of the same weights, and each speculative mode's expected accept length
(``acceptance``), are computed on the CPU, asks doctor (a child process) which fixes this
environment needs, and prints the matrix: per row, identical requests per seed, the accept
length of speculative rows and the expected one, the fixes the server applied against those
needed, and the verdict (``judging``: its rules), then one final line counting every state.

Exit status 1 when a plugin row fails a rule of ``judging`` (other tokens than the model on any
request; a speculative row below its expected accept length, without verify steps or without
an expectation; the plugin not loaded, a needed fix not applied, tensor-parallel ranks that
disagree; a prefix row that hit no cached prefix; did not start or crashed, unless excused as
sglang's own failure); when a required row (``--require``, default: ``rows.default_required``)
was not run or no row matches a required pattern; when a target fails its checks; when doctor
reports a problem or gives no report; or when no plugin row served at all. A row sglang itself
refuses for the model and backend (or whose setting it changes on its own) is shown as refused
and is no failure; stock rows (``--stock``) never fail for their tokens.

Rows: by default every target, backend and mode with CUDA graphs on and a large pool; the opt-in
flags add rows (``--graphs-off``, ``--small-pool``, ``--chunked-prefill``, ``--prefix``,
``--page-sizes``, ``--decode-verify``, ``--deterministic``, or all five paths with
``--every-path``; ``--tp N`` and ``--dp-attention``; ``rows`` says what each runs). They are
opt-in as each doubles a part of the matrix's servers (minutes each)."""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple, Optional

from .. import __version__
from . import judging, rows, server, targets

DESCRIPTION = (
    "Run the conformance matrix on this machine's GPU: tiny targets whose sliding-window (or chunked) "
    "layers decide their tokens, served by the installed sglang with every attention backend it "
    "accepts, plain and speculative (EAGLE3 topk 1 and 2; MTP layers as multi-layer EAGLE and NEXTN), "
    "with the plugin as configured here (and stock with --stock), each against transformers' float32 "
    "output of the same weights, speculative rows also against the accept length their float32 draft "
    "gives. Prints the targets' checks, then one line per row, then every state counted. Exit status 1 "
    "when a plugin row gives other tokens than the model, accepts fewer draft tokens than expected "
    "(or none), lacks a fix doctor finds needed, does not start or crashes (unless the same row without "
    "the plugin stops with the same exception at the same sglang frame and no frame of the plugin is in "
    "the traceback), or when a required row was not run (--require). A row sglang refuses for the "
    "model and backend is shown as such and does not count. Needs a CUDA GPU; takes minutes (see --parallel).")


class Protocol(NamedTuple):
    """The requests of every row: ``requests`` prompts of ``prompt_len`` tokens per prompt seed,
    ``new_tokens`` greedy tokens each; the target checks read the first ``check_requests``
    prompts of the first seed."""

    requests: int = 32
    prompt_len: int = 130
    new_tokens: int = 64
    check_requests: int = 8


PROTOCOL = Protocol()
NEEDS = ("torch", "transformers", "scipy", "safetensors")  # the targets' builders and references


def _names(allowed):
    def parse(text: str) -> list:
        names = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in names if x not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{','.join(bad) or text!r}: choose from {','.join(allowed)}")
        return names
    return parse


def _patterns(text: str) -> list:
    return [x.strip() for x in text.split(",") if x.strip()]


def _seeds(text: str) -> list:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma list of integers")
    return seeds


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: a positive number")
        return value
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The selftest's options, on the ``selftest`` subcommand's parser (``--json``, common to
    every command, is added by the command line)."""
    p.add_argument("--targets", type=_names(targets.NAMES), default=list(targets.NAMES),
                   help=f"comma list of targets (default: {','.join(targets.NAMES)})")
    p.add_argument("--backends", type=_names(rows.BACKENDS), default=list(rows.BACKENDS),
                   help=f"comma list of attention backends (default: {','.join(rows.BACKENDS)}; those this "
                        "sglang lacks or this GPU cannot run are listed as not run)")
    p.add_argument("--seeds", type=_seeds, default=[1, 2, 3],
                   help="comma list of prompt seeds, 32 requests each (default: 1,2,3)")
    p.add_argument("--parallel", type=_positive(int), default=8,
                   help="servers side by side on the GPU (default: 8)")
    p.add_argument("--mem-fraction", type=_positive(float), default=0.85,
                   help="each server's --mem-fraction-static (default: 0.85; its KV pool is capped anyway)")
    p.add_argument("--stock", action="store_true",
                   help="also run every row without the plugin (stock sglang), for comparison")
    p.add_argument("--graphs-off", action="store_true",
                   help="also run every row with CUDA graphs off (eager)")
    p.add_argument("--small-pool", action="store_true",
                   help=f"also run every row with a small KV pool (--max-total-tokens {rows.POOLS['small']}): "
                        "the requests do not fit at once, sglang retracts and recomputes some")
    p.add_argument("--chunked-prefill", action="store_true",
                   help=f"also run every row with --chunked-prefill-size {rows.CHUNK} (row variant chunk{rows.CHUNK}): "
                        "the prompts are prefilled in chunks that cut inside the windows")
    p.add_argument("--prefix", action="store_true",
                   help="also run every row sending each request twice (variant prefix): the second finds its "
                        "prompt in sglang's prefix cache; both are judged")
    p.add_argument("--page-sizes", action="store_true",
                   help="also run every row with --page-size " + " and ".join(map(str, rows.PAGE_SIZES))
                        + " (variants page1, page64; a size sglang changes on its own is shown as refused)")
    p.add_argument("--decode-verify", action="store_true",
                   help="also run trtllm_mha's speculative rows with --speculative-attention-mode decode "
                        "(variant decodeverify)")
    p.add_argument("--deterministic", action="store_true",
                   help="also run triton's rows with --enable-deterministic-inference (variant deterministic)")
    p.add_argument("--every-path", action="store_true",
                   help="all five of the above")
    p.add_argument("--tp", type=_positive(int), default=1,
                   help="N > 1: also run every row with --tp-size N, each server on its own N GPUs "
                        "(variant tpN; every rank must log the same fix statuses)")
    p.add_argument("--dp-attention", action="store_true",
                   help="with --tp N: also run every row with --enable-dp-attention --dp-size N (variant tpNdpattn)")
    p.add_argument("--rows", type=_patterns, default=[],
                   help="comma list of patterns on row names target/backend/mode[/eager][/small][/variant]/plugin|stock "
                        "(e.g. 'gptoss/*/k1/*,llama4/fa3/*'); a pattern that names stock, eager or small as a "
                        "part runs those rows without --stock, --graphs-off or --small-pool "
                        "(e.g. 'mimo_v2/triton/nextn/eager/stock'); default: every row")
    p.add_argument("--require", type=_patterns, default=None,
                   help="comma list of row patterns that must run: a pattern no row matches, or a matching row "
                        "that was not run, is a failure ('default': the default set, 'none': nothing). Default "
                        "without --rows: every row of each target this sglang serves on each backend this GPU's "
                        "architecture runs and this sglang offers (Hopper: fa3, flashinfer, triton, trtllm_mha; "
                        "Blackwell: flashinfer, triton, trtllm_mha; other GPUs: flashinfer, triton); with --rows: none")
    p.add_argument("--out", default=None,
                   help="folder for the server logs and the targets (default: a new temporary folder)")
    p.add_argument("--start-timeout", type=_positive(float), default=server.START_TIMEOUT,
                   help=f"seconds a server may take to start (default: {server.START_TIMEOUT:.0f})")


def target_check(target, protocol: Protocol, seed: int, hf_model: Optional[Callable] = None) -> dict:
    """The target's checks on the first ``check_requests`` prompts of ``seed`` (``readout.check``):
    bf16 equal to float32, the smallest relative logit margin, the requests a size changed by
    one changes, those one wrong in-window slot changes and those the full layers change when
    they read through a wrong index space; ``problems``: the checks it fails
    (``readout.check_problems``), ``ok``: none. ``hf_model``: the target's models (default:
    built on demand, ``target.hf_model``)."""
    from .targets import readout

    row = readout.check(hf_model or target.hf_model, target.SIZE, target.LABEL, [seed], n=protocol.check_requests,
                        length=protocol.prompt_len, max_new=protocol.new_tokens, show=None)[seed]
    n = protocol.check_requests
    changed = {int(k.rsplit("_", 1)[1]): v for k, v in row.items() if k.startswith("changed_by_")}
    return {"of": n, "bf16_equal": row["bf16_equal"], "min_margin": row["min_margin"], "changed": changed,
            "slot_changed": row["slot_changed"], "full_changed": row["full_changed"],
            "problems": row["problems"], "ok": not row["problems"]}


def reference(target, seeds: list, protocol: Protocol, model=None) -> list:
    """transformers' float32 greedy output of the target for every seed's prompts, in order
    (``model``: the float32 model, default built here), through the model's KV cache. The
    checks' requests (the first seed's first ``check_requests``) are computed again without it,
    recomputing every step: where the two differ, every request is recomputed that way."""
    from .targets import readout

    model = model or target.hf_model()
    per_seed = [readout.prompts(protocol.requests, protocol.prompt_len, s) for s in seeds]
    out = [o for ps in per_seed for o in readout.greedy(model, ps, protocol.new_tokens, cache=True)[0]]
    first = per_seed[0][:protocol.check_requests] if per_seed else []
    if first and readout.greedy(model, first, protocol.new_tokens)[0] != out[:len(first)]:
        out = [o for ps in per_seed for o in readout.greedy(model, ps, protocol.new_tokens)[0]]
    return out


def _models(target) -> tuple:
    """(the models of the target's checks as ``hf_model(size, dtype=None)``, the float32 model of
    its reference), built in the calling thread: building draws on torch's global random state
    (GPT-OSS's weights are seeded through it), which threads building side by side would
    interleave. The checks and the reference then run in threads of their own."""
    import torch

    sizes = ((target.SIZE, None), (target.SIZE, torch.bfloat16), (target.SIZE - 1, None), (target.SIZE + 1, None))
    built = {(size, dtype): target.hf_model(size, dtype) for size, dtype in sizes}
    return (lambda size=target.SIZE, dtype=None: built[(size, dtype)]), target.hf_model()


def _requests(seeds: list, protocol: Protocol) -> list:
    from .targets import readout

    return [p for s in seeds for p in readout.prompts(protocol.requests, protocol.prompt_len, s)]


def _serve(name: str, out: str, args: list, env: dict, reqs: list, new_tokens: int, start_timeout: float,
           repeats: int = 1) -> dict:
    """The default runner: one real server (server.run)."""
    return server.run(name, out, args, env, reqs, new_tokens, concurrency=32, start_timeout=start_timeout,
                      repeats=repeats)


def _sglang_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return "not installed"


def _settings() -> dict:
    """The plugin's settings in this environment (the servers inherit them)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("SGLANG_SWA_PLUGIN") or k == "SGLANG_PLUGINS"}


def _quiet_transformers() -> None:
    """No progress bars or deprecation notes of transformers between the selftest's lines."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


class _Lines:
    """The selftest's output: its lines go to stdout, or to stderr under --json (stdout is then
    the report alone). Lines of the servers' progress are held while the target checks are
    being printed, so that the checks come first."""

    def __init__(self, to_stderr: bool):
        self.stream, self.lock, self.held = (sys.stderr if to_stderr else sys.stdout), threading.Lock(), None

    def __call__(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def progress(self, line: str) -> None:
        with self.lock:
            if self.held is not None:
                self.held.append(line)
                return
        self(line)

    def hold(self) -> None:
        with self.lock:
            self.held = []

    def release(self) -> None:
        with self.lock:
            held, self.held = self.held or [], None
        for line in held:
            self(line)


def needed_fixes() -> dict:
    """The fixes doctor finds needed in this environment, as a server with the plugin allowed
    (``server.ON``) would load it: ``{"needed": [names], "problems": [doctor's problems]}``, or
    ``{"error": why}``. doctor runs in a child process (it imports sglang and installs every
    needed fix for a trial), from a folder outside any source tree: the installed plugin, as
    the servers import it. Its detection is the servers' own (the same code, the same
    sglang), so each server must apply exactly these."""
    env = {**os.environ, **server.ON}
    try:
        proc = subprocess.run([sys.executable, "-m", "sglang_swa_plugin.cli", "doctor", "--json"], capture_output=True,
                              text=True, env=env, cwd=tempfile.gettempdir(), timeout=900)
        rep = json.loads(proc.stdout)
    except Exception as e:  # noqa: BLE001 - no report: which fixes are needed is not known
        return {"error": f"doctor gave no report ({type(e).__name__}: {e})"}
    needed = sorted(r["name"] for r in rep.get("fixes", []) if r.get("if_loaded", r.get("status")) == "applied")
    return {"needed": needed, "problems": list(rep.get("problems", []))}


def _expected_accept():
    """The acceptance model (``acceptance.expected_accept``), imported when a row needs it."""
    from .acceptance import expected_accept

    return expected_accept


def _expectation(expect: Callable, t, spec, prompts: list, new_tokens: int, ref: list, **extra) -> Optional[float]:
    """``expect(t, spec, prompts, new_tokens, ref)``, with those of ``extra`` (the built float32
    model, the saved checkpoints) that it takes."""
    try:
        params = inspect.signature(expect).parameters
        takes_any = any(v.kind is inspect.Parameter.VAR_KEYWORD for v in params.values())
        extra = {k: v for k, v in extra.items() if takes_any or k in params}
    except (TypeError, ValueError):
        extra = {}
    return expect(t, spec, prompts, new_tokens, ref, **extra)


def variants(args: argparse.Namespace) -> list:
    """The opt-in row variants the options ask for (rows.VARIANTS)."""
    every = getattr(args, "every_path", False)
    asked = {"chunk64": getattr(args, "chunked_prefill", False), "prefix": getattr(args, "prefix", False),
             "page1": getattr(args, "page_sizes", False), "page64": getattr(args, "page_sizes", False),
             "decodeverify": getattr(args, "decode_verify", False), "deterministic": getattr(args, "deterministic", False)}
    return [v for v in rows.VARIANTS if every or asked[v]]


def required_patterns(args: argparse.Namespace, served_targets: list, capability, options) -> list:
    """The required row patterns: ``--require`` ("default" in it: the default set, "none":
    nothing), else without ``--rows`` the default set (rows.default_required), else none."""
    default = rows.default_required(served_targets, args.backends, capability, options)
    asked = getattr(args, "require", None)
    if asked is None:
        return [] if args.rows else default
    out = []
    for pattern in asked:
        out += default if pattern == "default" else [] if pattern == "none" else [pattern]
    return list(dict.fromkeys(out))


def main(args: argparse.Namespace, runner: Optional[Callable] = None, gpu=rows.detect_gpu,
         options=rows.sglang_options, protocol: Protocol = PROTOCOL, threads: Optional[int] = None,
         expect: Optional[Callable] = None, needed: Optional[Callable] = None,
         packages: Optional[tuple] = None) -> int:
    """Runs the selftest as ``args`` (add_arguments, plus ``json``) say, prints it and returns the
    exit status. ``runner(name, out, args, env, reqs, new_tokens, start_timeout[, repeats=N]) ->
    result`` serves one row (default: a real server, ``server.run``; ``repeats`` only for rows
    that send their requests more than once); ``gpu()`` and ``options()`` give the GPU and the
    installed sglang's options (the defaults read them); ``protocol``: the requests (tests use
    short ones); ``threads``: torch's CPU threads for the checks and references (default: an
    eighth of the cores, at least 2: the servers need the others); ``expect``: the expected
    accept length of a speculative row (default: ``acceptance.expected_accept``); ``needed()``:
    the fixes doctor finds needed (default: ``needed_fixes``, doctor in a child process);
    ``packages``: the packages whose frames make a failure the plugin's (default:
    ``judging.plugin_packages()``).

    The servers start as soon as the targets are saved; the target checks, then the float32
    references and the expected accept lengths, are computed on the CPU meanwhile (the checks
    are printed before any line of the servers)."""
    runner = runner or _serve
    say = _Lines(to_stderr=getattr(args, "json", False))
    work = args.out or tempfile.mkdtemp(prefix="sglang-swa-selftest-")
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    found = gpu()
    report = {"ok": False, "plugin": __version__, "sglang": _sglang_version(), "settings": _settings(),
              "gpu": found and {"name": found.name, "capability": f"sm{found.capability[0]}{found.capability[1]}",
                                "count": getattr(found, "count", 1)},
              "seeds": args.seeds, "out": work, "targets": {}, "rows": {}, "problems": []}
    gpu_text = f"{found.name} (sm{found.capability[0]}{found.capability[1]})" if found else "no CUDA GPU found"
    say(f"sglang-swa-plugin {__version__} selftest: sglang {report['sglang']}, {gpu_text}")
    say("settings: " + (" ".join(f"{k}={v}" for k, v in report["settings"].items()) or "defaults"))
    if found is None:
        report["problems"].append("no CUDA GPU: the selftest serves its targets on one")
    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        report["problems"].append(f"the selftest needs {', '.join(missing)} (dependencies of sglang itself)")
    if getattr(args, "dp_attention", False) and getattr(args, "tp", 1) < 2:
        report["problems"].append("--dp-attention needs --tp N with N > 1")
    if report["problems"]:
        return _finish(report, args, say)

    import torch

    _quiet_transformers()
    torch.set_num_threads(threads or max(2, (os.cpu_count() or 2) // 8))
    packages = packages if packages is not None else judging.plugin_packages()
    doctor = ThreadPoolExecutor(1)
    fixes_needed = doctor.submit(needed or needed_fixes)
    modules, paths, served_targets = {}, {}, []
    for name in args.targets:
        t = targets.load(name)
        why_not = targets.unavailable(t)
        report["targets"][name] = {"title": t.TITLE, "available": not why_not}
        if targets.sglang_serves(t.ARCHITECTURE):
            served_targets.append(name)
        if why_not:
            report["targets"][name]["reason"] = why_not
            paths[name] = f"target not available: {why_not}"
        else:
            modules[name] = t
            paths[name] = rows.saved_target(t, *t.save(os.path.join(work, "targets")))

    opts = options()
    planned = rows.plan(paths, args.backends, found.capability, opts, stock=args.stock,
                        graphs_off=args.graphs_off, patterns=args.rows, mem_fraction=args.mem_fraction,
                        small_pool=getattr(args, "small_pool", False), variants=variants(args),
                        tp=getattr(args, "tp", 1), dp_attention=getattr(args, "dp_attention", False),
                        gpus=rows.devices(getattr(found, "count", 1)))
    required = required_patterns(args, served_targets, found.capability, opts)
    to_run = [p for p in planned if p.args is not None]
    judged_targets = {p.row.target for p in to_run}
    reqs = _requests(args.seeds, protocol)
    results, t0 = {}, time.time()

    def serve(p: rows.Planned) -> None:
        extra = {"repeats": p.repeats} if p.repeats > 1 else {}
        env = {**(server.ON if p.row.plugin else server.OFF), **dict(p.env)}
        try:
            res = runner(p.row.key.replace("/", "_"), logs, p.args, env, reqs, protocol.new_tokens,
                         args.start_timeout, **extra)
        except Exception as e:  # noqa: BLE001 - the runner's own failure: the row did not start
            res = {"state": "did not start", "error": f"{type(e).__name__}: {e}"}
        with say.lock:
            results[p.row.key] = res
            done = len(results)
        say.progress(f"  [{done}/{len(to_run)}] {p.row.key}: {res.get('state')} ({time.time() - t0:.0f} s)")

    say.hold()
    servers = ThreadPoolExecutor(max(1, args.parallel))
    running = [servers.submit(serve, p) for p in to_run]
    built = {name: _models(t) for name, t in modules.items()}
    cpu = ThreadPoolExecutor(max(1, len(modules)))  # the checks first, then the references, then the expectations
    checks = {name: cpu.submit(target_check, t, protocol, args.seeds[0], built[name][0]) for name, t in modules.items()}
    refs = {name: cpu.submit(reference, t, args.seeds, protocol, built[name][1])
            for name, t in modules.items() if name in judged_targets}
    speculative = sorted({(p.row.target, p.row.mode) for p in to_run if rows.MODES[p.row.mode] is not None})
    expect = expect or (_expected_accept_or_none(report) if speculative else None)

    def expectation(name: str, mode: str) -> Optional[float]:
        ref = refs[name].result()
        return _expectation(expect, modules[name], rows.MODES[mode], reqs, protocol.new_tokens, ref,
                            model=built[name][1], saved=tuple(paths[name][:2]))

    expectations = {key: cpu.submit(expectation, *key) for key in speculative if expect is not None}

    say(f"targets (checks on {protocol.check_requests} requests of seed {args.seeds[0]}; "
        "float32 reference: transformers on the CPU):")
    for name, entry in report["targets"].items():
        if not entry["available"]:
            say(f"  {name:7} {entry['title']}: not available: {entry['reason']}")
            continue
        t = modules[name]
        try:
            chk = checks[name].result()
        except Exception as e:  # noqa: BLE001 - reported as the target's problem
            chk = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        entry.update(label=t.LABEL, size=t.SIZE, draft=targets.draft_kind(t), check=chk,
                     reference=t.reference_source() if hasattr(t, "reference_source") else f"transformers' {t.REFERENCE_CLASS}")
        say(f"  {name:7} {_check_line(t, chk)}")
        if not chk["ok"]:
            report["problems"].append(f"target {name} failed its checks: its rows cannot show a {t.LABEL} error")
    say(f"rows: {len(to_run)} servers, {args.parallel} at a time; server logs in {logs}")
    if required:
        say("required rows: " + ",".join(required))
    say.release()
    for f in running:
        f.result()
    # a plugin row that did not start or crashed: the same row without the plugin, where no
    # stock row was asked for, tells sglang's own failures from the plugin's
    twins = [twin for p in to_run if p.row.plugin and results[p.row.key].get("state") in judging.STOPPED
             and (twin := _stock_twin(p)).row.key not in results]
    if twins:
        say(f"  {len(twins)} plugin row(s) did not serve: the same rows without the plugin")
    for f in [servers.submit(serve, t) for t in twins]:
        f.result()
    servers.shutdown()
    left = [f for f in (*refs.values(), *expectations.values()) if not f.done()]
    if left:  # a run cut short by a time limit still shows where its time went
        say(f"  servers done ({time.time() - t0:.0f} s); {len(left)} float32 reference(s) and expected accept "
            "length(s) still computing on the CPU")
    references = {}
    for name, f in refs.items():
        try:
            references[name] = f.result()
        except Exception as e:  # noqa: BLE001 - reported as the target's problem
            report["problems"].append(f"target {name}: no float32 reference ({type(e).__name__}: {e})")
    expected = {}
    for (name, mode), f in expectations.items():
        try:
            expected[(name, mode)] = f.result()
        except Exception as e:  # noqa: BLE001 - its rows fail as NO EXPECTED ACCEPT; the cause once
            if name in references:
                report["problems"].append(f"target {name} {mode}: no expected accept length ({type(e).__name__}: {e})")
    cpu.shutdown()
    if left:
        say(f"  the CPU's float32 work done ({time.time() - t0:.0f} s)")
    fixes = fixes_needed.result()
    doctor.shutdown()
    report["needed_fixes"] = fixes.get("needed")
    if "error" in fixes:
        report["problems"].append(f"which fixes are needed here is not known: {fixes['error']}")
    report["problems"] += [f"doctor: {x}" for x in fixes.get("problems", [])]

    def entry(p: rows.Planned, stock: Optional[dict] = None) -> dict:
        return _row_entry(p, results.get(p.row.key), references.get(p.row.target), protocol, stock,
                          expected=expected.get((p.row.target, p.row.mode)), needed=fixes.get("needed"),
                          packages=packages)

    for p in planned:
        report["rows"][p.row.key] = entry(p, results.get(_stock_twin(p).row.key) if p.row.plugin else None)
    for t in twins:
        report["rows"][t.row.key] = entry(t)
    failed = judging.tally(e["kind"] for e in report["rows"].values() if e["failed"])
    if failed:
        report["problems"].append(f"{sum(failed.values())} row(s) failed ("
                                  + ", ".join(f"{n} {k}" for k, n in failed.items()) + ")")
    report["required"] = _required(required, report["rows"])
    report["problems"] += report["required"]["problems"]
    if not any(e["plugin"] and e.get("state") == judging.SERVED for e in report["rows"].values()):
        report["problems"].append("no plugin row served: nothing was shown")
    return _finish(report, args, say)


def _expected_accept_or_none(report: dict) -> Optional[Callable]:
    """The acceptance model, or None (its rows then fail as NO EXPECTED ACCEPT, the cause once)."""
    try:
        return _expected_accept()
    except Exception as e:  # noqa: BLE001
        report["problems"].append(f"no acceptance model: {type(e).__name__}: {e}")
        return None


def _required(patterns: list, entries: dict) -> dict:
    """The required patterns against the rows' entries: the patterns no row matches, the
    matching rows that were not run, each a problem."""
    missing, not_run = [], []
    for pattern in patterns:
        matched = [k for k in entries if fnmatch.fnmatchcase(k, pattern)]
        if not matched:
            missing.append(pattern)
        not_run += [k for k in matched if entries[k].get("state") == judging.NOT_RUN and k not in not_run]
    problems = [f"required, no such row: {p} (its target is not available, or not asked for)" for p in missing]
    problems += [f"required row not run: {k} ({entries[k]['result'].removeprefix('not run: ')})" for k in not_run]
    return {"patterns": patterns, "missing": missing, "not_run": not_run, "problems": problems}


DRAFTS = {"eagle3": "", "mtp": ", MTP layers as its draft", None: ", no EAGLE3 draft"}


def _check_line(t, chk: dict) -> str:
    own = getattr(t, "reference_source", None)
    source = f" (reference: {own()})" if own and not own().startswith("transformers") else ""
    head = f"{t.TITLE}, {t.LABEL} {t.SIZE}{DRAFTS[targets.draft_kind(t)]}{source}: "
    if "error" in chk:
        return head + f"TARGET CHECK FAILED: {chk['error']}"
    of = chk["of"]
    parts = [f"bf16 = float32 {chk['bf16_equal']}/{of}", f"smallest margin {chk['min_margin']}"]
    parts += [f"{t.LABEL} {w} changes {k}/{of}" for w, k in sorted(chk["changed"].items())]
    if chk.get("slot_changed") is not None:
        parts.append(f"a wrong slot changes {chk['slot_changed']}/{of}")
    if chk.get("full_changed") is not None:
        parts.append(f"full layers in a wrong index space change {chk['full_changed']}/{of}")
    failed = "" if chk["ok"] else "  TARGET CHECK FAILED: " + "; ".join(chk.get("problems") or ["see above"])
    return head + ", ".join(parts) + failed


def _stock_twin(p: rows.Planned) -> rows.Planned:
    """The same row without the plugin (same server arguments, same devices)."""
    return p._replace(row=dataclasses.replace(p.row, plugin=False))


def _row_entry(p: rows.Planned, res: Optional[dict], ref: Optional[list], protocol: Protocol,
               stock: Optional[dict] = None, *, expected: Optional[float] = None,
               needed: Optional[list] = None, packages: tuple = (judging.PLUGIN_PACKAGE,)) -> dict:
    """A planned row's entry of the report: not run (and why), or its judged result against the
    float32 reference ``ref`` with its verdict (``failed``: it makes the exit status 1;
    ``kind``: one of judging.KINDS); ``stock``: the same row's result without the plugin, where
    it ran; ``expected``: the row's expected accept length; ``needed``: the fixes doctor finds
    needed; ``packages``: whose frames make a failure the plugin's."""
    spec = rows.MODES[p.row.mode]
    entry = {"target": p.row.target, "backend": p.row.backend, "mode": p.row.mode, "plugin": p.row.plugin,
             "cuda_graphs": p.row.graphs, "variant": p.row.variant or None}
    if p.args is None:
        return {**entry, "state": judging.NOT_RUN, "result": f"not run: {p.why_not}", "failed": False,
                "kind": judging.NOT_RUN}
    entry["args"] = p.args
    if spec is not None:
        entry["expected_accept"] = None if expected is None else round(expected, 4)
    if ref is None:  # the target's problem is reported once, not per row
        return {**entry, "state": res.get("state"), "result": "not judged: no float32 reference", "failed": False,
                "kind": judging.NOT_JUDGED}
    judged = judging.judge(res, ref, protocol.requests)
    changed = judging.settings_changed(dict(p.settings), res.get("server_args")) if judged["state"] == judging.SERVED else None
    if changed:  # sglang ran another configuration than the row's: it declined the row's
        judged = {"state": judging.REFUSED, "error": changed}
    fixes = judging.fix_state(res["plugin_log"], p.ranks) if res.get("plugin_log") is not None else None
    if fixes is not None:
        entry["fixes_applied"] = list(fixes.applied)
    if res.get("tracebacks"):  # for a triage: each exception and the innermost sglang frame it was raised from
        entry["exceptions"] = sorted(f"{t or '?'} at {f or 'no sglang frame'}"
                                     for t, f in judging.signatures(res["tracebacks"]))
    v = judging.verdict(judged, p.row.plugin, stock=stock, row=res, speculative=spec is not None, expected=expected,
                        needed=needed, ranks=p.ranks, repeated=p.repeats > 1, packages=packages)
    return {**entry, **judged, "result": v[0], "failed": v[1], "kind": v.kind}


def _finish(report: dict, args, say) -> int:
    report["ok"] = not report["problems"]
    report["counts"] = _counts(report)
    if getattr(args, "json", False):
        print(json.dumps(report, indent=2))
    else:
        print_matrix(report, say)
    return 0 if report["ok"] else 1


def _counts(report: dict) -> dict:
    """Every state of the report, counted: the rows' verdict kinds, the required rows missing
    and the targets not available."""
    counts = judging.tally(e.get("kind", judging.NOT_JUDGED) for e in report["rows"].values())
    req = report.get("required") or {}
    missing = len(req.get("missing", ())) + len(req.get("not_run", ()))
    if missing:
        counts["missing required"] = missing
    unavailable = sum(1 for t in report["targets"].values() if not t["available"])
    if unavailable:
        counts["target(s) not available"] = unavailable
    return counts


def summary(report: dict) -> str:
    """The final line: OK or FAILED, and every state counted."""
    counts = dict(report.get("counts") or _counts(report))
    served = counts.pop(judging.OK, 0)
    rest = "; ".join(f"{n} {k}" for k, n in counts.items())
    if report["ok"]:
        return (f"OK: {served} plugin row(s) gave the model's tokens on every request, speculative ones at the "
                "expected acceptance" + (f"; {rest}" if rest else ""))
    return f"FAILED: {served} {judging.OK}" + (f"; {rest}" if rest else "")


def print_matrix(report: dict, say: Callable[[str], None] = print) -> None:
    """The matrix: one line per row (per seed: identical requests of all; the accept length of
    speculative rows and the expected one; the fixes applied against those needed; the
    result), then the problems, then the final line (every state counted)."""
    keys = list(report["rows"])
    width = max([len(k) for k in keys] + [3])
    seeds = report["seeds"]
    needed = report.get("needed_fixes")
    say("")
    if needed is not None:
        say(f"fixes doctor finds needed here ({len(needed)}): {', '.join(needed) or 'none'}")
    if keys:
        say(f"{'row':{width}}  " + "  ".join(f"{'seed ' + str(s):>7}" for s in seeds) + "  accept  expect  fixes  result")
    for key in keys:
        e = report["rows"][key]
        cells = [f"{c['identical']}/{c['of']}" for c in e.get("per_seed", [])] or [""] * len(seeds)
        accept, expect = e.get("accept_length"), e.get("expected_accept")
        applied = e.get("fixes_applied")
        fixes = "-" if applied is None else f"{len(applied)}/{len(needed)}" if needed is not None and e["plugin"] else str(len(applied))
        say(f"{key:{width}}  " + "  ".join(f"{c:>7}" for c in cells)
            + f"  {accept if accept is not None else '-':>6}  {'-' if expect is None else round(expect, 2):>6}"
            + f"  {fixes:>5}  {e['result']}")
    say("")
    for problem in report["problems"]:
        say(f"PROBLEM: {problem}")
    say(summary(report))
