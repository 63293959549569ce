"""The records stay true. Each module record's "Affected versions" ends with one line,
``Status by release: <status> 0.5.a-0.5.b; <status> 0.5.c+``: the single source of the
per-release table. README's "What it fixes" release columns are that line rendered (checked
cell by cell; ``python tests/test_records.py`` prints the rendered cells), its upstream
column is each fix's ``upstream_prs`` (each of which its record names), each matrix env
checks that the fix's detection on its real code gives the record's status, the prose of the
record agrees (no release, or the releases it names), the table lists exactly the built-in
fixes, and no module record cites sglang line numbers (they move with every commit; records
name functions and branches)."""

from __future__ import annotations

import importlib
import inspect
import re
from importlib.metadata import version
from pathlib import Path

import pytest

from sglang_swa_plugin.core import BUILTIN_MODULES
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.gaps import GAPS, NOT_RUN

from helpers import HERE, main_window_snapshot, sglang_release

README = HERE.parent / "README.md"
STATUS = {Verdict.NEEDED: "applied", Verdict.NOT_NEEDED: "not needed", Verdict.NOT_APPLICABLE: "not applicable"}
OPT_IN = {"swa_index_guard"}  # a diagnostic, installed only when asked for


def fixes_table() -> dict:
    """{fix name: {column header: cell}} of README's "What it fixes" table."""
    header, *body = readme_table("## What it fixes")
    return {re.search(r"`(\w+)`", r[0]).group(1): dict(zip(header, r)) for r in body}


def readme_table(heading: str) -> list:
    """The rows (lists of cells, header first) of the table under README's ``heading``."""
    section = re.split(r"\n##+ ", README.read_text().split(f"\n{heading}\n", 1)[1], maxsplit=1)[0]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|") and not line.startswith("|---")]


def test_readme_gaps_table_is_what_doctor_lists():
    """README's "What it does not fix yet" and doctor's "not fixed yet" are one list (gaps.py)."""
    rows = readme_table("### What it does not fix yet")
    assert rows[0] == ["model", "path", "what happens (stock and with the plugin)", "instead"]
    assert rows[1:] == [[g.model, g.path, g.what, g.instead] for g in GAPS]
    not_run = re.findall(r"\nNot run yet: (.+)\.\n", README.read_text())
    assert not_run == ([", ".join(NOT_RUN)] if NOT_RUN else []), not_run


def test_a_gap_a_fix_warns_about_is_one_of_its_paths():
    """A gap a fix names at run time (``warned_by``) is a path that fix's record says it does not
    cover, and the fix exists."""
    warned = [g for g in GAPS if g.warned_by]
    assert warned  # today: Llama 4's prefill on trtllm_mha (trtllm_local_attn's preview)
    for gap in warned:
        module = next(m for m in BUILTIN_MODULES if m.rsplit(".", 1)[1] == gap.warned_by)
        mod = importlib.import_module(module)
        record = " ".join(mod.__doc__.split())
        assert "Not covered (one warning names it)" in record, (gap, record)
        # the path the gap names is one the record leaves out or holds back as a preview
        named = [w for w in re.findall(r"[a-z_0-9]{6,}", gap.path.lower()) if w in record.lower()]
        assert named, (gap.path, record)
        assert "warn_once(" in inspect.getsource(mod) or "_uncovered(" in inspect.getsource(mod)


LAST_RELEASE = 23  # the newest release of the test matrix: "0.5.N+" spans up to it


def affected_section(module) -> str:
    doc = importlib.import_module(module).__doc__
    return re.split(r"\n(?:Detection|Delete when)\n", doc.split("\nAffected versions\n", 1)[1])[0]


def record_statuses(module) -> dict:
    """{minor: status} for 0.5.10..0.5.LAST_RELEASE from the record's "Status by release" line."""
    line = re.search(r"Status by release: (.+?)\.?\n", affected_section(module) + "\n")
    assert line, f"{module}: no 'Status by release:' line in its record"
    out = {}
    for part in line.group(1).split(";"):
        m = re.fullmatch(r"\s*(.+?) 0\.5\.(\d+)(?:-0\.5\.(\d+)|(\+))?\s*", part)
        assert m, (module, part)
        lo = int(m.group(2))
        hi = LAST_RELEASE if m.group(4) else int(m.group(3) or lo)
        out.update({minor: m.group(1) for minor in range(lo, hi + 1)})
    assert sorted(out) == list(range(10, LAST_RELEASE + 1)), (module, sorted(out))
    return out


