"""``sglang-swa-plugin selftest``: the GPU matrix of tests/gpu/RESULTS.md as a command for the
operator's own machine. It builds the tiny targets, prints their checks (bf16 gives the float32
tokens, the margins, a window or chunk changed by one changes most outputs: the target sees a
window error), starts one real sglang server per row, sends every row the same greedy requests
(32 prompts of 130 tokens per prompt seed, 64 new tokens, 32 at once) while transformers'
float32 output of the same weights is computed on the CPU, and prints the matrix: per row,
identical requests per seed, the accept length of speculative rows, and the verdict.

Exit status 1 when a plugin row gives other tokens than the model on any request, does not
start, crashes, or runs without the plugin loaded; when a target fails its checks; or when no
plugin row served at all. A row sglang itself refuses for the model and backend is shown as
refused and is no failure, nor is a plugin row that stops the same way without the plugin (run
then, where no stock row was asked for); stock rows (``--stock``) never fail."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple, Optional

from .. import __version__
from . import judging, rows, server, targets

DESCRIPTION = (
    "Run the conformance matrix on this machine's GPU: tiny GPT-OSS, Llama 4, Gemma 4 and MiMo-V2 "
    "targets whose sliding-window (or chunked) layers decide their tokens, served by the installed "
    "sglang with every attention backend it accepts, plain and speculative (EAGLE3 topk 1 and 2; "
    "MiMo-V2's MTP layers as multi-layer EAGLE and NEXTN, topk 1 and 2), with the plugin as configured here (and "
    "stock with --stock), each against transformers' float32 output of the same weights. Prints the "
    "targets' checks, then one line per row. Exit status 1 when a plugin row gives other tokens than "
    "the model, does not start or crashes; a row that sglang refuses for the model and backend, or "
    "that stops the same way without the plugin, is shown as such and does not count. Needs a CUDA "
    "GPU; takes minutes (see --parallel).")


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
    p.add_argument("--rows", type=lambda t: [x.strip() for x in t.split(",") if x.strip()], default=[],
                   help="comma list of patterns on row names target/backend/mode[/eager][/small]/plugin|stock "
                        "(e.g. 'gptoss/*/k1/*,llama4/fa3/*'); default: every row")
    p.add_argument("--out", default=None,
                   help="folder for the server logs and the targets (default: a new temporary folder)")
    p.add_argument("--start-timeout", type=_positive(float), default=server.START_TIMEOUT,
                   help=f"seconds a server may take to start (default: {server.START_TIMEOUT:.0f})")


def target_check(target, protocol: Protocol, seed: int, hf_model: Optional[Callable] = None) -> dict:
    """The target's checks on the first ``check_requests`` prompts of ``seed``: bf16 equal to
    float32, the smallest relative logit margin, the requests a size changed by one changes;
    ``ok``: bf16 gives every float32 output and each changed size changes most of them.
    ``hf_model``: the target's models (default: built on demand, ``target.hf_model``)."""
    from .targets import readout

    row = readout.check(hf_model or target.hf_model, target.SIZE, target.LABEL, [seed], n=protocol.check_requests,
                        length=protocol.prompt_len, max_new=protocol.new_tokens, show=None)[seed]
    n = protocol.check_requests
    changed = {int(k.rsplit("_", 1)[1]): v for k, v in row.items() if k.startswith("changed_by_")}
    ok = row["bf16_equal"] == n and all(2 * v > n for v in changed.values())
    return {"of": n, "bf16_equal": row["bf16_equal"], "min_margin": row["min_margin"], "changed": changed, "ok": ok}


def reference(target, seeds: list, protocol: Protocol, model=None) -> list:
    """transformers' float32 greedy output of the target for every seed's prompts, in order
    (``model``: the float32 model, default built here)."""
    from .targets import readout

    model, out = model or target.hf_model(), []
    for s in seeds:
        out += readout.greedy(model, readout.prompts(protocol.requests, protocol.prompt_len, s), protocol.new_tokens)[0]
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


def _serve(name: str, out: str, args: list, env: dict, reqs: list, new_tokens: int, start_timeout: float) -> dict:
    """The default runner: one real server (server.run)."""
    return server.run(name, out, args, env, reqs, new_tokens, concurrency=32, start_timeout=start_timeout)


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


