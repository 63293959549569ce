"""Server throughput of selftest rows with the plugin and without it (issue #48 item 3), GPU.

The rows are the selftest's (its targets, saved checkpoints, server arguments: CUDA graphs on,
the page size sglang picks), each with its stock twin: ``--rows`` takes the selftest's row
patterns without the last part (``mimo_v2/triton/nextn``, ``llama4/fa3/k1``). All servers start
side by side and stay warm; then one warm-up round on each, and ``--rounds`` timed rounds each,
alternating plugin / stock (only one server works at a time). A round: ``--requests`` concurrent
greedy requests of 130 prompt tokens (prompt seed: the first of PROMPT_SEEDS, default 91),
``--new-tokens`` new tokens each. Tokens/s per round (completion tokens / wall time); per row
the medians and the ratio plugin / stock, each plugin round over the stock round after it (the
ratio's spread), the accept length of each side, and how many requests gave the same tokens.
A stock server that does not start leaves the plugin's figure alone (stock crashes on some rows).
Where the installed sglang has upstream's own fix, its stock row is upstream's fixed form.
To tell where a cost comes from: ``--without a,b`` adds a side per fix, the plugin with every
fix but that one (``SGLANG_SWA_PLUGIN_FIXES=all,-a``; ``all``: the plugin loaded by sglang with
``SGLANG_SWA_PLUGIN=0``, installing nothing), and ``--aa`` a second stock server
(``stock_b``: stock against stock, the measurement's own spread); each such side's ratio is
its median over stock's.

    python tests/gpu/throughput_rows.py --rows mimo_v2/triton/nextn,llama4/fa3/k1 --out DIR
    python tests/gpu/throughput_rows.py --rows gemma4/triton/plain --without triton_swa_window --aa --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


def one_round(port: int, reqs: list, new: int) -> dict:
    """One round on a warm server (e2e_server's throughput scenario too): ``reqs`` at once, ``new``
    greedy tokens each; its tokens/s, first errors, outputs and accept length."""
    from sglang_swa_plugin.selftest.server import generate

    t = time.time()
    with ThreadPoolExecutor(len(reqs)) as ex:
        outs = list(ex.map(lambda ids: generate(port, ids, new), reqs))
    wall = time.time() - t
    metas = [o.get("meta_info", {}) for o in outs]
    toks = sum(m.get("completion_tokens") or 0 for m in metas)
    verify = sum(m.get("spec_verify_ct") or 0 for m in metas)
    return {"tok_per_s": round(toks / wall, 1), "errors": [o["error"] for o in outs if "error" in o][:2],
            "outputs": [o.get("output_ids") for o in outs], "accept_length": round(toks / verify, 3) if verify else None}


def extra_sides(env: dict, plugin: bool, without: list, aa: bool) -> dict:
    """{side: its server's environment} beside a row's plugin server (``env``: the plugin's) or
    its stock one: ``without_<fix>`` per fix of ``without``, ``stock_b`` with ``aa``."""
    if not plugin:
        return {"stock_b": env} if aa else {}
    return {f"without_{f}": {**env, **({"SGLANG_SWA_PLUGIN": "0"} if f == "all" else {"SGLANG_SWA_PLUGIN_FIXES": f"all,-{f}"})}
            for f in without}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", required=True, help="comma list of target/backend/mode")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=192)
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--mem-fraction", type=float, default=0.85)
    ap.add_argument("--without", default="", help="comma list of fixes: a side each, the plugin without it")
    ap.add_argument("--aa", action="store_true", help="a second stock server per row (stock_b)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    a = ap.parse_args()

    from importlib.metadata import version

    from sglang_swa_plugin.selftest import rows, server, targets
    from sglang_swa_plugin.selftest.targets import readout

    os.makedirs(a.out, exist_ok=True)
    wanted = [r.strip("/") for r in a.rows.split(",") if r]
    without = [f for f in a.without.split(",") if f]
    gpu = rows.detect_gpu()
    if gpu is None:
        print("no CUDA GPU")
        return 2
    work = tempfile.mkdtemp(prefix="swa_throughput_")  # the checkpoints: not under --out
    saved = {}
    for name in sorted({w.split("/")[0] for w in wanted}):
        t = targets.load(name)
        saved[name] = rows.saved_target(t, *t.save(work))
    planned = rows.plan(saved, sorted({w.split("/")[1] for w in wanted}), gpu.capability, rows.sglang_options(),
                        stock=True, patterns=[w + "/*" for w in wanted], mem_fraction=a.mem_fraction)
    seed = int(os.environ.get("PROMPT_SEEDS", "91").split(",")[0])
    reqs = readout.prompts(a.requests, 130, seed)
    # as many running requests as a round sends, and the SWA pool as large as the full one: no
    # request waits for room (a queue would decide the figure, not the step); the later flag wins
    more = ["--max-running-requests", str(a.requests), "--swa-full-tokens-ratio", "1.0"]
    servers = {}
    for p in planned:
        if p.args is None:
            print(f"{p.row.key}: not run: {p.why_not}")
            continue
        env = {**(server.ON if p.row.plugin else server.OFF), **dict(p.env)}
        servers[p.row.key] = server.Server(p.row.key.replace("/", "_"), a.out, p.args + more, env)
        base = p.row.key.rsplit("/", 1)[0]
        for side, side_env in extra_sides(env, p.row.plugin, without, a.aa).items():
            key = f"{base}/{side}"
            servers[key] = server.Server(key.replace("/", "_"), a.out, p.args + more, side_env)
    res = {"sglang": version("sglang"), "gpu": gpu.name, "rounds": a.rounds, "requests": a.requests,
           "new_tokens": a.new_tokens, "prompt_seed": seed, "rows": {}}
    try:
        up = {k: s.wait(a.start_timeout) for k, s in servers.items()}
        for w in wanted:
            sides = {side: k for k in servers if k.startswith(w + "/") and (side := k.rsplit("/", 1)[1])}
            r = res["rows"][w] = {"state": {side: "served" if up[k] else
                                            f"did not start: {server.first_error(servers[k].log) or 'no answer'}"
                                            for side, k in sides.items()}}
            order = ["plugin", "stock", *(f"without_{f}" for f in without), "stock_b"]
            live = [side for side in order if side in sides and up[sides[side]]]
            warm = {side: one_round(servers[sides[side]].port, reqs, a.new_tokens) for side in live}
            r["accept_length"] = {side: warm[side]["accept_length"] for side in live}
            r["errors"] = {side: warm[side]["errors"] for side in live if warm[side]["errors"]}
            for side in live:
                r[side] = []
            for _ in range(a.rounds):  # plugin, stock, plugin, stock ...
                for side in live:
                    r[side].append(one_round(servers[sides[side]].port, reqs, a.new_tokens)["tok_per_s"])
            for side in live:
                r[f"{side}_median"] = statistics.median(r[side])
            if "plugin" in live and "stock" in live:
                r["ratio"] = round(r["plugin_median"] / r["stock_median"], 4)
                r["round_ratios"] = [round(x / y, 4) for x, y in zip(r["plugin"], r["stock"])]
                same = sum(1 for x, y in zip(warm["plugin"]["outputs"], warm["stock"]["outputs"]) if x and x == y)
                r["same_tokens"] = f"{same}/{len(reqs)}"  # for information: stock may be wrong
            if "stock" in live:
                r["over_stock"] = {side: round(r[f"{side}_median"] / r["stock_median"], 4)
                                   for side in live if side not in ("plugin", "stock")}
    finally:
        for s in servers.values():
            s.stop()
    print(f"sglang {res['sglang']}, {gpu.name}: {a.requests} requests x {a.new_tokens} tokens, "
          f"{a.rounds} rounds a side, tok/s medians")
    print(f"{'row':<24} {'plugin':>9} {'stock':>9} {'ratio':>7}  round ratios; accept plugin/stock")
    for w, r in res["rows"].items():
        med = {side: r.get(f"{side}_median") for side in ("plugin", "stock")}
        print(f"{w:<24} {med['plugin'] or '-':>9} {med['stock'] or '-':>9} {r.get('ratio', '-'):>7}  "
              f"{r.get('round_ratios', '-')}; {r['accept_length']}"
              + "".join(f"; {side}: {st}" for side, st in r["state"].items() if st != "served")
              + "".join(f"; {side} {r[f'{side}_median']} ({ratio} of stock)" for side, ratio in r.get("over_stock", {}).items()))
    with open(os.path.join(a.out, "throughput_rows.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("THROUGHPUT_ROWS=" + json.dumps(res["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
