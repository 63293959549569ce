"""Start-up cost of the interpreter hook (sglang_swa_plugin_autoload.pth) in a process that
never imports sglang: `python -c pass` with and without the .pth, interleaved, many runs.

    python tests/benchmarks/bench_startup.py [runs]
"""

import os
import statistics
import subprocess
import sys
import time

import sglang_swa_plugin

SITE = os.path.dirname(os.path.dirname(sglang_swa_plugin.__file__))
PTH = os.path.join(SITE, "sglang_swa_plugin_autoload.pth")


def once() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return (time.perf_counter() - t) * 1e3


def main(runs: int = 200) -> None:
    assert os.path.exists(PTH), PTH
    with_, without = [], []
    aside = PTH + ".aside"
    try:
        for _ in range(runs):
            with_.append(once())
            os.rename(PTH, aside)
            try:
                without.append(once())
            finally:
                os.rename(aside, PTH)
    finally:
        if os.path.exists(aside):
            os.rename(aside, PTH)
    imp = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True).stderr
    ours = [l for l in imp.splitlines() if "sglang_swa_plugin" in l]
    med_w, med_wo = statistics.median(with_), statistics.median(without)
    print(f"python -c pass, {runs} interleaved runs each")
    print(f"  with start-up hook:    median {med_w:.2f} ms  (p10 {statistics.quantiles(with_, n=10)[0]:.2f}, p90 {statistics.quantiles(with_, n=10)[-1]:.2f})")
    print(f"  without start-up hook: median {med_wo:.2f} ms  (p10 {statistics.quantiles(without, n=10)[0]:.2f}, p90 {statistics.quantiles(without, n=10)[-1]:.2f})")
    print(f"  difference of medians: {med_w - med_wo:+.3f} ms (target < 1 ms)")
    print("  -X importtime of our modules (us: self | cumulative | name):")
    for l in ours:
        print("   ", l.split(":", 1)[1].strip())


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
