"""The plugin's cost on the decode path of a real model runner: sglang's own
``bench_one_batch`` (static batch, CUDA graphs, median decode-step latency), in fresh
processes that run sglang's plugin loader first, the plugin allowed (``on``) or kept out
through sglang's allow-list ``SGLANG_PLUGINS`` (``off``), alternating ABBA after one
uncounted warm-up run of each. The model is
e2e_server's tiny GPT-OSS-style hybrid SWA model on fa3, no speculative decoding: the path
of a version where no fix applies. Prints the figures; asserts nothing.

    python tests/benchmarks/bench_decode_gpu.py [pairs] [--batch 64] [--output-len 256]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu"))
import e2e_server

CHILD = r"""
import runpy, sys
from sglang.srt.plugins import load_plugins   # what a server's processes do first
load_plugins()
sys.argv = ["sglang.bench_one_batch", *sys.argv[1:]]
runpy.run_module("sglang.bench_one_batch", run_name="__main__", alter_sys=True)
"""
DECODE = re.compile(r"Decode\.\s+median latency:\s*([0-9.]+) s, median throughput:\s*([0-9.]+) token/s")


def add_tokenizer(path: str, vocab: int) -> None:
    """bench_one_batch loads a tokenizer even for synthetic inputs: a word-level one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1").save_pretrained(path)


def one(label: str, model: str, a, log_dir: str) -> dict:
    args = ["--model-path", model, "--attention-backend", "fa3", "--batch-size", str(a.batch),
            "--input-len", "32", "--output-len", str(a.output_len), "--mem-fraction-static", "0.5",
            "--disable-piecewise-cuda-graph", "--run-name", label]
    env = {**os.environ, **(e2e_server.ON if label == "on" else e2e_server.OFF), "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True,
                       cwd=tempfile.gettempdir(), timeout=400)
    text = p.stdout + p.stderr
    with open(os.path.join(log_dir, f"bench_decode_{label}.log"), "a") as f:
        f.write(text)
    found = DECODE.findall(text)
    return {"setting": label, "rc": p.returncode,
            "decode_ms": round(float(found[-1][0]) * 1e3, 4) if found else None,
            "decode_tok_per_s": float(found[-1][1]) if found else None,
            "plugin_fixes_logged": len([l for l in text.splitlines() if "sglang-swa-plugin: fix" in l])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pairs", nargs="?", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--out", default=os.environ.get("OUT", tempfile.gettempdir()))
    a = ap.parse_args()
    # bench_one_batch draws synthetic token ids below 10000: a vocabulary that holds them.
    target, _ = e2e_server.make_models(tempfile.mkdtemp(prefix="swa_bench_"), vocab=10240)
    add_tokenizer(target, 10240)
    for label in ("on", "off"):  # warm-up, not counted: the machine's first runs are slower
        print(json.dumps({"warmup": one(label, target, a, a.out)}), flush=True)
    rows = []
    for i in range(a.pairs):
        for label in (("on", "off") if i % 2 == 0 else ("off", "on")):
            rows.append(one(label, target, a, a.out))
            print(json.dumps(rows[-1]), flush=True)
    ms = {s: [r["decode_ms"] for r in rows if r["setting"] == s and r["decode_ms"]] for s in ("on", "off")}
    summary = {"batch": a.batch, "output_len": a.output_len, "rows": rows}
    if ms["on"] and ms["off"]:
        summary["median_decode_ms"] = {s: statistics.median(v) for s, v in ms.items()}
        # throughput ratio on/off = latency ratio off/on
        summary["throughput_ratio_on_over_off"] = round(statistics.median(ms["off"]) / statistics.median(ms["on"]), 4)
        summary["spread_within_setting_pct"] = {s: round(100 * (max(v) - min(v)) / statistics.median(v), 2) for s, v in ms.items()}
    print("DECODE_COST=" + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
