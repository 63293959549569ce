"""A row's outputs against the model's own (transformers' float32 output of the same weights):
identical requests per prompt seed, where the differing ones first diverge, and the row's
verdict. A row that did not serve every request has no outputs to judge: its state and the
one line of its error are its result.

What a plugin row must show to pass, each rule a failure of its own (``verdict``):

- the plugin loaded: one status line per fix from the plugin's own start-up
  (``sglang-swa-plugin: fix NAME: STATUS (reason)``, ``core.log_record``) in the server log;
  the plugin's failure lines ("cannot load the plugin; nothing is installed") and the
  harness's own header are no status lines (PLUGIN NOT LOADED);
- every fix that doctor finds needed in this environment (``needed``) applied, on every
  process that logged it (FIX NOT APPLIED), and, with tensor parallelism, every rank logging
  the same statuses, each rank present (RANKS DISAGREE);
- every request of every seed the model's tokens (WRONG TOKENS);
- a speculative row: verify steps (NO SPECULATION), an expected accept length computed on
  the CPU (NO EXPECTED ACCEPT) of at least ``DRAFT_ACCEPTS`` (IDLE DRAFT: a draft that accepts
  next to nothing cannot show a reading error), and the server's accept length no lower than that figure less
  ``ACCEPT_TOLERANCE`` (LOW ACCEPT): a draft that reads the wrong keys only lowers
  acceptance, as the target verifies every token;
- a row that repeats its requests to hit sglang's prefix cache: a cached prefix reused
  (NO PREFIX HIT), where the server reports cached tokens.

A plugin row that did not start or crashed is excused as sglang's own failure only when
(``excuse``) its log has a traceback, no traceback has a frame in the plugin's package
(``sglang_swa_plugin``, its hooks included) or in a registered third-party fix's package
(``plugin_packages``), and the same row without the plugin stops in the same state with the
same set of (exception type, innermost sglang frame) over its tracebacks, with no fix applied
there. A row sglang refuses for the model and backend is no failure, unless a frame of the
plugin is in the refusal's traceback. A stock row never fails for its tokens or acceptance (it
shows what the plugin is measured against), but fails when the plugin applied a fix in it."""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple, Optional

from .acceptance import DRAFT_ACCEPTS  # its module imports nothing heavy
from .acceptance import TOLERANCE as _ACCEPTANCE_TOLERANCE

SERVED = "served"
REFUSED = "refused by sglang"
STOPPED = ("did not start", "crashed while serving")  # the states of a row without output
BANDS = ("0-3", "4-15", "16-31", "32+")

# How far (absolute, in tokens per verify step) a speculative plugin row's accept length may
# fall below its float32 expectation: the acceptance module's TOLERANCE, one figure for both
# sides, as that module's CPU check shows each draft-side reading error it emulates (every key
# from the slot before, the draft's window one key narrower or wider) lowering every target's
# and mode's expectation by more than it. What legitimately lowers the served figure: the drafts
# run in bf16 (a draft token whose float32 margin is small may flip), and sglang's scheduler
# batches, retracts and recomputes requests (a recomputed request starts its draft over).
ACCEPT_TOLERANCE = _ACCEPTANCE_TOLERANCE

# The kinds of verdicts, in the order the final line counts them (``Verdict.kind``).
OK = "served OK"
WRONG = "wrong tokens"
LOW_ACCEPT = "low accept"
NO_SPECULATION = "no speculation"
NO_EXPECTED = "no expected accept"
IDLE_DRAFT = "idle draft"
NOT_LOADED = "plugin not loaded"
FIX_NOT_APPLIED = "fix not applied"
RANKS = "ranks disagree"
NO_PREFIX_HIT = "no prefix hit"
DID_NOT_START, CRASHED = STOPPED
EXCUSED = "excused (sglang's own failure)"
NOT_RUN = "not run"
NOT_JUDGED = "not judged"
STOCK = "stock"
STOCK_WITH_PLUGIN = "plugin in a stock row"
KINDS = (OK, WRONG, LOW_ACCEPT, NO_SPECULATION, NO_EXPECTED, IDLE_DRAFT, NOT_LOADED, FIX_NOT_APPLIED, RANKS, NO_PREFIX_HIT,
         DID_NOT_START, CRASHED, EXCUSED, REFUSED, NOT_RUN, NOT_JUDGED, STOCK, STOCK_WITH_PLUGIN)
