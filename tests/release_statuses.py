"""Every release's fix statuses against the records, without the full tests (nox -s statuses).

    python tests/release_statuses.py detect OUT.jsonl
        each built-in fix's detection (the opt-in diagnostic aside) on the installed sglang
        release, appended to OUT.jsonl as one line {"release", "statuses", "reasons", "framework"}
    python tests/release_statuses.py compare OUT.jsonl FULL ONCE
        the table fix x release; exit 1 where a detection is not its record's status (the
        "Status by release" line, which README's release columns render:
        tests/test_records.py), where a release of the records was not detected, or where
        FULL (comma list: the releases ``nox -t ci`` runs the full tests on) is not exactly
        the releases at which some record's status changes, the first release included, or
        where ONCE (comma list: the releases the release-independent tests run on, noxfile
        CLI_VERSIONS) misses a form of what those tests read of sglang (its plugin framework:
        ``framework()``).

Run as a script from the repository root, in an env holding sglang and the INSTALLED plugin.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from importlib.metadata import version

from sglang_swa_plugin.core import BUILTIN_MODULES, safe_detect

from test_records import LAST_RELEASE, OPT_IN, STATUS, record_statuses

MODULES = [m for m in BUILTIN_MODULES if m.rsplit(".", 1)[1] not in OPT_IN]
RELEASES = [f"0.5.{minor}" for minor in range(10, LAST_RELEASE + 1)]
SHORT = {"applied": "A", "not needed": "n", "not applicable": "-"}


def framework() -> str:
    """A digest of what the release-independent tests (markers cli, release_independent) read
    of sglang: its plugin framework's code (its syntax trees: formatting and comments aside);
    "none" where this sglang has no plugin framework (the start-up hook loads the plugin)."""
    root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / "srt" / "plugins"
    plugins = sorted(root.rglob("*.py"))
    if not plugins:
        return "none"
    digest = hashlib.sha256()
    for path in plugins:
        tree = ast.dump(ast.parse(path.read_text(encoding="utf-8")))
        digest.update(f"{path.relative_to(root).as_posix()}\0{tree}\0".encode())
    return digest.hexdigest()[:12]


def detect(out: str) -> None:
    statuses, reasons = {}, {}
    for module in MODULES:
        fix = importlib.import_module(module).FIX
        det = safe_detect(fix)
        statuses[fix.name] = STATUS.get(det.verdict, det.verdict.value)
        reasons[fix.name] = det.reason
    release = version("sglang")
    with open(out, "a") as f:
        f.write(json.dumps({"release": release, "statuses": statuses, "reasons": reasons,
                            "framework": framework()}) + "\n")
    print(f"sglang {release}:", ", ".join(f"{name} {st}" for name, st in statuses.items()))


def records() -> dict:
    """{release: {fix: status}} from the records' "Status by release" lines."""
    per_fix = {m.rsplit(".", 1)[1]: record_statuses(m) for m in MODULES}
    return {f"0.5.{minor}": {fix: st[minor] for fix, st in per_fix.items()} for minor in range(10, LAST_RELEASE + 1)}


def changes(table: dict) -> list:
    """The releases whose statuses differ from the release before (the first one included)."""
    return [r for i, r in enumerate(RELEASES) if i == 0 or table[r] != table[RELEASES[i - 1]]]


def framework_forms(found: dict) -> list:
    """[(framework digest, its releases)] in release order, a form per run of equal digests."""
    forms = []
    for r in RELEASES:
        digest = found.get(r, {}).get("framework", "missing")
        if forms and forms[-1][0] == digest:
            forms[-1][1].append(r)
        else:
            forms.append((digest, [r]))
    return forms


def compare(out: str, full: str, once: str) -> int:
    with open(out) as f:
        found = {line["release"]: line for line in map(json.loads, f)}
    want = records()
    fixes = list(next(iter(want.values())))
    width = max(map(len, fixes))
    print(f"{'':{width}}  " + " ".join(f"{r.rsplit('.', 1)[1]:>3}" for r in RELEASES)
          + "   (A applied, n not needed, - not applicable; X! detected X where the record says otherwise)")
    problems = []
    for fix in fixes:
        cells = []
        for r in RELEASES:
            got = found[r]["statuses"].get(fix, "missing") if r in found else "missing"
            mark = SHORT.get(got, "?")
            if got != want[r][fix]:
                mark += "!"
                why = found[r]["reasons"].get(fix, "") if r in found else "not detected"
                problems.append(f"{fix} on {r}: detected {got!r}, the record says {want[r][fix]!r} ({why})")
            cells.append(f"{mark:>3}")
        print(f"{fix:{width}}  " + " ".join(cells))
    flips, asked = changes(want), [v for v in full.split(",") if v]
    print("releases where some status changes (full tests in nox -t ci):", ", ".join(flips))
    if set(asked) != set(flips):
        problems.append(f"the full-test releases (noxfile CI_VERSIONS) are {', '.join(asked)}; the records' "
                        f"status changes are at {', '.join(flips)}")
    forms, ran = framework_forms(found), [v for v in once.split(",") if v]
    print("the plugin framework's forms (the release-independent tests run once per form):",
          "; ".join(f"{rs[0]}-{rs[-1]} {d}" if len(rs) > 1 else f"{rs[0]} {d}" for d, rs in forms))
    for digest, rs in forms:
        if not set(rs) & set(ran):
            problems.append(f"the release-independent tests (noxfile CLI_VERSIONS: {', '.join(ran)}) run on no "
                            f"release of the plugin framework's form {digest} ({rs[0]}-{rs[-1]}): add one")
    for p in problems:
        print("MISMATCH:", p)
    print("OK" if not problems else f"{len(problems)} mismatch(es)")
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["detect"] and len(sys.argv) == 3:
        detect(sys.argv[2])
    elif sys.argv[1:2] == ["compare"] and len(sys.argv) == 5:
        sys.exit(compare(sys.argv[2], sys.argv[3], sys.argv[4]))
    else:
        sys.exit(__doc__)
