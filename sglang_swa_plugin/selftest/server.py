"""Real sglang servers for the selftest (and the GPU harness, tests/gpu/e2e_server.py): one
``python -m sglang.launch_server`` per row on ports reserved for it, greedy ``/generate``
requests by token ids, and what became of the row: ``served``, ``did not start``, ``refused by
sglang`` (the server's own argument handling rejected the row) or ``crashed while serving``,
with the one line of the server's error, and what the judging reads of its log: every
traceback (``tracebacks``), the plugin's own lines (``plugin_lines``: its fix status lines
among them), the settings sglang ran (``server_settings``). The plugin is in or out of a server
through sglang's own allow-list of plugins (``ON`` / ``OFF``): the server imports the
installed plugin, never this source tree."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

# sglang's allow-list of plugins keeps ours out of a stock server (>= 0.5.11); on sglang
# without a plugin framework the start-up hook reads SGLANG_SWA_PLUGIN and stays inert.
OFF = {"SGLANG_PLUGINS": "plugin_that_does_not_exist", "SGLANG_SWA_PLUGIN": "0"}
ON = {"SGLANG_PLUGINS": "swa_plugin"}
START_TIMEOUT = 480.0  # seconds for a server to answer /health (many start side by side)

# Each server gets a block of 10 ports, its HTTP port and (+5) its torch.distributed port,
# both checked free: servers started side by side cannot collide (sglang otherwise draws the
# distributed port at random and two servers can draw the same one).
_PORTS = itertools.count(20000 + os.getpid() % 200 * 100, 10)
_PORT_LOCK = threading.Lock()


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def reserve_ports() -> int:
    """A free HTTP port whose +5 (the server's distributed port) is free too."""
    with _PORT_LOCK:
        while True:
            port = next(_PORTS)
            if _free(port) and _free(port + 5):
                return port


class Server:
    """One ``sglang.launch_server`` process with ``args``, its environment plus ``env``, logging
    to ``out/<name>.log`` (the command and ``env`` on its first lines). ``env`` may carry
    ``PYTHONPATH_PREPEND``: paths put in front of PYTHONPATH (e.g. another build of the plugin)."""

    def __init__(self, name: str, out: str, args: list, env: dict):
        self.name, self.log = name, os.path.join(out, f"{name}.log")
        self.port = reserve_ports()
        if "--nccl-port" not in args:
            args = [*args, "--nccl-port", str(self.port + 5)]
        full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        if "PYTHONPATH_PREPEND" in env:
            full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [env["PYTHONPATH_PREPEND"], full_env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "sglang.launch_server", "--port", str(self.port), "--host", "127.0.0.1", *args]
        with open(self.log, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n# env: " + json.dumps(env) + "\n")
        # cwd outside any source tree: the server must import the INSTALLED plugin.
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "a"), stderr=subprocess.STDOUT, env=full_env,
                                     start_new_session=True, cwd=tempfile.gettempdir())
        self.t0 = time.time()

    def wait(self, timeout: float = START_TIMEOUT) -> bool:
        """True once /health answers 200; False when the process ended or ``timeout`` passed."""
        while time.time() - self.t0 < timeout:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        self.startup_s = time.time() - self.t0
                        return True
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(2)
        return False

    def stop(self):
        """Kills the server's whole process group (scheduler and detokenizer included) and
        gives the GPU a moment to release its memory."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        time.sleep(3)

    def log_lines(self, needle: str) -> list:
        return [l.rstrip() for l in open(self.log, errors="replace") if needle in l]


def generate(port: int, ids: list, max_new: int, rid: Optional[str] = None) -> dict:
    """One greedy request of token ids (``ignore_eos``: always ``max_new`` tokens); ``rid``
    names it in the server's log. A failed request is ``{"error": ...}``."""
    body = json.dumps({"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": max_new,
                                                              "ignore_eos": True}, **({"rid": rid} if rid else {})}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


# A server log line that reports an error of the server (never one of the plugin's own lines,
# which may quote an exception it handled).
_ERROR = re.compile(r"Traceback|Error|Exception|illegal memory access|Assertion|CUDA error|Killed")
_HARNESS = ("EADDRINUSE", "Address already in use")  # a start that failed for the harness's reason
_PLUGIN = "sglang-swa-plugin"


def _ours(line: str) -> bool:
    """One of the plugin's own log lines (``sglang-swa-plugin: fix ... applied``)."""
    return _PLUGIN in line


def server_errors(log: str) -> list:
    """The error lines of the server log file ``log`` (the plugin's own lines left out)."""
    lines = open(log, errors="replace").read().splitlines() if os.path.exists(log) else []
    return [l.rstrip()[-240:] for l in lines if _ERROR.search(l) and not _ours(l)]


def first_error(log: str) -> Optional[str]:
    """The line that names the server's exception: the last line of its first traceback, else
    the first error line."""
    errs = server_errors(log)
    named = [l for l in errs if re.search(r"^\S*(Error|Exception)\b|\b\w+(Error|Exception): ", l.strip())]
    return (named or errs or [None])[0]


