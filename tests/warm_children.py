"""Child interpreters forked from a warm one: ``python -c CODE`` and ``python -m MODULE ARGS`` for
the tests, without each child importing torch, transformers and the rest again.

A test that starts sglang in a fresh interpreter (as sglang starts a scheduler process) spent
most of its 20-odd seconds importing third-party packages: torch, transformers, sympy, scipy...
(``python -X importtime``: 11 of 14 s; sglang's own modules 3 s). One process per test process
(the zygote) imports those once; each child is a ``fork()`` of it that then does what the fresh
interpreter would: the same argv, environment, working directory and ``sys.path``, stdout and
stderr captured, the exit status of ``sys.exit``, an uncaught exception or a crash.

What is never preloaded: sglang and the plugin. Each child imports them itself, so it
loads the plugin exactly as a fresh interpreter does: the zygote drops what the plugin's .pth
imported at its start, and each child runs that .pth line again under its own ``sys.path``.

A child runs fresh, as before, where the fork could differ: interpreter options (``-S``), an
environment that differs from the zygote's in more than ``SGLANG_*`` settings and
``PYTHONPATH`` (``TRITON_INTERPRET``: read by Triton when sglang's kernels are decorated,
after the fork, but kept fresh to be plain), or ``SWA_TESTS_FRESH_CHILDREN=1`` (all of them).
tests/test_warm_children.py holds the two kinds of child to the same observable results.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

# Third-party modules a child that loads the plugin under sglang imports (``-X importtime`` of
# ``load_plugins()``, sglang 0.5.23, biggest first); a name a release lacks is passed over.
PRELOAD = (
    "torch", "torch._dynamo", "torch._inductor.compile_fx", "torch.distributed.tensor",
    "torch.fx.experimental.symbolic_shapes", "sympy", "numpy", "scipy", "scipy.optimize",
    "networkx", "torchvision", "triton", "triton.language", "transformers",
    "transformers.modeling_utils", "transformers.activations", "transformers.conversion_mapping",
    "pydantic", "openai", "aiohttp", "fastapi", "uvicorn", "IPython", "compressed_tensors",
    "huggingface_hub", "xgrammar", "gguf", "PIL.Image", "zmq", "einops", "orjson", "msgspec",
    "requests", "rich", "jinja2", "yaml", "tvm_ffi", "pynvml", "psutil", "setproctitle",
    "partial_json_parser", "dill", "sentencepiece",
)
# Never in the warm interpreter: sglang, and the plugin, whose .pth start-up line each child runs
# again under its own sys.path (a test's PYTHONPATH may put another build of the plugin first).
NEVER_PRELOADED = ("sglang", "flashinfer", "sgl_kernel", "sglang_swa_plugin")


def _same_but_settings(env: dict, base: dict) -> bool:
    """True where ``env`` differs from ``base`` only in sglang's and the plugin's settings, PYTHONPATH
    and pytest's name of the running test (the child gets ``env`` whole)."""
    keys = set(env) | set(base)
    return all(env.get(k) == base.get(k) for k in keys
               if not (k.startswith("SGLANG_") or k in ("PYTHONPATH", "PYTEST_CURRENT_TEST")))


def _forkable(argv: list, env: dict, base: dict) -> bool:
    if os.environ.get("SWA_TESTS_FRESH_CHILDREN", "") not in ("", "0") or not hasattr(os, "fork"):
        return False
    return len(argv) >= 2 and argv[0] in ("-c", "-m") and _same_but_settings(env, base)


