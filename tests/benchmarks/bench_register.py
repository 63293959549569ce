"""Cost of register() on top of the sglang imports it needs, in fresh processes.

    python tests/benchmarks/bench_register.py [processes]
"""

import json
import statistics
import subprocess
import sys

CHILD = r"""
import importlib, importlib.util, json, time
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
from sglang_swa_plugin.core import register, status
token = None
if importlib.util.find_spec("sglang.srt.plugins"):
    # As inside sglang's load_plugins(): register() only registers; apply_hooks() follows.
    from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, _current_plugin_source
    token = _current_plugin_source.set(HookSource("swa_plugin", "sglang-swa-plugin"))
t0 = time.perf_counter()
register("benchmark")
t1 = time.perf_counter()
if token is not None:
    _current_plugin_source.reset(token)
    HookRegistry.apply_hooks()
t2 = time.perf_counter()
print("RESULT=" + json.dumps({"ms": (t1 - t0) * 1e3, "apply_ms": (t2 - t1) * 1e3,
                              "statuses": {n: r["status"] for n, r in status()["fixes"].items()}}))
"""


def main(n: int = 5) -> None:
    times, applies, statuses = [], [], None
    for _ in range(n):
        out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
        res = json.loads([l for l in out.splitlines() if l.startswith("RESULT=")][0][7:])
        times.append(res["ms"])
        applies.append(res["apply_ms"])
        statuses = res["statuses"]
    print(f"register() on top of the sglang imports it needs, {n} fresh processes")
    print(f"  register(): median {statistics.median(times):.2f} ms, min {min(times):.2f}, max {max(times):.2f} (target <= 20 ms)")
    print(f"  then sglang's HookRegistry.apply_hooks() for our hooks (its _propagate_patch scans every"
          f" module): median {statistics.median(applies):.2f} ms")
    print(f"  statuses: {statuses}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
