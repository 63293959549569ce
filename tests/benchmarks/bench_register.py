"""Cost of register() on top of the sglang imports it needs, in fresh processes.

    python tests/benchmarks/bench_register.py [processes] [PYTHON ...]

With interpreters of several envs (e.g. .nox/tests-0-5-11/bin/python
.nox/tests-0-5-23/bin/python; run it with the noxfile's TEST_ENV variables set), their
processes alternate round by round and one figure per sglang release is printed.
"""

import json
import statistics
import subprocess
import sys

CHILD = r"""
import importlib, importlib.util, json, time
import sglang_swa_plugin._autoload
sglang_swa_plugin._autoload.disarm()  # 0.5.10: measure register() itself, not the start-up hook's earlier call
from sglang_swa_plugin.core import load_fixes
fixes = load_fixes()                       # imports our modules
for fix, _ in fixes:                       # import the sglang modules each fix looks at
    for t in fix.targets:
        mod = t
        while mod:
            try:
                importlib.import_module(mod); break
            except ImportError:
                mod = mod.rpartition(".")[0]
if importlib.util.find_spec("sglang.srt.plugins"):  # absent on 0.5.10: then direct patching
    import sglang.srt.plugins.hook_registry  # noqa: F401
else:  # 0.5.10: the start-up hook registers right after sglang imports its model runner
    import sglang.srt.model_executor.model_runner  # noqa: F401
from sglang_swa_plugin.startup import register, status
token = None
if importlib.util.find_spec("sglang.srt.plugins"):
    # As inside sglang's load_plugins(): register() only registers; apply_hooks() follows.
    from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, _current_plugin_source
    token = _current_plugin_source.set(HookSource("swa_plugin", "sglang-swa-plugin"))
t0, c0 = time.perf_counter(), time.process_time()
register("benchmark")
t1, c1 = time.perf_counter(), time.process_time()
if token is not None:
    _current_plugin_source.reset(token)
    HookRegistry.apply_hooks()
t2 = time.perf_counter()
import importlib.metadata
print("RESULT=" + json.dumps({"ms": (t1 - t0) * 1e3, "cpu_ms": (c1 - c0) * 1e3, "apply_ms": (t2 - t1) * 1e3,
                              "sglang": importlib.metadata.version("sglang"),
                              "statuses": {n: r["status"] for n, r in status()["fixes"].items()}}))
"""


def main(n: int = 5, pythons: "list[str] | None" = None) -> None:
    pythons = pythons or [sys.executable]
    runs = {p: [] for p in pythons}
    for _ in range(n):  # round by round, so that a busy moment hits every env alike
        for py in pythons:
            out = subprocess.run([py, "-c", CHILD], capture_output=True, text=True, check=True).stdout
            runs[py].append(json.loads([l for l in out.splitlines() if l.startswith("RESULT=")][0][7:]))
    for py, res in runs.items():
        times, applies = [r["ms"] for r in res], [r["apply_ms"] for r in res]
        cpu = statistics.median(r["cpu_ms"] for r in res)
        print(f"sglang {res[-1]['sglang']}: register() on top of the sglang imports it needs, {n} fresh processes")
        print(f"  register(): median {statistics.median(times):.2f} ms, min {min(times):.2f}, max {max(times):.2f}"
              f" (target <= 20 ms); its CPU time: median {cpu:.2f} ms (what a busy machine inflates less)")
        print(f"  then sglang's HookRegistry.apply_hooks() for our hooks (its _propagate_patch scans every"
              f" module): median {statistics.median(applies):.2f} ms")
        print(f"  statuses: {res[-1]['statuses']}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, sys.argv[2:])
