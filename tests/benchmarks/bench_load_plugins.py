"""What the plugin adds to sglang's ``load_plugins()``, in fresh processes: the call timed
with the plugin loaded and without it (``SGLANG_PLUGINS`` naming no installed plugin), after
the imports a server process has done by then (sglang's model runner). The model runner's
import time is printed beside it, for scale (a server's start-up takes far longer still).

    python tests/benchmarks/bench_load_plugins.py [processes] [PYTHON ...]

With interpreters of several envs (e.g. .nox/tests-0-5-11/bin/python
.nox/tests-0-5-23/bin/python), one line per sglang release. Needs sglang >= 0.5.11 (0.5.10
has no ``load_plugins()``; there the start-up hook applies the plugin).
"""

import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, time
t0 = time.perf_counter()
import sglang.srt.model_executor.model_runner  # noqa: F401
imported = time.perf_counter() - t0
from importlib.metadata import version
from sglang.srt.plugins import load_plugins
t0 = time.perf_counter()
load_plugins()
took = time.perf_counter() - t0
import sglang_swa_plugin
st = sglang_swa_plugin.status()
print("RESULT=" + json.dumps({"sglang": version("sglang"), "load_plugins_ms": took * 1e3,
                              "import_ms": imported * 1e3, "registered": st["registered"]}))
"""

WITHOUT = {"SGLANG_PLUGINS": "no_such_plugin"}  # sglang's allow-list: nothing is loaded


def child(python: str, env: dict) -> dict:
    out = subprocess.run([python, "-c", CHILD], capture_output=True, text=True, env={**os.environ, **env})
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT=")), None)
    if line is None:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(line[len("RESULT="):])


def main(processes: int, pythons: list) -> None:
    runs = {(p, w): [] for p in pythons for w in (True, False)}
    for _ in range(processes):  # alternate, so that load on the machine hits every case alike
        for p in pythons:
            for with_plugin in (True, False):
                got = child(p, {} if with_plugin else WITHOUT)
                assert got["registered"] is with_plugin, got
                runs[p, with_plugin].append(got)
    print(f"load_plugins(), median of {processes} fresh processes each")
    for p in pythons:
        on, off = runs[p, True], runs[p, False]
        med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
        print(f"  sglang {on[0]['sglang']}: with the plugin {med(on, 'load_plugins_ms'):.1f} ms, without "
              f"{med(off, 'load_plugins_ms'):.1f} ms (the model runner's import: {med(on + off, 'import_ms'):.0f} ms)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, sys.argv[2:] or [sys.executable])
