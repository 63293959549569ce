"""A run whose skips go beyond tests/expected_skips.py fails (tests/conftest.py), with and
without pytest-xdist; the declarations' release, record and snapshot forms."""

from __future__ import annotations

import subprocess
import sys

import pytest

import expected_skips
from helpers import HERE, child_env

PROBE = '''
import pytest

def test_runs():
    pass

def test_skips():
    pytest.skip("a release turned this test into a skip")
'''


@pytest.mark.release_independent
def test_an_undeclared_skip_fails_the_run_under_xdist(tmp_path):
    """Two workers run the probe; the controller sees the skip and fails the run (exit 1)
    that would otherwise pass."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    run = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
           "-n", "2", str(tmp_path / "test_probe.py")]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=400, cwd=str(tmp_path),
                          env={**child_env(PYTHONPATH=str(HERE)), "SGLANG_SWA_SKIPS_OUT": ""})
    out = proc.stdout
    assert proc.returncode == 1 and "1 passed, 1 skipped" in out, out[-3000:] + proc.stderr[-3000:]
    assert "undeclared skips on " in out and "test_probe.py::test_skips: a release turned" in out, out[-3000:]
    assert '"test_probe.py::test_skips": "' in out  # the line that would declare it


def test_declarations_by_release_record_and_snapshot():
    d = expected_skips.declared
    assert d("0.5.10-0.5.12", "0.5.11") and not d("0.5.10-0.5.12", "0.5.13")
    assert d("0.5.16+", "0.5.30") and not d("0.5.16+", "0.5.15") and not d("0.5.16+", "S1")
    assert d("release", "0.5.12") and not d("release", "S2") and d("all", "S2") and d("S1-S3", "S2")
    assert not d("S1, S3", "S2") and not d("", "0.5.12")
    # the records: swa_graph_padding is applied on 0.5.11 only, frozen_kv_views not applicable on 0.5.10-0.5.11
    assert [d("swa_graph_padding!=applied", f"0.5.{m}") for m in (10, 11, 12, 23)] == [True, False, True, True]
    assert [d("frozen_kv_views==not applicable", f"0.5.{m}") for m in (10, 11, 12)] == [True, True, False]
    assert not d("swa_graph_padding!=applied", "S1")


def test_a_parameter_stands_for_its_fix(monkeypatch):
    monkeypatch.setitem(expected_skips.EXPECTED, "test_x.py::test_each_fix", "{param}==not applicable")
    test = "tests/test_x.py::test_each_fix"
    skips = [(f"{test}[frozen_kv_views]", "no FROZEN_KV MTP"), (f"{test}[swa_write_loc]", "why")]
    assert expected_skips.undeclared(skips, "0.5.11") == skips[1:]
    assert expected_skips.undeclared(skips, "0.5.12") == skips


def test_the_table_a_run_makes():
    rows = [{"release": r, "test": None} for r in ("0.5.10", "0.5.11", "0.5.12", "0.5.14", "0.5.23", "S1")]
    rows += [{"release": r, "test": "tests/test_a.py::test_x[p]"} for r in ("0.5.11", "0.5.12", "0.5.23", "S1")]
    assert expected_skips.table(rows) == {"test_a.py::test_x": "0.5.11-0.5.13, 0.5.23+, S1"}


def test_each_test_is_declared_once():
    """A second declaration of the same test would silently replace the first (a dict)."""
    import ast
    import collections

    tree = ast.parse(open(expected_skips.__file__, encoding="utf-8").read())
    table = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "EXPECTED")
    twice = [k for k, n in collections.Counter(k.value for k in table.keys).items() if n > 1]
    assert not twice, twice
