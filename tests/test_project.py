"""What a new user meets first: the LICENSE the metadata promises, the command line's help
and version, README commands that run as written, versions parsed with ``packaging``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import distribution

import pytest

from helpers import HERE, release_of, run_cli

import sglang_swa_plugin

REPO = HERE.parent


def test_the_apache_license_is_shipped():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    meta = distribution("sglang-swa-plugin")
    shipped = [f for f in meta.files or () if f.name == "LICENSE"]
    assert shipped and "Apache License" in shipped[0].read_text(), meta.files


def test_version_and_help_are_plain(tmp_path):
    proc = run_cli("--version", tmp_path=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == f"sglang-swa-plugin {sglang_swa_plugin.__version__}"
    top = run_cli("--help", tmp_path=tmp_path).stdout
    assert "``" not in top and "doctor" in top and "check" in top and "selftest" in top and "--version" in top, top
    for cmd in ("doctor", "check", "selftest"):
        text = run_cli(cmd, "--help", tmp_path=tmp_path).stdout
        assert re.search(r"--json\s+print the report as JSON", text), text


def _nox_commands(text: str) -> list:
    return re.findall(r'nox -s "([^"]+)"', text)


def _nox_sessions() -> dict:
    """{session: whether a bare ``nox`` runs it} from ``nox --list`` ('*' marks those; the
    JSON listing holds only them)."""
    nox = shutil.which("nox")
    if nox is None:
        pytest.skip("nox is not on PATH")
    listed = subprocess.run([nox, "--list", "-f", str(REPO / "noxfile.py")], capture_output=True, text=True,
                            timeout=120, cwd=str(REPO)).stdout
    return {m.group(2): m.group(1) == "*" for m in re.finditer(r"(?m)^([*-]) (\S+)", listed)}


def test_a_bare_nox_runs_one_session_of_minutes():
    assert [name for name, default in _nox_sessions().items() if default] == ["statuses"]


def test_readme_and_noxfile_name_sessions_that_exist():
    listed = _nox_sessions()
    sessions = set(listed) | {name.split("(")[0] for name in listed}
    named = [cmd for doc in ("README.md", "CONTRIBUTING.md", "noxfile.py") for cmd in _nox_commands((REPO / doc).read_text())]
    assert len(named) >= 3, named
    for name in named:
        assert name in sessions, (name, sorted(sessions))


def test_versions_parse_with_packaging():
    assert release_of("0.5.12rc1") == (0, 5, 12)
    assert release_of("0.5.13.dev4+gabc1234") == (0, 5, 13)
    assert release_of("0.6") == (0, 6, 0)
    crude = re.compile(r"""version\(["']sglang["']\)\.split""")
    offenders = [p.name for p in (REPO / "tests").rglob("*.py") if crude.search(p.read_text())]
    assert not offenders, f"parse sglang's version with helpers.sglang_release(): {offenders}"


def test_the_wheel_installs_hooks_inside_the_package_and_the_start_up_hook_at_the_root():
    from importlib.metadata import entry_points

    from sglang_swa_plugin.core import BUILTIN_MODULES

    files = {str(f) for f in distribution("sglang-swa-plugin").files or ()}
    for module in BUILTIN_MODULES:
        assert module.replace(".", "/") + ".py" in files, module
    assert not [f for f in files if f.startswith("hooks/")], sorted(files)
    assert "sglang_swa_plugin_autoload.pth" in files and "sglang_swa_plugin/autoload.pth" not in files, sorted(files)
    plugins = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert plugins.get("swa_plugin") == "sglang_swa_plugin:register", plugins
    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert scripts.get("sglang-swa-plugin") == "sglang_swa_plugin.cli:main", scripts


def test_an_editable_install_maps_hooks_and_installs_the_start_up_hook(tmp_path):
    """``pip install -e .`` (here through uv, as the nox sessions install): the source tree's
    ``hooks/`` is ``sglang_swa_plugin.hooks``, no top-level ``hooks`` exists, and the start-up
    hook is installed as by a wheel."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([uv, "pip", "install", "-q", "--python", str(python), "--no-deps", "-e", str(REPO)],
                   check=True, timeout=600, cwd=str(tmp_path))
    code = """
import importlib.util, json, sglang_swa_plugin
spec = importlib.util.find_spec("sglang_swa_plugin.hooks.trtllm_swa_pool")
print(json.dumps([spec.origin, importlib.util.find_spec("hooks") is None]))
"""
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                         env={"PATH": os.environ["PATH"]})
    origin, no_top_level_hooks = json.loads(out.stdout.strip().splitlines()[-1])
    assert origin == str(REPO / "hooks" / "trtllm_swa_pool.py") and no_top_level_hooks, out.stdout + out.stderr
    (pth,) = venv.glob("lib/python*/site-packages/sglang_swa_plugin_autoload.pth")
    assert pth.read_text().strip() == "import sglang_swa_plugin._autoload"
