"""The upstream main commits (tests/main_window.py, nox -s mainwindow) keep covering what they
are there for: the buggy forms that no release shipped.

In ``mainwindow(Sn)`` nox names the snapshot it installed (``SGLANG_SWA_EXPECTED_SNAPSHOT``):
the installed sglang must be that commit (else every snapshot test would skip unseen), each
bug that ``SNAPSHOTS`` says the commit carries must be detected as needed, shown by the fix's
scenario on real pools and backends without the fix and corrected with it, and the fixes it
does not list must not be needed there (the list is complete). Everywhere: every fix whose
buggy form no release of the matrix shipped is carried by some snapshot."""

from __future__ import annotations

import os

import pytest

from helpers import main_window_snapshot
from main_window import SNAPSHOTS

from sglang_swa_plugin.core import find_fix, temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.patching import target_marked_by

EXPECTED = os.environ.get("SGLANG_SWA_EXPECTED_SNAPSHOT") or None
SNAPSHOT = main_window_snapshot()
# The fixes whose bug a snapshot can carry (trtllm_xqa_spec_decode is needed on every
# release and main commit up to 0.5.21; swa_index_guard is a diagnostic, not a fix).
SNAPSHOT_FIXES = ("trtllm_swa_pool", "frozen_kv_views", "trtllm_extend_routing", "fa3_spec_translate")
# No release shipped these buggy forms: only the snapshots carry them.
MAIN_ONLY = {"frozen_kv_views": "#25103", "trtllm_extend_routing": "#24566", "trtllm_swa_pool": ("#25103", "#26966")}
on_snapshot = pytest.mark.skipif(SNAPSHOT is None, reason="not an upstream main commit (nox -s mainwindow: S1-S4)")


def test_the_session_runs_on_the_snapshot_it_installed():
    if EXPECTED is None:
        pytest.skip("not in a mainwindow nox session")
    assert SNAPSHOT == EXPECTED, f"mainwindow({EXPECTED}) runs on sglang {SNAPSHOT!r}: its snapshot tests would skip"


def test_every_main_only_form_is_carried_by_a_snapshot():
    carried = {(fix, form) for _, _, forms in SNAPSHOTS.values() for fix, form in forms.items()}
    for fix, forms in MAIN_ONLY.items():
        for form in (forms,) if isinstance(forms, str) else forms:
            assert (fix, form) in carried, f"no snapshot carries {fix} {form}"


def _stock(fix):
    assert not any(target_marked_by(t) == fix.name for t in fix.targets), f"{fix.name} is installed already"


@on_snapshot
@pytest.mark.parametrize("name", SNAPSHOT_FIXES)
def test_each_listed_bug_is_needed_shown_and_corrected(name):
    fix = find_fix(name)
    form = SNAPSHOTS[SNAPSHOT][2].get(name)
    det = fix.detect()
    if form is None:
        assert det.verdict is not Verdict.NEEDED, f"{SNAPSHOT} needs {name}, which SNAPSHOTS does not list: {det}"
        return
    assert det.verdict is Verdict.NEEDED, f"{SNAPSHOT} should carry {name} {form}: {det}"
    _stock(fix)
    assert fix.reproduce() is True, f"{name}'s scenario does not show {form} on stock {SNAPSHOT}"
    with temporarily_installed(fix):
        assert fix.reproduce() is False, f"{name} does not correct {form} on {SNAPSHOT}"