FAILING = frozenset({WRONG, LOW_ACCEPT, NO_SPECULATION, NO_EXPECTED, IDLE_DRAFT, NOT_LOADED, FIX_NOT_APPLIED, RANKS,
                     NO_PREFIX_HIT, DID_NOT_START, CRASHED, STOCK_WITH_PLUGIN})


class Verdict(tuple):
    """(result text, failed), with the verdict's ``kind`` (one of KINDS) as an attribute."""

    kind: str

    def __new__(cls, text: str, failed: bool, kind: str):
        obj = super().__new__(cls, (text, failed))
        obj.kind = kind
        return obj


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
    line of the error that stopped it. A row that sent its requests several times (rounds, one
    after the other: ``outputs`` holds every round's in order) is judged on every round, each
    against the same reference. A row without output is never judged as output."""
    if row.get("state") != SERVED:
        return {"state": row.get("state", "did not start"), "error": row.get("error")}
    outputs, per_seed = row["outputs"], []
    rounds = max(1, len(outputs) // max(1, len(ref)))
    for i in range(0, len(ref), n):
        got = [o for r in range(rounds) for o in outputs[r * len(ref) + i:r * len(ref) + i + n]]
        cmp = compare(got, ref[i:i + n] * rounds)
        per_seed.append({"identical": cmp["identical_requests"], "of": cmp["of"], "bands": first_divergences(cmp)})
    return {"state": SERVED, "per_seed": per_seed, "accept_length": row.get("accept_length")}


def exact(judged: dict) -> bool:
    """Served, and every request of every seed identical to the reference."""
    return judged["state"] == SERVED and all(c["identical"] == c["of"] for c in judged["per_seed"])


# -- the plugin's fix status lines -------------------------------------------------------------

STATUSES = ("applied", "not needed", "not applicable", "disabled", "skipped", "unknown", "error", "pending")
APPLIED = "applied"
# core.log_record's line, behind sglang's own prefix ("[2026-01-01 12:00:00 DP0 TP1] "): the
# ranks are the prefix's tags after the time (none: the main process, or a single rank).
_STATUS_LINE = re.compile(r"sglang-swa-plugin: fix (?P<name>[\w.\-]+): (?P<status>" + "|".join(STATUSES) + r") \(")
_PREFIX = re.compile(r"^\[(?P<head>[^\]]*)\]")
_RANK_TAG = re.compile(r"^[A-Z][A-Z_]*\d+$")


def fix_statuses(lines: Iterable[str]) -> dict:
    """``{rank: {fix: [status, ...]}}`` from the plugin's fix status lines among ``lines`` (the
    server log's lines, or those naming the plugin). ``rank``: the rank tags of sglang's line
    prefix ("TP1", "DP0 TP0"; "" for lines without: the main process, or a server of one rank).
    Any other line (the plugin's "nothing is installed", its warnings, the harness's header)
    is none."""
    out: dict = {}
    for line in lines:
        m = _STATUS_LINE.search(line)
        if not m:
            continue
        head = _PREFIX.match(line)
        rank = " ".join(t for t in (head.group("head").split() if head else ()) if _RANK_TAG.match(t))
        out.setdefault(rank, {}).setdefault(m.group("name"), []).append(m.group("status"))
    return out


class FixState(NamedTuple):
    """A server's fixes as its status lines give them: ``applied`` (every line of the fix says
    so), ``statuses`` (``{fix: status}``: applied, else the first other status seen), and the
    ranks' disagreements (``"fix: applied on TP0, skipped on TP1"``, or a rank without lines)."""

    loaded: bool
    applied: tuple
    statuses: dict
    disagreements: tuple


