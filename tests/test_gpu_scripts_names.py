"""The GPU-only scripts (benchmarks, server scenarios, GPU tests) cannot run here, so a name they
use that nothing defines would first fail on the GPU, after the payload's transfer (a bench row
named an undefined ``chunk`` after a refactor; it showed only there). ruff's pyflakes rules
(``ruff check .``, the lint session; ``[tool.ruff.lint]`` in pyproject.toml) find such a name
(F821) in every file of the tree, the scripts included. What this file checks: the scripts are
there, and ruff's configuration reads them with its undefined-name rule on."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = sorted([*HERE.glob("benchmarks/*.py"), *HERE.glob("gpu/*.py"), *HERE.glob("gpu/*/*.py")])


def ruff_settings() -> dict:
    with open(HERE.parent / "pyproject.toml", "rb") as f:
        return tomllib.load(f).get("tool", {}).get("ruff", {})


def left_out(settings: dict, path: str) -> "list[str]":
    """Why ruff would not report an undefined name in ``path`` (relative to the repository), as
    ``settings`` (pyproject's ``[tool.ruff]``) say: the rule not selected, or ignored, or the
    file excluded."""
    lint = settings.get("lint", {})
    selected = [*lint.get("select", ["E4", "E7", "E9", "F"]), *lint.get("extend-select", [])]
    why = []
    if not any("F821".startswith(code) or code == "ALL" for code in selected):
        why.append(f"F821 not selected ({selected})")
    ignored = [*lint.get("ignore", []), *lint.get("extend-ignore", [])]
    for pattern, codes in lint.get("per-file-ignores", {}).items():
        if fnmatch.fnmatch(path, pattern):
            ignored += codes
    why += [f"ignored: {code}" for code in ignored if "F821".startswith(code)]
    for pattern in [*settings.get("exclude", []), *settings.get("extend-exclude", []),
                    *lint.get("exclude", [])]:
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path, pattern.rstrip("/") + "/*"):
            why.append(f"excluded: {pattern}")
    return why


def test_the_gpu_scripts_are_there():
    assert SCRIPTS, "no GPU scripts found"


def test_ruff_finds_an_undefined_name_in_every_gpu_script():
    settings = ruff_settings()
    assert settings, "pyproject.toml has no [tool.ruff]"
    missed = {str(p.relative_to(HERE.parent)): why for p in SCRIPTS
              if (why := left_out(settings, str(p.relative_to(HERE.parent))))}
    assert not missed, missed


def test_the_check_reads_what_ruff_leaves_out():
    """The check itself: a configuration that drops pyflakes' rules, ignores F821 for the GPU
    scripts or excludes them is reported."""
    path = "tests/gpu/e2e_server.py"
    assert left_out({"lint": {"select": ["F"]}}, path) == []
    assert left_out({"lint": {"select": ["E402"]}}, path) == ["F821 not selected (['E402'])"]
    assert left_out({"lint": {"select": ["F"], "per-file-ignores": {"tests/gpu/*": ["F8"]}}}, path) == ["ignored: F8"]
    assert left_out({"extend-exclude": ["tests/gpu"], "lint": {"select": ["F"]}}, path) == ["excluded: tests/gpu"]