_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in (.+?)\s*$')
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
# sglang's argument handling: ServerArgs and its checks (0.5.10-0.5.22), the argument groups'
# hooks that resolve and check them (0.5.23).
_ARGUMENT_CODE = re.compile(r"[/\\]sglang[/\\]srt[/\\](server_args\.py$|arg_groups[/\\])")


def tracebacks(log_text: str) -> list:
    """Every Python traceback in a server log, in order: ``{"type", "message", "frames"}``
    (``frames``: ``[file, function]``, outermost first; ``type``: the exception's class as
    printed, None where the traceback ends in no exception line). A traceback may start
    mid-line (sglang logs "Scheduler hit an exception: Traceback ..."); each exception of a
    chain is a traceback of its own."""
    out, lines, i = [], log_text.splitlines(), 0
    while i < len(lines):
        if _TRACEBACK not in lines[i]:
            i += 1
            continue
        frames, message = [], None
        i += 1
        while i < len(lines):
            line = lines[i]
            m = _FRAME.match(line)
            if m:
                frames.append([m.group(1), m.group(2)])
            elif _TRACEBACK in line:
                break  # the next one (interleaved output of another process)
            elif line.strip() and not line[0].isspace():  # the exception line ends the traceback
                message = line.strip()
                i += 1
                break
            i += 1
        m = _EXCEPTION.match(message or "")
        out.append({"type": m.group(1) if m else None, "message": (message or "")[:240], "frames": frames})
    return out


def refusal(log_text: str) -> Optional[str]:
    """sglang's own refusal of a server's arguments, from its log: the line of the exception
    (``AssertionError: GptOssForCausalLM requires one of [...] attention backend ...``) when the
    log's last traceback was raised in sglang's argument handling itself (its innermost frame
    in ``sglang/srt/server_args.py`` or ``sglang/srt/arg_groups/``); None for anything else (a
    failure deeper in sglang, a missing GPU, a crash). What sglang refuses for a model and
    backend is decided by the installed sglang, so the selftest asks it rather than a table."""
    tbs = tracebacks(log_text)
    if not tbs or not tbs[-1]["frames"] or not tbs[-1]["message"]:
        return None
    last = tbs[-1]
    if _ARGUMENT_CODE.search(last["frames"][-1][0]) and not _ours(last["message"]):
        return last["message"]
    return None


# ServerArgs fields a row may set that sglang can change on its own (a page size the backend
# does not take, a prefill chunk, a mode): read back from the server_args line sglang logs at
# start-up (``ServerArgs(page_size=64, ...)``, or a dict on 0.5.23: ``{'page_size': 64, ...}``).
SETTINGS = ("page_size", "chunked_prefill_size", "speculative_attention_mode", "enable_deterministic_inference",
            "tp_size", "dp_size", "enable_dp_attention", "disable_radix_cache")


def server_settings(log_text: str, names=SETTINGS) -> dict:
    """``{field: value as printed}`` of the ServerArgs fields ``names`` in sglang's start-up
    line ``server_args=...`` (the first such line; {} where there is none)."""
    line = next((l for l in log_text.splitlines() if "server_args=" in l), None)
    if line is None:
        return {}
    found = {}
    for name in names:
        m = re.search(r"[\s(,{]'?" + name + r"'?\s*[=:]\s*('[^']*'|[^,)}\s]+)", line)
        if m:
            found[name] = m.group(1).strip("'")
    return found


def plugin_lines(log: str) -> list:
    """The lines of the server log file ``log`` that name the plugin, the harness's own header
    (the command and its environment, the first two lines) left out."""
    if not os.path.exists(log):
        return []
    lines = open(log, errors="replace").read().splitlines()
    body = lines[2:] if lines[:1] and lines[0].startswith("$ ") else lines
    return [l.rstrip() for l in body if _PLUGIN in l]