def fix_state(lines: Iterable[str], ranks: int = 1) -> FixState:
    """The fix state of a server log's ``lines``; ``ranks``: the server's tensor-parallel size
    (more than 1: every rank must log, and log the same statuses)."""
    by_rank = fix_statuses(lines)
    statuses: dict = {}
    for per_fix in by_rank.values():
        for name, seen in per_fix.items():
            other = [s for s in seen if s != APPLIED]
            if other:
                statuses[name] = other[0]
            else:
                statuses.setdefault(name, APPLIED)
    tagged = {r: v for r, v in by_rank.items() if r}
    problems = []
    if ranks > 1 and len(tagged) < ranks:
        problems.append(f"status lines from {len(tagged)} of {ranks} ranks ({', '.join(sorted(tagged)) or 'none tagged'})")
    names = sorted({n for v in tagged.values() for n in v})
    for name in names:
        seen = {r: "/".join(sorted(set(v.get(name, ["no line"])))) for r, v in sorted(tagged.items())}
        if len(set(seen.values())) > 1:
            problems.append(f"{name}: " + ", ".join(f"{s} on {r}" for r, s in seen.items()))
    applied = tuple(sorted(n for n, s in statuses.items() if s == APPLIED))
    return FixState(bool(by_rank), applied, statuses, tuple(problems))


# -- tracebacks and failure attribution --------------------------------------------------------

PLUGIN_PACKAGE = "sglang_swa_plugin"


def plugin_packages() -> tuple:
    """The packages whose frames make a failure the plugin's: the plugin's own (its hooks are
    ``sglang_swa_plugin.hooks``) and the top-level package of every third-party fix registered
    under the entry-point group ``sglang_swa_plugin.fixes``."""
    from importlib.metadata import entry_points

    from ..fix import FIXES_ENTRY_POINT_GROUP

    tops = [ep.value.split(":")[0].split(".")[0].strip() for ep in entry_points(group=FIXES_ENTRY_POINT_GROUP)]
    return tuple(dict.fromkeys([PLUGIN_PACKAGE, *(t for t in tops if t and t != "sglang")]))


def _path(path: str) -> str:
    return path.replace("\\", "/")


def in_package(path: str, packages: Iterable[str]) -> bool:
    """Whether the file ``path`` is in one of ``packages`` (a folder of that name on its path,
    or the top-level module ``package.py``)."""
    path = "/" + _path(path).lstrip("/")
    return any(f"/{p}/" in path or path.endswith(f"/{p}.py") for p in packages)


def sglang_frame(frames: list) -> Optional[str]:
    """The innermost frame of ``frames`` (``[[file, function], ...]``, outermost first) in
    sglang's package, as ``sglang/<path>:function``; None: none."""
    for path, func in reversed(frames):
        p = _path(path)
        i = p.rfind("/sglang/")
        if i >= 0 or p.startswith("sglang/"):
            return f"{p[i + 1:] if i >= 0 else p}:{func}"
    return None


def signatures(tracebacks: list) -> frozenset:
    """The (exception type, innermost sglang frame) of each traceback (``server.tracebacks``)."""
    return frozenset((tb.get("type"), sglang_frame(tb.get("frames", []))) for tb in tracebacks)


def own_frames(tracebacks: list, packages: Iterable[str] = (PLUGIN_PACKAGE,)) -> list:
    """The frames of ``tracebacks`` in ``packages`` (``file:function``), in order."""
    packages = tuple(packages)
    return [f"{_path(path)}:{func}" for tb in tracebacks for path, func in tb.get("frames", [])
            if in_package(path, packages)]


def _short(frame: str) -> str:
    path, _, func = frame.rpartition(":")
    for p in (PLUGIN_PACKAGE + "/", "sglang/"):
        if p in path:
            path = path[path.rfind(p):]
            break
    return f"{path}:{func}"


