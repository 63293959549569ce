"""doctor never gives a false all-clear (exit 1 and the reason whenever the plugin will not
load or will install nothing) and never a traceback: what cannot be imported is one line,
and the rest of the report is still shown."""

from __future__ import annotations

import shutil
from importlib.metadata import distribution
from pathlib import Path

from helpers import BUILTIN_NAMES, child_env, needs_framework, run_cli


def _last_line(proc) -> str:
    return proc.stdout.rstrip().splitlines()[-1]


@needs_framework
def test_sglang_plugins_without_us_is_a_problem(tmp_path):
    proc = run_cli("doctor", tmp_path=tmp_path, env=child_env(SGLANG_PLUGINS="other_plugin"))
    assert proc.returncode == 1, proc.stdout
    assert _last_line(proc).startswith("PROBLEM: SGLANG_PLUGINS=other_plugin does not name swa_plugin"), proc.stdout


def test_plugin_switched_off_is_a_problem(tmp_path):
    proc = run_cli("doctor", tmp_path=tmp_path, env=child_env(SGLANG_SWA_PLUGIN="0"))
    assert proc.returncode == 1 and "SGLANG_SWA_PLUGIN=0: the plugin installs nothing" in _last_line(proc), proc.stdout


def _copy_dist(name: str, dest: Path) -> None:
    """The installed files of distribution ``name`` (package and dist-info) under ``dest``."""
    dist = distribution(name)
    for f in dist.files or ():
        src = Path(dist.locate_file(f))
        if src.is_file() and ".." not in f.parts and not f.parts[0].endswith(".pth"):
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def test_without_sglang_it_says_so_and_fails(tmp_path):
    """An interpreter that sees only the plugin and pluggy (``-S``: no site-packages)."""
    site = tmp_path / "site"
    for name in ("sglang-swa-plugin", "pluggy"):
        _copy_dist(name, site)
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