def run(name, out, args, env, reqs, max_new, concurrency=32, rounds=1, start_timeout=START_TIMEOUT,
        _retry=True, repeats=1) -> dict:
    """One server; ``rounds`` > 1: a warm-up round, then ``rounds`` timed rounds of the same
    requests (``round_tok_per_s``), so that throughput is compared on warm servers;
    ``repeats`` > 1: the requests sent that many times, each time once the previous have
    finished (the later ones find their prompts in sglang's prefix cache), every time's
    outputs kept in order in ``outputs`` and its cached tokens in ``cached_tokens`` (per time;
    None where the server does not report them). Every result says its ``state``: "did not
    start", "refused by sglang" (``refusal``), "crashed while serving" (the server died, or a
    request failed or came back without output) or "served"; only a served row has outputs to
    judge, and ``error`` is the one line that stopped the others. Whatever the state:
    ``plugin_log``, the log's lines that name the plugin (its fix status lines among them; the
    harness's header left out), ``server_args``, the fields of ``SETTINGS`` as sglang logged
    them, and (a row that did not serve) ``tracebacks``, every traceback of the log
    (``tracebacks``). A start that failed for a reason of the harness (a port taken) is
    retried once. Its log is ``out/<name>.log``, its outputs ``out/<name>.outputs.json``, its
    result a line of ``out/runs.jsonl``."""
    srv = Server(name, out, args, env)
    res = {"name": name, "args": args, "env": env}
    try:
        if not srv.wait(start_timeout):
            log_text = open(srv.log, errors="replace").read()
            refused = refusal(log_text)
            res["state"] = "refused by sglang" if refused else "did not start"
            res["error"] = refused or first_error(srv.log) or "server did not start in time"
            res["log_tail"] = log_text[-3000:]
            if _retry and any(h in res["log_tail"] for h in _HARNESS):
                srv.stop()
                return run(name, out, args, env, reqs, max_new, concurrency, rounds, start_timeout, _retry=False,
                           repeats=repeats)
            return res
        res["startup_s"] = round(srv.startup_s, 1)
        res["round_tok_per_s"] = []
        outs, cached = [], []
        for i in range(rounds + (1 if rounds > 1 else 0) if repeats <= 1 else repeats):
            t = time.time()
            with ThreadPoolExecutor(concurrency) as ex:  # request j of round i is "q<j>r<i>" in the log
                got = list(ex.map(lambda j: generate(srv.port, reqs[j], max_new, rid=f"q{j}r{i}"), range(len(reqs))))
            res["wall_s"] = time.time() - t
            if rounds > 1 and i > 0:
                toks = sum((o.get("meta_info", {}).get("completion_tokens") or 0) for o in got)
                res["round_tok_per_s"].append(round(toks / res["wall_s"], 1))
            outs = outs + got if repeats > 1 else got
            reported = [o.get("meta_info", {}).get("cached_tokens") for o in got]
            cached.append(None if any(c is None for c in reported) else sum(reported))
        if repeats > 1:
            res["cached_tokens"] = None if None in cached else cached
        res["outputs"] = [o.get("output_ids") for o in outs]
        res["errors"] = [o["error"] for o in outs if "error" in o]
        metas = [o.get("meta_info", {}) for o in outs]
        verify = sum(m.get("spec_verify_ct", 0) or 0 for m in metas)
        toks = sum(m.get("completion_tokens", 0) or 0 for m in metas)
        res["completion_tokens"] = toks
        res["accept_length"] = round(toks / verify, 4) if verify else None
        res["retractions"] = len(srv.log_lines("#retracted_reqs"))  # sglang's own line per retracting step
        res["cuda_graph"] = "--disable-cuda-graph" not in args
        res["crash"] = srv.proc.poll() is not None or bool(srv.log_lines("illegal memory access"))
        res["assertions"] = server_errors(srv.log)[:4]
        complete = all(o is not None and len(o) == max_new for o in res["outputs"])
        res["state"] = "served" if complete and not res["errors"] and not res["crash"] else "crashed while serving"
        if res["state"] != "served":
            res["error"] = first_error(srv.log) or (res["errors"] or ["requests without output"])[0]
    finally:
        srv.stop()
        _read_log(res, srv.log)
        with open(os.path.join(out, "runs.jsonl"), "a") as f:  # partial results survive a timeout
            f.write(json.dumps({k: v for k, v in res.items() if k != "outputs"}) + "\n")
        if res.get("outputs") is not None:  # the tokens, for a triage beyond the verdict
            with open(os.path.join(out, f"{name}.outputs.json"), "w") as f:
                json.dump(res["outputs"], f)
    return res


MAX_TRACEBACKS = 64  # per row (a server of 8 ranks prints each failure 8 times, and more)


def _read_log(res: dict, log: str) -> None:
    """What the judging reads of a stopped server's log, into its result ``res``."""
    log_text = open(log, errors="replace").read() if os.path.exists(log) else ""
    res["plugin_log"] = plugin_lines(log)
    res["server_args"] = server_settings(log_text)
    if res.get("state") != "served":
        res["tracebacks"] = tracebacks(log_text)[:MAX_TRACEBACKS]


def run_many(runs: dict, parallel: int = 1, done: Optional[Callable[[str, dict], None]] = None) -> dict:
    """``{key: (name, out, args, env, reqs, max_new[, kwargs])}`` -> ``{key: result}``, at most
    ``parallel`` servers at a time (side by side on the one GPU, each on its own ports: one
    request batch per server keeps its arithmetic independent of the others); ``done(key,
    result)`` is called as each finishes."""
    def one(item):
        key, spec = item
        res = run(*spec[:6], **(spec[6] if len(spec) > 6 else {}))
        if done is not None:
            done(key, res)
        return key, res

    with ThreadPoolExecutor(max(1, parallel)) as ex:
        return dict(ex.map(one, runs.items()))
