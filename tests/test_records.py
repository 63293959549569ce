"""The records stay true: README's "What it fixes" table says for each release what the fix's
detection decides on that release's real code (each matrix env checks its own column) and
what the module record's "Affected versions" says (no release, or the releases it names), it
lists exactly the built-in fixes, and no module record cites sglang line numbers (they move
with every commit; records name functions and branches)."""

from __future__ import annotations

import importlib
import re
from importlib.metadata import version
from pathlib import Path

import pytest

from sglang_swa_plugin.core import BUILTIN_MODULES
from sglang_swa_plugin.fix import Verdict

from helpers import HERE, main_window_snapshot, sglang_release

README = HERE.parent / "README.md"
STATUS = {Verdict.NEEDED: "applied", Verdict.NOT_NEEDED: "not needed", Verdict.NOT_APPLICABLE: "not applicable",
          Verdict.UNKNOWN: "unknown"}
OPT_IN = {"swa_index_guard"}  # a diagnostic, installed only when asked for


def fixes_table() -> dict:
    """{fix name: {column header: cell}} of README's "What it fixes" table."""
    section = README.read_text().split("## What it fixes", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    header, body = rows[0], rows[1:]
    return {re.search(r"`(\w+)`", r[0]).group(1): dict(zip(header, r)) for r in body}


def expected_status(cell: str, minor: int) -> str:
    """A cell's status for release 0.5.<minor>: a plain status, or "applied through 0.5.N;
    not needed on 0.5.M+"."""
    unknown_from = re.search(r"unknown on 0\.5\.(\d+)", cell)
    if unknown_from and minor >= int(unknown_from.group(1)):
        return "unknown"
    through = re.match(r"applied through 0\.5\.(\d+)", cell)
    if through:
        return "applied" if minor <= int(through.group(1)) else "not needed"
    return next(s for s in ("not applicable", "not needed", "applied") if cell.startswith(s))


def affected_section(module) -> str:
    doc = importlib.import_module(module).__doc__
    return re.split(r"\n(?:Detection|Delete when)\n", doc.split("\nAffected versions\n", 1)[1])[0]


def named_releases(text: str) -> set:
    """Minor numbers of the 0.5.x releases a text names, one by one or as ranges a-b."""
    out = set()
    for a, b in re.findall(r"0\.5\.(\d+)(?:\s*-\s*0\.5\.(\d+))?", text):
        out.update(range(int(a), int(b or a) + 1))
    return out


def _release_minor():
    major, minor, micro = sglang_release()
    return micro if (major, minor) == (0, 5) and micro else None


def test_readme_table_lists_the_builtin_fixes():
    assert set(fixes_table()) == {m.rsplit(".", 1)[1] for m in BUILTIN_MODULES}


@pytest.mark.parametrize("module", [m for m in BUILTIN_MODULES if m.rsplit(".", 1)[1] not in OPT_IN])
def test_readme_column_of_this_release_is_what_detection_says(module):
    minor = _release_minor()
    if minor is None or main_window_snapshot():
        pytest.skip(f"sglang {version('sglang')} is no release: README's table has no column for it")
    name = module.rsplit(".", 1)[1]
    row = fixes_table()[name]
    cell = row.get(f"0.5.{minor}") or row["0.5.14+"]
    det = importlib.import_module(module).FIX.detect()
    assert STATUS.get(det.verdict) == expected_status(cell, minor), (name, cell, det)


@pytest.mark.parametrize("module", [m for m in BUILTIN_MODULES if m.rsplit(".", 1)[1] not in OPT_IN])
def test_readme_row_agrees_with_the_module_record(module):
    row = fixes_table()[module.rsplit(".", 1)[1]]
    applied = {int(col.split(".")[2].rstrip("+")) for col, cell in row.items()
               if col.startswith("0.5.") and cell.startswith("applied")}
    record = affected_section(module)
    assert record.lstrip().startswith("No release") == (not applied), (row, record)
    assert applied <= named_releases(record), (applied, record)


def test_records_cite_no_line_numbers():
    hooks = Path(importlib.import_module("sglang_swa_plugin.hooks").__file__).parent
    cited = {p.name: re.findall(r"\bL\d+(?:-L?\d+)?\b|\blines? \d+", (p.read_text().split('"""')[1]))
             for p in hooks.glob("*.py") if p.read_text().startswith('"""')}
    assert not any(cited.values()), cited
