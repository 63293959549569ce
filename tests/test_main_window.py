"""The upstream main commits (tests/main_window.py, nox -s mainwindow) keep covering what they
are there for: the buggy forms that no release shipped.

In ``mainwindow(Sn)`` nox names the snapshot it installed (``SGLANG_SWA_EXPECTED_SNAPSHOT``):
the installed sglang must be that commit (else every snapshot test would skip unseen), each
bug that ``SNAPSHOTS`` says the commit carries must be detected as needed, shown by the fix's
scenario on real pools and backends without the fix and corrected with it, and the fixes it
does not list must not be needed there (the list is complete), and every fix's detection
gives a decided status there (what ``doctor`` exits 1 on otherwise). Everywhere: every fix
whose buggy form no release of the matrix shipped is carried by some snapshot, and
``main_window.make`` writes a snapshot that ``main_window.install`` reads."""

from __future__ import annotations

import importlib
import os
import subprocess
import tarfile

import pytest

import main_window
from helpers import main_window_snapshot
from main_window import SNAPSHOTS

from sglang_swa_plugin.core import BUILTIN_MODULES, find_fix, safe_detect, temporarily_installed
from sglang_swa_plugin.fix import Verdict
from sglang_swa_plugin.patching import target_marked_by

EXPECTED = os.environ.get("SGLANG_SWA_EXPECTED_SNAPSHOT") or None
SNAPSHOT = main_window_snapshot()
# The fixes whose bug a snapshot can carry (trtllm_xqa_spec_decode is needed on every
# release and main commit up to 0.5.21; swa_index_guard is a diagnostic, not a fix).
SNAPSHOT_FIXES = ("trtllm_swa_pool", "frozen_kv_views", "trtllm_extend_routing", "fa3_spec_translate")
# No release shipped these buggy forms: only the snapshots carry them.
MAIN_ONLY = {"frozen_kv_views": "#25103", "trtllm_extend_routing": "#24566", "trtllm_swa_pool": ("#25103", "#26966")}
# Read from each snapshot's source (all four: May-June 2026 main, before #32902/#38187 and
# #29858/#24481/#22679): FA3's eager local block table holds token slots and its CUDA-graph
# replay pushes page ids through the token-slot mapping; Triton builds no window rail for
# draft extend or the multi-step draft decode. S2 and S4 cache the pool's last full->SWA
# translation (state reset by ``register_mapping``), which the page probe once missed.
# Gemma4Attention passes ``config.sliding_window`` itself on all four (#26147 is later), and
# flashinfer's prefix-free ragged prefill runs without ``window_left`` on all four.
DECIDED = {"fa3_local_attn_pages": Verdict.NEEDED, "triton_swa_draft": Verdict.NEEDED,
           "gemma4_window": Verdict.NEEDED, "flashinfer_swa_prefill": Verdict.NEEDED}
OPT_IN = {"swa_index_guard"}
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


def test_the_sessions_run_the_tests_of_every_fix_nesting_with_a_snapshots_fix():
    """noxfile's FIX_TESTS (``main_window.fix_tests``, over ``wraps`` read from hooks/'s source)
    are the tests of the snapshots' fixes and of every fix linked to one through the installed
    fixes' ``wraps`` (either way, over any number of links); each file exists."""
    from sglang_swa_plugin.core import load_fixes

    installed = {fix.name: set(fix.wraps) for fix, _ in load_fixes() if fix.wraps}
    assert main_window.wraps() == installed, (main_window.wraps(), installed)
    got = main_window.fix_tests()
    assert got == main_window.fix_tests(installed), got
    names = {os.path.basename(f)[len("test_"):-len(".py")] for f in got}
    assert {fix for _, _, fixes in SNAPSHOTS.values() for fix in fixes} <= names, names
    assert "trtllm_local_attn" in names and "triton_local_attn" not in names, names  # linked; not linked
    assert all(os.path.exists(os.path.join(main_window.ROOT, f)) for f in got), got


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


@on_snapshot
@pytest.mark.parametrize("module", [m for m in BUILTIN_MODULES if m.rsplit(".", 1)[1] not in OPT_IN])
def test_every_fix_is_decided_on_the_snapshot(module):
    fix = importlib.import_module(module).FIX
    det = safe_detect(fix)
    assert det.verdict is not Verdict.UNKNOWN, f"{fix.name} undecided on {SNAPSHOT}: {det.reason}"
    if fix.name in DECIDED:
        assert det.verdict is DECIDED[fix.name], f"{fix.name} on {SNAPSHOT}: {det}"


def _git(*args, cwd):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_make_writes_what_install_reads(tmp_path):
    clone, folder = tmp_path / "sglang", tmp_path / "main-window"
    (clone / "python" / "sglang" / "srt").mkdir(parents=True)
    (clone / "python" / "sglang" / "srt" / "x.py").write_text("X = 1\n")
    (clone / "README.md").write_text("not in a snapshot\n")
    _git("init", "-q", ".", cwd=clone)
    _git("add", ".", cwd=clone)
    _git("commit", "-q", "-m", "c", cwd=clone)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    written = main_window.make(str(clone), str(folder), {"S9": (commit[:12], "0.5.12", {})})
    assert [os.path.basename(p) for p in written] == [f"sglang-main-S9-{commit[:10]}.tar.xz"]
    with tarfile.open(written[0]) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    assert files == {"python/sglang/srt/x.py": b"X = 1\n"}
    assert main_window.make(str(clone), str(folder), {"S9": (commit[:12], "0.5.12", {})}) == []  # kept


def test_missing_snapshots_are_named_with_how_to_make_them(tmp_path):
    absent = main_window.missing(str(tmp_path))
    assert absent == [main_window.tarball(s, str(tmp_path)) for s in SNAPSHOTS]
    assert "python tests/main_window.py make" in main_window.how_to_make(str(tmp_path))