def _signature_text(sigs: frozenset) -> str:
    return "; ".join(f"{t or 'no exception line'} at {f or 'no sglang frame'}" for t, f in sorted(sigs, key=str)) or "no traceback"


def excuse(state: str, tracebacks: Optional[list], stock: Optional[dict],
           packages: Iterable[str] = (PLUGIN_PACKAGE,)) -> tuple:
    """(excused, why) for a plugin row that stopped in ``state`` with ``tracebacks``, given its
    stock twin's result ``stock`` (None: not run). Excused only where the plugin row has a
    traceback, none of its frames is in ``packages``, and the stock twin stopped in the same
    state with the same signatures (``signatures``) and no fix of the plugin applied."""
    tbs = tracebacks or []
    if not tbs:
        return False, "no traceback in its log to attribute"
    own = own_frames(tbs, packages)
    if own:
        return False, f"a frame of the plugin in its traceback: {_short(own[-1])}"
    if not stock:
        return False, "the same row without the plugin was not run"
    if stock.get("state") != state:
        return False, f"without the plugin: {stock.get('state')}"
    if fix_state(stock.get("plugin_log") or []).applied:
        return False, "the row without the plugin applied fixes of the plugin"
    mine, theirs = signatures(tbs), signatures(stock.get("tracebacks") or [])
    if mine != theirs:
        return False, f"without the plugin it stops otherwise ({_signature_text(theirs)})"
    return True, _signature_text(mine)


# -- the verdict -------------------------------------------------------------------------------


def settings_changed(wanted: dict, logged: Optional[dict]) -> Optional[str]:
    """Where sglang changed a setting of the row on its own (``wanted``: ``{field: value}``;
    ``logged``: the fields as the server logged them, ``server.server_settings``): one line
    saying so, else None (a field the log does not show is not judged)."""
    changed = [f"{k}={logged[k]}, not {v}" for k, v in wanted.items() if logged and k in logged and str(logged[k]) != str(v)]
    return ("sglang changed the row's settings: it runs " + "; ".join(changed)) if changed else None


def accept_floor(expected: float) -> float:
    """The lowest accept length a row with the expected figure ``expected`` may show."""
    return expected - ACCEPT_TOLERANCE


def accept_problem(accept: Optional[float], expected: Optional[float]) -> Optional[tuple]:
    """(kind, text) of a speculative row's acceptance, or None where it holds."""
    if accept is None:
        return NO_SPECULATION, "NO SPECULATION: the responses count no verify step"
    if expected is None:
        return NO_EXPECTED, f"NO EXPECTED ACCEPT: no figure computed for this mode (server {accept:.2f})"
    if expected < DRAFT_ACCEPTS:
        return IDLE_DRAFT, (f"IDLE DRAFT: the float32 target and draft expect {expected:.2f} < {DRAFT_ACCEPTS} "
                            f"(server {accept:.2f}): no reading error can show; the target is at fault")
    if accept < accept_floor(expected):
        return LOW_ACCEPT, f"LOW ACCEPT (server {accept:.2f} < expected {expected:.2f} - {ACCEPT_TOLERANCE:.2f})"
    return None


def _wrong_text(judged: dict, plugin: bool) -> str:
    bands = {b: sum(c["bands"][b] for c in judged["per_seed"]) for b in BANDS}
    where = ", ".join(f"{b}: {k}" for b, k in bands.items() if k)
    return f"{'WRONG TOKENS' if plugin else 'other tokens'} (first divergence at token {where})"