def rendered_cells(module) -> dict:
    """README's release cells of ``module``'s row, rendered from its record."""
    st = record_statuses(module)
    cells = {f"0.5.{minor}": st[minor] for minor in range(10, 14)}
    tail = [(minor, st[minor]) for minor in range(14, LAST_RELEASE + 1)]
    changes = [(m, s) for i, (m, s) in enumerate(tail) if i == 0 or tail[i - 1][1] != s]
    if len(changes) == 1:
        cells["0.5.14+"] = changes[0][1]
    else:
        ends = [m - 1 for m, _ in changes[1:]]
        parts = [f"{s} through 0.5.{end}" for (_, s), end in zip(changes, ends)]
        cells["0.5.14+"] = "; ".join(parts) + f"; {changes[-1][1]} on 0.5.{changes[-1][0]}+"
    return cells


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


@pytest.mark.parametrize("module", BUILTIN_MODULES)
def test_readme_release_columns_are_the_record_rendered(module):
    row = fixes_table()[module.rsplit(".", 1)[1]]
    want = rendered_cells(module)
    assert {col: row[col] for col in want} == want


@pytest.mark.parametrize("module", [m for m in BUILTIN_MODULES if m.rsplit(".", 1)[1] not in OPT_IN])
def test_this_release_detection_is_the_record(module):
    minor = _release_minor()
    if minor is None or main_window_snapshot():
        pytest.skip(f"sglang {version('sglang')} is no release: the records have no status for it")
    det = importlib.import_module(module).FIX.detect()
    assert STATUS.get(det.verdict) == record_statuses(module)[minor], (module, det)


@pytest.mark.parametrize("module", [m for m in BUILTIN_MODULES if m.rsplit(".", 1)[1] not in OPT_IN])
def test_record_prose_agrees_with_its_status_line(module):
    applied = {minor for minor, st in record_statuses(module).items() if st == "applied"}
    record = affected_section(module).split("Status by release:")[0]
    assert record.lstrip().startswith("No release") == (not applied), record
    assert applied <= named_releases(record), (applied, record)


def upstream_cell(module) -> str:
    """README's upstream cell of ``module``'s row: the fix's ``upstream_prs``, as listed."""
    return ", ".join(importlib.import_module(module).FIX.upstream_prs) or "–"


@pytest.mark.parametrize("module", BUILTIN_MODULES)
def test_readme_upstream_column_is_the_fix_record(module):
    row = fixes_table()[module.rsplit(".", 1)[1]]
    assert row["upstream"] == upstream_cell(module), (row["upstream"], upstream_cell(module))


@pytest.mark.parametrize("module", BUILTIN_MODULES)
def test_every_upstream_pr_of_a_fix_is_in_its_record(module):
    mod = importlib.import_module(module)
    section = mod.__doc__.split("\nUpstream PRs\n", 1)[1].split("\nAffected versions\n", 1)[0]
    for pr in mod.FIX.upstream_prs:
        assert set(re.findall(r"#(\d+)", pr)) <= set(re.findall(r"#(\d+)", section)), (pr, section)


def test_the_coverage_table_names_every_builtin_fix():
    """README's "What it covers" (model families x backend x speculative mode): its last
    column names fixes; together they are the built-in fixes."""
    section = README.read_text().split("## What it covers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|---")][1:]
    named = {n for line in rows for n in re.findall(r"`(\w+)`", line.strip().strip("|").split("|")[-1])}
    assert named == {m.rsplit(".", 1)[1] for m in BUILTIN_MODULES}, named


RECORD_MAX_LINES = 20  # a register entry: why, how, upstream, releases, when to delete


@pytest.mark.parametrize("module", BUILTIN_MODULES)
def test_records_are_register_entries_of_at_most_20_lines(module):
    """Measurement notes live in tests/gpu/RESULTS.md, not in the record."""
    lines = importlib.import_module(module).__doc__.rstrip("\n").splitlines()
    assert len(lines) <= RECORD_MAX_LINES, (module, len(lines))


def test_records_cite_no_line_numbers():
    hooks = Path(importlib.import_module("sglang_swa_plugin.hooks").__file__).parent
    pattern = r"\bL\d+(?:-L?\d+)?\b|\blines? \d+|\.py:\d+|#L\d+"
    cited = {p.name: re.findall(pattern, (p.read_text().split('"""')[1]))
             for p in hooks.glob("*.py") if p.read_text().startswith('"""')}
    assert not any(cited.values()), cited


def test_records_carry_no_measurements():
    """A record says what and why; figures (GPU runs, request counts, timings) go to
    tests/gpu/RESULTS.md."""
    hooks = Path(importlib.import_module("sglang_swa_plugin.hooks").__file__).parent
    pattern = r"\bH[12]00\b|\b\d+/\d{2,}\b|\b\d+ of \d+\b|\baccept \d|\d ?(?:µs|ms)\b"
    found = {p.name: re.findall(pattern, p.read_text().split('"""')[1])
             for p in hooks.glob("*.py") if p.read_text().startswith('"""')}
    assert not any(found.values()), found


if __name__ == "__main__":  # print the upstream and release cells README's table must carry
    for mod in BUILTIN_MODULES:
        print(mod.rsplit(".", 1)[1], "|", upstream_cell(mod), "|", " | ".join(rendered_cells(mod).values()))