class _Zygote:
    def __init__(self, env: dict):
        self.env = dict(env)
        self.proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE], env=self.env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     cwd=tempfile.gettempdir())
        ready = self.proc.stdout.readline()
        if not ready.startswith("READY"):
            self.proc.kill()
            raise RuntimeError(f"the warm interpreter did not start: {ready!r}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, request: dict) -> int:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        if self.alive():
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_zygote = None


def _get_zygote(base: dict):
    global _zygote
    if _zygote is None or not _zygote.alive() or not _same_but_settings(base, _zygote.env):
        if _zygote is not None:
            _zygote.close()
        _zygote = _Zygote(base)
        atexit.register(_zygote.close)
    return _zygote


def run(argv: list, *, env: dict, base_env: dict, cwd: str, timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], env=env, cwd=cwd, timeout=timeout,
    capture_output=True, text=True)``, forked from the warm interpreter where that is the same
    (``base_env``: the environment the warm one runs with). The result's ``warm``: forked or not."""
    cmd = [sys.executable, *argv]
    if not _forkable(argv, env, base_env):
        return _fresh(cmd, env, cwd, timeout)
    with tempfile.TemporaryDirectory(prefix="warm-child-") as d:
        files = {k: os.path.join(d, k) for k in ("out", "err", "status")}
        try:
            pid = _get_zygote(base_env).start({"argv": argv, "env": env, "cwd": str(cwd), **files})
        except (OSError, ValueError, RuntimeError):  # the warm one did not start or is gone: a fresh child
            return _fresh(cmd, env, cwd, timeout)   # (test_warm_children fails: it needs the warm one)
        deadline = time.monotonic() + timeout
        while not os.path.exists(files["status"]):
            if not _running(pid):
                break
            if time.monotonic() > deadline:
                _kill(pid)
                raise subprocess.TimeoutExpired(cmd, timeout, _read(files["out"]), _read(files["err"]))
            time.sleep(0.02)
        status = _read(files["status"])
        out, err = _read(files["out"]), _read(files["err"])
        if status:
            code = int(status)
        else:  # killed by a signal before it could say (a fresh interpreter's rc would be -N)
            code, err = -1, err + "\n[warm child: ended without an exit status (killed by a signal?)]\n"
        proc = subprocess.CompletedProcess(cmd, code, out, err)
        proc.warm = True  # forked (tests/test_warm_children.py checks that it was)
        return proc


def _fresh(cmd: list, env: dict, cwd: str, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout, capture_output=True, text=True)
    proc.warm = False
    return proc


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


# The warm interpreter: preloads, then forks a child per request line (its replies: the child's
# pid). Its children are reaped by the kernel (SIGCHLD ignored); each says its exit status in a
# file, written last. Started with ``-c``: sys.path[0] is '' as in a ``-c`` child.
_ZYGOTE = r'''
import importlib, json, os, signal, sys
reply = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # what the preloaded modules print goes nowhere (stderr: DEVNULL)
PRELOAD, NEVER = %r, %r
for name in PRELOAD:
    try:
        importlib.import_module(name)
    except Exception:
        pass
for name in list(sys.modules):
    if name.split(".")[0] in NEVER:
        del sys.modules[name]  # the plugin's .pth import (and any a preloaded one made): the child imports its own
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__module__.split(".")[0] not in NEVER]
import site
startup = []  # the .pth lines that imported one of those, as site ran them: each child runs them again
for d in site.getsitepackages():
    for pth in sorted(os.listdir(d)) if os.path.isdir(d) else ():
        if pth.endswith(".pth"):
            with open(os.path.join(d, pth)) as f:
                startup += [l for l in f.read().splitlines() if l.startswith(("import ", "import\t"))
                            and any(n in l for n in NEVER)]
own_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
rest = sys.path[1 + len(own_path):]
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
reply.write("READY\n"); reply.flush()


def child(req):
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    reply.close()
    fd = os.open(os.devnull, os.O_RDONLY); os.dup2(fd, 0); os.close(fd)
    sys.stdin = open(0, closefd=False)  # not the zygote's reader of requests
    for target, path in ((1, req["out"]), (2, req["err"])):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644); os.dup2(fd, target); os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear(); os.environ.update(req["env"])
    argv = req["argv"]
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd() if argv[0] == "-m" else "", *extra, *rest]
    importlib.invalidate_caches()
    for line in startup:
        try:
            exec(line)
        except Exception:
            import traceback
            print("Error processing line of a .pth file:", line, file=sys.stderr)
            traceback.print_exc()
    code = 0
    try:
        if argv[0] == "-c":
            import types
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        else:
            import runpy
            sys.argv = [argv[1], *argv[2:]]
            runpy._run_module_as_main(argv[1], alter_argv=True)  # what -m itself runs
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    try:
        import threading
        threading._shutdown()
    except Exception:
        pass
    import atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    with open(req["status"] + ".tmp", "w") as f:
        f.write(str(code & 0xFF))
    os.rename(req["status"] + ".tmp", req["status"])
    os._exit(0)


for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(req)
    reply.write(f"{pid}\n"); reply.flush()
''' % (PRELOAD, NEVER_PRELOADED)
