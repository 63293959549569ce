"""doctor never gives a false all-clear (exit 1 and the reason whenever the plugin will not
load or will install nothing) and never a traceback: what cannot be imported is one line,
and the rest of the report is still shown."""

from __future__ import annotations

import re

import pytest

from helpers import BUILTIN_NAMES, child_env, copy_dist, needs_framework, run_cli


def _last_line(proc) -> str:
    return proc.stdout.rstrip().splitlines()[-1]


def _fix_row(proc, name: str) -> str:
    return next(line.strip() for line in proc.stdout.splitlines() if line.startswith(f"  {name} "))


@pytest.mark.cli
@needs_framework
def test_sglang_plugins_without_us_is_a_problem(tmp_path):
    proc = run_cli("doctor", tmp_path=tmp_path, env=child_env(SGLANG_PLUGINS="other_plugin"))
    assert proc.returncode == 1, proc.stdout
    assert _last_line(proc).startswith("PROBLEM: SGLANG_PLUGINS=other_plugin does not name swa_plugin"), proc.stdout
    for name in BUILTIN_NAMES:  # no fix row claims what will not happen
        row = _fix_row(proc, name)
        assert re.match(rf"{name}\s+not loaded\s+will not be applied", row), row


@pytest.mark.cli
def test_plugin_switched_off_is_a_problem(tmp_path):
    proc = run_cli("doctor", tmp_path=tmp_path, env=child_env(SGLANG_SWA_PLUGIN="0"))
    assert proc.returncode == 1 and "SGLANG_SWA_PLUGIN=0: the plugin installs nothing" in _last_line(proc), proc.stdout


def test_without_sglang_it_says_so_and_fails(tmp_path):
    """An interpreter that sees only the plugin and pluggy (``-S``: no site-packages)."""
    site = tmp_path / "site"
    for name in ("sglang-swa-plugin", "pluggy"):
        copy_dist(name, site)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}
    proc = run_cli("doctor", tmp_path=tmp_path, env=env, python_args=("-S",))
    assert "sglang:            not installed" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 1 and "PROBLEM: sglang is not installed" in _last_line(proc), proc.stdout


def test_what_cannot_be_imported_is_a_line_not_a_traceback(tmp_path):
    """Without tests/cpu_import_shims a CPU machine cannot import sglang's attention
    backends (CUDA-only binaries)."""
    env = child_env()
    env["PYTHONPATH"] = ""
    proc = run_cli("doctor", tmp_path=tmp_path, env=env)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out[-4000:]
    assert proc.returncode == 1 and "cannot import" in proc.stdout, proc.stdout
    for name in BUILTIN_NAMES:  # the rest of the report is there
        assert f"  {name} " in proc.stdout, proc.stdout
    assert "loaded by:" in proc.stdout and _last_line(proc).startswith("PROBLEM: ")
    # sglang's CUDA-only stack failing on a CPU: one line of advice, just above the verdict
    lines = proc.stdout.rstrip().splitlines()
    assert lines[-2].startswith("hint: ") and "tests/cpu_import_shims" in lines[-2], proc.stdout
    assert lines[-1].startswith("PROBLEM: "), lines[-1]
    if lines[-1].startswith("PROBLEM: cannot import sglang: "):  # that one line, not one per fix too
        assert "; fix " not in lines[-1], lines[-1]


@pytest.mark.cli
def test_all_but_one_fix(tmp_path):
    proc = run_cli("doctor", tmp_path=tmp_path, env=child_env(SGLANG_SWA_PLUGIN_FIXES="all,-trtllm_swa_pool"))
    assert "BAD SETTING" not in proc.stdout and "bad setting" not in proc.stdout, proc.stdout
    assert re.match(r"trtllm_swa_pool\s+disabled\s+not selected by SGLANG_SWA_PLUGIN_FIXES=all,-trtllm_swa_pool",
                    _fix_row(proc, "trtllm_swa_pool")), proc.stdout
    others = [_fix_row(proc, n) for n in BUILTIN_NAMES if n not in ("trtllm_swa_pool", "swa_index_guard")]
    assert not [row for row in others if " disabled " in row], proc.stdout


def test_the_hint_names_only_a_cuda_only_failure():
    """In this env (import shims on PYTHONPATH) torchvision imports: a fix target missing for
    another reason gets no hint; the failure a CPU machine without the shims shows gets it."""
    from sglang_swa_plugin import doctor

    other = [{"status": "unknown", "reason": "cannot import sglang.srt.x: ModuleNotFoundError: No module named 'xgrammar'"}]
    assert doctor.import_hint(None, other) is None
    assert doctor.import_hint(None, []) is None
    nms = "cannot import sglang: RuntimeError: operator torchvision::nms does not exist"
    assert doctor.import_hint(nms, []) == doctor.IMPORT_HINT