def main(args: argparse.Namespace, runner: Optional[Callable] = None, gpu=rows.detect_gpu,
         options=rows.sglang_options, protocol: Protocol = PROTOCOL, threads: Optional[int] = None) -> int:
    """Runs the selftest as ``args`` (add_arguments, plus ``json``) say, prints it and returns the
    exit status. ``runner(name, out, args, env, reqs, new_tokens, start_timeout) -> result``
    serves one row (default: a real server, ``server.run``); ``gpu()`` and ``options()`` give
    the GPU and the installed sglang's options (the defaults read them); ``protocol``: the
    requests (tests use short ones); ``threads``: torch's CPU threads for the checks and
    references (default: an eighth of the cores, at least 2: the servers need the others).

    The servers start as soon as the targets are saved; the target checks, then the float32
    references, are computed on the CPU meanwhile (the checks are printed before any line of
    the servers)."""
    runner = runner or _serve
    say = _Lines(to_stderr=getattr(args, "json", False))
    work = args.out or tempfile.mkdtemp(prefix="sglang-swa-selftest-")
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    found = gpu()
    report = {"ok": False, "plugin": __version__, "sglang": _sglang_version(), "settings": _settings(),
              "gpu": found and {"name": found.name, "capability": f"sm{found.capability[0]}{found.capability[1]}"},
              "seeds": args.seeds, "out": work, "targets": {}, "rows": {}, "problems": []}
    gpu_text = f"{found.name} (sm{found.capability[0]}{found.capability[1]})" if found else "no CUDA GPU found"
    say(f"sglang-swa-plugin {__version__} selftest: sglang {report['sglang']}, {gpu_text}")
    say("settings: " + (" ".join(f"{k}={v}" for k, v in report["settings"].items()) or "defaults"))
    if found is None:
        report["problems"].append("no CUDA GPU: the selftest serves its targets on one")
    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        report["problems"].append(f"the selftest needs {', '.join(missing)} (dependencies of sglang itself)")
    if report["problems"]:
        return _finish(report, args, say)

    import torch

    _quiet_transformers()
    torch.set_num_threads(threads or max(2, (os.cpu_count() or 2) // 8))
    modules, paths = {}, {}
    for name in args.targets:
        t = targets.load(name)
        why_not = targets.unavailable(t)
        report["targets"][name] = {"title": t.TITLE, "available": not why_not}
        if why_not:
            report["targets"][name]["reason"] = why_not
            paths[name] = f"target not available: {why_not}"
        else:
            modules[name] = t
            paths[name] = rows.Saved(*t.save(os.path.join(work, "targets")), targets.draft_kind(t),
                                     tuple(getattr(t, "SERVER_ARGS", ())),
                                     tuple(getattr(t, "BACKEND_SERVER_ARGS", {}).items()))

    planned = rows.plan(paths, args.backends, found.capability, options(), stock=args.stock,
                        graphs_off=args.graphs_off, patterns=args.rows, mem_fraction=args.mem_fraction,
                        small_pool=getattr(args, "small_pool", False))
    to_run = [p for p in planned if p.args is not None]
    judged_targets = {p.row.target for p in to_run}
    reqs = _requests(args.seeds, protocol)
    results, t0 = {}, time.time()

    def serve(p: rows.Planned) -> None:
        try:
            res = runner(p.row.key.replace("/", "_"), logs, p.args, server.ON if p.row.plugin else server.OFF,
                         reqs, protocol.new_tokens, args.start_timeout)
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
    cpu = ThreadPoolExecutor(max(1, len(modules)))  # the checks first, then the references
    checks = {name: cpu.submit(target_check, t, protocol, args.seeds[0], built[name][0]) for name, t in modules.items()}
    refs = {name: cpu.submit(reference, t, args.seeds, protocol, built[name][1])
            for name, t in modules.items() if name in judged_targets}

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
    references = {}
    for name, f in refs.items():
        try:
            references[name] = f.result()
        except Exception as e:  # noqa: BLE001 - reported as the target's problem
            report["problems"].append(f"target {name}: no float32 reference ({type(e).__name__}: {e})")
    cpu.shutdown()

    for p in planned:
        stock = results.get(_stock_twin(p).row.key) if p.row.plugin else None
        report["rows"][p.row.key] = _row_entry(p, results.get(p.row.key), references.get(p.row.target), protocol, stock)
    for t in twins:
        report["rows"][t.row.key] = _row_entry(t, results.get(t.row.key), references.get(t.row.target), protocol)
    failed = sum(e["failed"] for e in report["rows"].values())
    if failed:
        report["problems"].append(f"{failed} plugin row(s) did not serve the model's tokens on every request")
    if not any(e["plugin"] and e.get("state") == judging.SERVED for e in report["rows"].values()):
        report["problems"].append("no plugin row served: nothing was shown")
    return _finish(report, args, say)


DRAFTS = {"eagle3": "", "mtp": ", MTP layers as its draft", None: ", no EAGLE3 draft"}


def _check_line(t, chk: dict) -> str:
    own = getattr(t, "reference_source", None)
    source = f" (reference: {own()})" if own and not own().startswith("transformers") else ""
    head = f"{t.TITLE}, {t.LABEL} {t.SIZE}{DRAFTS[targets.draft_kind(t)]}{source}: "
    if "error" in chk:
        return head + f"TARGET CHECK FAILED: {chk['error']}"
    changed = ", ".join(f"{t.LABEL} {w} changes {k}/{chk['of']}" for w, k in sorted(chk["changed"].items()))
    return (head + f"bf16 = float32 {chk['bf16_equal']}/{chk['of']}, smallest margin {chk['min_margin']}, {changed}"
            + ("" if chk["ok"] else "  TARGET CHECK FAILED"))


def _stock_twin(p: rows.Planned) -> rows.Planned:
    """The same row without the plugin (same server arguments)."""
    return rows.Planned(dataclasses.replace(p.row, plugin=False), p.args, p.why_not)


def _row_entry(p: rows.Planned, res: Optional[dict], ref: Optional[list], protocol: Protocol,
               stock: Optional[dict] = None) -> dict:
    """A planned row's entry of the report: not run (and why), or its judged result against the
    float32 reference ``ref`` with its verdict (``failed``: it makes the exit status 1);
    ``stock``: the same row's result without the plugin, where it ran."""
    entry = {"target": p.row.target, "backend": p.row.backend, "mode": p.row.mode, "plugin": p.row.plugin,
             "cuda_graphs": p.row.graphs}
    if p.args is None:
        return {**entry, "state": "not run", "result": f"not run: {p.why_not}", "failed": False}
    entry["args"] = p.args
    if ref is None:  # the target's problem is reported once, not per row
        return {**entry, "state": res.get("state"), "result": "not judged: no float32 reference", "failed": False}
    judged = judging.judge(res, ref, protocol.requests)
    loaded = bool(res.get("plugin_log")) if judged["state"] == judging.SERVED and "plugin_log" in res else None
    text, failed = judging.verdict(judged, p.row.plugin, loaded, stock)
    return {**entry, **judged, "result": text, "failed": failed}


def _finish(report: dict, args, say) -> int:
    report["ok"] = not report["problems"]
    if getattr(args, "json", False):
        print(json.dumps(report, indent=2))
    else:
        print_matrix(report, say)
    return 0 if report["ok"] else 1


def print_matrix(report: dict, say: Callable[[str], None] = print) -> None:
    """The matrix: one line per row (per seed: identical requests of all; the accept length of
    speculative rows; the result), then OK or the problems."""
    keys = list(report["rows"])
    width = max([len(k) for k in keys] + [3])
    seeds = report["seeds"]
    say("")
    if keys:
        say(f"{'row':{width}}  " + "  ".join(f"{'seed ' + str(s):>7}" for s in seeds) + "  accept  result")
    for key in keys:
        e = report["rows"][key]
        cells = [f"{c['identical']}/{c['of']}" for c in e.get("per_seed", [])] or [""] * len(seeds)
        accept = e.get("accept_length")
        say(f"{key:{width}}  " + "  ".join(f"{c:>7}" for c in cells)
            + f"  {accept if accept is not None else '-':>6}  {e['result']}")
    served = sum(1 for e in report["rows"].values() if e["plugin"] and e.get("state") == judging.SERVED)
    refused = sum(1 for e in report["rows"].values() if e.get("state") == judging.REFUSED)
    not_run = sum(1 for e in report["rows"].values() if e.get("state") == "not run")
    say("")
    if report["ok"]:
        say(f"OK: {served} plugin row(s) gave the model's tokens on every request"
            + (f"; {refused} refused by sglang" if refused else "") + (f"; {not_run} not run" if not_run else ""))
    else:
        for problem in report["problems"]:
            say(f"PROBLEM: {problem}")
