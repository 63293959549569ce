"""A row's outputs against the model's own (transformers' float32 output of the same weights):
identical requests per prompt seed, where the differing ones first diverge, and the row's
verdict. A row that did not serve every request has no outputs to judge: its state and the
one line of its error are its result."""

from __future__ import annotations

from typing import Optional

SERVED = "served"
REFUSED = "refused by sglang"
STOPPED = ("did not start", "crashed while serving")  # the states of a row without output
BANDS = ("0-3", "4-15", "16-31", "32+")


def compare(a: list, b: list) -> dict:
    """Outputs ``a`` against ``b``, request by request: how many are identical, and the index of
    each request's first differing token (None: identical, or a side without output)."""
    same = sum(1 for x, y in zip(a, b) if x is not None and x == y)
    first_diff = [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None) if x and y else None
                  for x, y in zip(a, b)]
    return {"identical_requests": same, "of": len(a), "first_divergence_per_request": first_diff}


def first_divergences(cmp: dict) -> dict:
    """A compare() result as a distribution: how many requests first diverge in each token band."""
    firsts = cmp["first_divergence_per_request"]
    bands = {"identical": sum(1 for f in firsts if f is None), **{b: 0 for b in BANDS}}
    for f in firsts:
        if f is not None:
            bands["0-3" if f < 4 else "4-15" if f < 16 else "16-31" if f < 32 else "32+"] += 1
    return bands


def judge(row: dict, ref: list, n: int) -> dict:
    """A row against the reference, per prompt seed (``n`` requests each): its state; if served,
    identical requests and first-divergence bands per seed, and its accept length; else the one
    line of the error that stopped it. A row without output is never judged as output."""
    if row.get("state") != SERVED:
        return {"state": row.get("state", "did not start"), "error": row.get("error")}
    per_seed = []
    for i in range(0, len(ref), n):
        cmp = compare(row["outputs"][i:i + n], ref[i:i + n])
        per_seed.append({"identical": cmp["identical_requests"], "of": cmp["of"], "bands": first_divergences(cmp)})
    return {"state": SERVED, "per_seed": per_seed, "accept_length": row.get("accept_length")}


def exact(judged: dict) -> bool:
    """Served, and every request of every seed identical to the reference."""
    return judged["state"] == SERVED and all(c["identical"] == c["of"] for c in judged["per_seed"])


def verdict(judged: dict, plugin: bool, plugin_loaded: Optional[bool] = None,
            stock: Optional[dict] = None) -> tuple:
    """(result text, failed) of a judged row. A plugin row fails unless it is exact with the
    plugin loaded (``plugin_loaded`` False: no line of the plugin in its log); a row sglang
    refuses for this model and backend is no failure of the plugin, nor is a plugin row that
    did not start or crashed where the same row without the plugin (``stock``, its result)
    stops with the same error; a stock row never fails: it shows what the plugin is measured
    against."""
    state = judged["state"]
    if state == REFUSED:
        return f"{REFUSED}: {judged.get('error')}", False
    if plugin and state != SERVED and stock and (stock.get("state"), stock.get("error")) == (state, judged.get("error")):
        return f"{state} without the plugin too (sglang's own failure): {judged.get('error')}", False
    if state != SERVED:
        return f"{state.upper() if plugin else state}: {judged.get('error')}", plugin
    if plugin and plugin_loaded is False:
        return "PLUGIN NOT LOADED: no sglang-swa-plugin line in the server log", True
    if exact(judged):
        return ("OK" if plugin else "exact"), False
    bands = {b: sum(c["bands"][b] for c in judged["per_seed"]) for b in BANDS}
    where = ", ".join(f"{b}: {k}" for b, k in bands.items() if k)
    return f"{'WRONG TOKENS' if plugin else 'other tokens'} (first divergence at token {where})", plugin