def verdict(judged: dict, plugin: bool, plugin_loaded: Optional[bool] = None, stock: Optional[dict] = None, *,
            row: Optional[dict] = None, speculative: bool = False, expected: Optional[float] = None,
            needed: Optional[Iterable[str]] = None, ranks: int = 1, repeated: bool = False,
            packages: Iterable[str] = (PLUGIN_PACKAGE,)) -> Verdict:
    """The verdict (``Verdict``: text, failed, kind) of a judged row (``judge``). ``row``: the
    runner's result (its ``plugin_log``, ``tracebacks``, ``cached_tokens``); ``plugin_loaded``:
    whether the plugin loaded, where no ``row`` log says (False: a plugin row fails);
    ``stock``: the same row's result without the plugin; ``speculative``: the row runs a draft,
    ``expected`` its expected accept length; ``needed``: the fixes doctor finds needed here
    (None: not known, nothing checked); ``ranks``: the tensor-parallel size; ``repeated``: the
    requests were sent twice to hit the prefix cache; ``packages``: ``plugin_packages()``. The
    rules are the module's."""
    row = row or {}
    state = judged["state"]
    tbs = row.get("tracebacks")
    if state == REFUSED:
        own = own_frames(tbs or [], packages) if plugin else []
        if own:
            return Verdict(f"DID NOT START: {judged.get('error')} (a frame of the plugin in the refusal's traceback: "
                           f"{_short(own[-1])})", True, DID_NOT_START)
        return Verdict(f"{REFUSED}: {judged.get('error')}", False, REFUSED)
    if state != SERVED:
        if not plugin:
            return Verdict(f"{state}: {judged.get('error')}", False, STOCK)
        if stock is not None:
            ok, why = excuse(state, tbs, stock, packages)
            if ok:
                return Verdict(f"{state} without the plugin too (sglang's own failure): {judged.get('error')} [{why}]",
                               False, EXCUSED)
            return Verdict(f"{state.upper()}: {judged.get('error')} (not excused: {why})", True, state)
        return Verdict(f"{state.upper()}: {judged.get('error')}", True, state)

    problems = []  # (kind, text), the first decides the kind
    log = row.get("plugin_log")
    fixes = fix_state(log, ranks) if log is not None else None
    if not plugin:
        if fixes is not None and fixes.applied:
            problems.append((STOCK_WITH_PLUGIN, f"PLUGIN IN A STOCK ROW: applied {', '.join(fixes.applied)}"))
        text = "exact" if exact(judged) else _wrong_text(judged, False)
        if speculative:
            acc = accept_problem(judged.get("accept_length"), expected)
            text += f"; {acc[1].lower()}" if acc else ""
        if problems:
            return Verdict("; ".join([problems[0][1], text]), True, STOCK_WITH_PLUGIN)
        return Verdict(text, False, STOCK)
    if fixes is not None and not fixes.loaded or fixes is None and plugin_loaded is False:
        problems.append((NOT_LOADED, "PLUGIN NOT LOADED: no fix status line of the plugin in the server log"))
    if fixes is not None and fixes.loaded:
        if fixes.disagreements:
            problems.append((RANKS, "RANKS DISAGREE: " + "; ".join(fixes.disagreements)))
        missing = [f"{n} ({fixes.statuses.get(n, 'no line')})" for n in sorted(needed or ())
                   if n not in fixes.applied]
        if missing:
            problems.append((FIX_NOT_APPLIED, "FIX NOT APPLIED: " + ", ".join(missing)))
    if not exact(judged):
        problems.append((WRONG, _wrong_text(judged, True)))
    if repeated:
        cached = row.get("cached_tokens")  # per round; None: not reported
        if cached is not None and len(cached) > 1 and not cached[-1]:
            problems.append((NO_PREFIX_HIT, "NO PREFIX HIT: the repeated requests reused no cached token"))
    if speculative:
        acc = accept_problem(judged.get("accept_length"), expected)
        if acc:
            problems.append(acc)
    if problems:
        return Verdict("; ".join(t for _, t in problems), True, problems[0][0])
    return Verdict("OK", False, OK)


def tally(kinds: Iterable[str]) -> dict:
    """``{kind: count}`` in KINDS order, the kinds seen only."""
    kinds = list(kinds)
    return {k: kinds.count(k) for k in KINDS if k in kinds}
