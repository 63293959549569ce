"""Every release's fix statuses against the records, without the full tests (nox -s statuses).

    python tests/release_statuses.py detect OUT.jsonl
        each built-in fix's detection (the opt-in diagnostic aside) on the installed sglang
        release, appended to OUT.jsonl as one line {"release", "statuses", "reasons"}
    python tests/release_statuses.py compare OUT.jsonl FULL
        the table fix x release; exit 1 where a detection is not its record's status (the
        "Status by release" line, which README's release columns render:
        tests/test_records.py), where a release of the records was not detected, or where
        FULL (comma list: the releases ``nox -t ci`` runs the full tests on) is not exactly
        the releases at which some record's status changes, the first release included.

Run as a script from the repository root, in an env holding sglang and the INSTALLED plugin.
"""

from __future__ import annotations

import importlib
import json
import sys
from importlib.metadata import version

from sglang_swa_plugin.core import BUILTIN_MODULES, safe_detect

from test_records import LAST_RELEASE, OPT_IN, STATUS, record_statuses

MODULES = [m for m in BUILTIN_MODULES if m.rsplit(".", 1)[1] not in OPT_IN]
RELEASES = [f"0.5.{minor}" for minor in range(10, LAST_RELEASE + 1)]
SHORT = {"applied": "A", "not needed": "n", "not applicable": "-"}


def detect(out: str) -> None:
    statuses, reasons = {}, {}
    for module in MODULES:
        fix = importlib.import_module(module).FIX
        det = safe_detect(fix)
        statuses[fix.name] = STATUS.get(det.verdict, det.verdict.value)
        reasons[fix.name] = det.reason
    release = version("sglang")
    with open(out, "a") as f:
        f.write(json.dumps({"release": release, "statuses": statuses, "reasons": reasons}) + "\n")
    print(f"sglang {release}:", ", ".join(f"{name} {st}" for name, st in statuses.items()))


def records() -> dict:
    """{release: {fix: status}} from the records' "Status by release" lines."""
    per_fix = {m.rsplit(".", 1)[1]: record_statuses(m) for m in MODULES}
    return {f"0.5.{minor}": {fix: st[minor] for fix, st in per_fix.items()} for minor in range(10, LAST_RELEASE + 1)}


def changes(table: dict) -> list:
    """The releases whose statuses differ from the release before (the first one included)."""
    return [r for i, r in enumerate(RELEASES) if i == 0 or table[r] != table[RELEASES[i - 1]]]


def compare(out: str, full: str) -> int:
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
    for p in problems:
        print("MISMATCH:", p)
    print("OK" if not problems else f"{len(problems)} mismatch(es)")
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["detect"] and len(sys.argv) == 3:
        detect(sys.argv[2])
    elif sys.argv[1:2] == ["compare"] and len(sys.argv) == 4:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
