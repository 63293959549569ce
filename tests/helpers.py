"""Shared test helpers (tests/ is on sys.path through pytest's ``pythonpath`` setting)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

import warm_children

HERE = Path(__file__).resolve().parent
SHIMS = HERE / "cpu_import_shims"


def _installed_plugin_path() -> str:
    spec = importlib.util.find_spec("sglang_swa_plugin")
    assert spec and spec.origin, "sglang-swa-plugin is not installed in this env"
    return spec.origin


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:  # noqa: BLE001
        return False


@functools.cache
def _has_plugin_framework() -> bool:
    return has_module("sglang.srt.plugins")


def __getattr__(name: str):
    """HAS_PLUGIN_FRAMEWORK and the marks needs_framework and no_framework_only, on first use:
    finding sglang.srt.plugins imports sglang (8 s of CPU), for nothing in pytest-xdist's
    controller, which loads these helpers (conftest.py) and runs no test."""
    if name == "HAS_PLUGIN_FRAMEWORK":
        return _has_plugin_framework()
    if name == "needs_framework":
        return pytest.mark.skipif(not _has_plugin_framework(), reason="this sglang has no plugin framework")
    if name == "no_framework_only":
        return pytest.mark.skipif(_has_plugin_framework(), reason="this sglang has a plugin framework")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main_window_snapshot():
    """"S1".."S4" where the installed sglang is one of the upstream main commits that nox's
    ``mainwindow`` session installs (tests/main_window.py), else None."""
    from importlib.metadata import version

    from main_window import snapshot_of

    return snapshot_of(version("sglang"))


def snapshot_carries(fix_name: str):
    """The upstream form of ``fix_name``'s bug that the installed main commit carries
    ("#25103", ...), or None (not a snapshot, or one without that bug)."""
    from main_window import SNAPSHOTS

    snap = main_window_snapshot()
    return SNAPSHOTS[snap][2].get(fix_name) if snap else None


@contextlib.contextmanager
def fix_in_effect(fix):
    """``fix`` in effect for the block where the installed sglang needs it: installed (and
    undone after) unless something (the 0.5.10 start-up hook) installed it already."""
    from sglang_swa_plugin.core import temporarily_installed
    from sglang_swa_plugin.fix import Verdict
    from sglang_swa_plugin.patching import target_marked_by

    if fix.detect().verdict is Verdict.NEEDED and not any(target_marked_by(t) == fix.name for t in fix.targets):
        with temporarily_installed(fix):
            yield
    else:
        yield


def child_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SWA_PLUGIN") and k != "SGLANG_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(SHIMS), extra.pop("PYTHONPATH", "")] if p)
    env.update(extra)
    return env


PRELUDE = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="LOG|%(name)s|%(levelname)s|%(message)s")
"""


def run_child(code: str, timeout: int = 240, *, prelude: bool = True, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` as ``python -c`` (as sglang starts a scheduler process: a new process that
    imports sglang and calls load_plugins()), forked from a warm interpreter where that is the
    same (tests/warm_children.py). ``prelude``: logging configured first, in the
    LOG|name|level|message format that ``plugin_log_lines`` reads."""
    source = (PRELUDE if prelude else "import json\n") + textwrap.dedent(code)
    # cwd: outside the source tree, to import the installed plugin
    return _python(["-c", source], child_env(**env), HERE.parent.parent, timeout)


def _python(argv: list, env: dict, cwd, timeout: float) -> subprocess.CompletedProcess:
    """``python ARGV``: forked from the warm interpreter, which runs with child_env(), where that is the same."""
    return warm_children.run(argv, env=env, base_env=child_env(), cwd=str(cwd), timeout=timeout)


def child_json(proc: subprocess.CompletedProcess, key: str = "RESULT"):
    for line in proc.stdout.splitlines():
        if line.startswith(key + "="):
            return json.loads(line[len(key) + 1 :])
    raise AssertionError(f"no {key}= line; rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}")


def plugin_log_lines(proc: subprocess.CompletedProcess) -> list:
    return [l for l in proc.stderr.splitlines() if l.startswith("LOG|sglang.srt.plugins.swa_plugin|")]


@contextlib.contextmanager
def without_fix(cls, attr: str, fix_name: str = None):
    """``cls.attr`` as sglang defines it for the block, whatever installed ``fix_name`` (None:
    any fix of ours) on it in this process (on sglang without a plugin framework the start-up
    hook installs the needed fixes for good when sglang's model runner is imported). Wrappers
    another fix installed over ``fix_name``'s are peeled with it."""
    from sglang_swa_plugin.patching import level_marks, marked_by
    from sglang_swa_plugin.probe import swapped

    fn = original = cls.__dict__[attr]
    chain = []  # our wrappers, outermost first (another fix may have wrapped over fix_name's)
    while marked_by(fn) is not None and getattr(fn, "__wrapped__", None) is not None:
        chain.append(fn)
        fn = fn.__wrapped__
    if fix_name is not None:
        theirs = [i for i, w in enumerate(chain) if fix_name in level_marks(w)]  # a chain of ours: one wrapper
        fn = chain[theirs[-1]].__wrapped__ if theirs else original  # and whatever sits above it
    if fn is original:
        yield
        return
    with swapped(cls, attr, fn):
        yield


@contextlib.contextmanager
def methods_alone(fix, methods: dict):
    """``{cls: method names}`` as sglang defines them for the block (``fix``'s hooks peeled)."""
    with contextlib.ExitStack() as stack:
        for cls, names in methods.items():
            for name in names:
                if name in cls.__dict__:
                    stack.enter_context(without_fix(cls, name, fix.name))
        yield


def scenario_or_skip(check_module: str):
    """``scenario()`` of ``sglang_swa_plugin.check.<check_module>``; the test is skipped where
    the scenario cannot run on the installed sglang (ScenarioUnavailable)."""
    import importlib

    from sglang_swa_plugin.fix import ScenarioUnavailable

    try:
        return importlib.import_module(f"sglang_swa_plugin.check.{check_module}").scenario()
    except ScenarioUnavailable as e:
        pytest.skip(str(e))


def skip_unless_needed(fix) -> None:
    """Skip the test where ``fix``'s detection on the installed sglang is not "needed"."""
    from sglang_swa_plugin.fix import Verdict

    det = fix.detect()
    if det.verdict is not Verdict.NEEDED:
        pytest.skip(f"not needed here: {det.reason}")


@contextlib.contextmanager
def fixed_alone(fix, methods: dict):
    """The same methods with ``fix`` installed on them where its detection says needed."""
    from sglang_swa_plugin.core import temporarily_installed
    from sglang_swa_plugin.fix import Verdict

    with methods_alone(fix, methods):
        if fix.detect().verdict is Verdict.NEEDED:
            with temporarily_installed(fix):
                yield
        else:
            yield


# ------------------------------------------------------------------ plugin loading in a child

LOAD = """
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang_swa_plugin
print("RESULT=" + json.dumps(sglang_swa_plugin.status()))
"""


def builtin_names() -> list:
    from sglang_swa_plugin.core import load_fixes

    return sorted(f.name for f, src in load_fixes() if src == "builtin")


BUILTIN_NAMES = builtin_names()


THIRD_PARTY_MODULE = '''
from sglang_swa_plugin.fix import Fix, Detection, around, hookimpl

CALLS = []

def _around(original, *args, **kwargs):
    CALLS.append(1)
    return original(*args, **kwargs)

class ThirdPartyFix(Fix):
    name = "acme_demo_fix"
    summary = "a third-party fix used by the tests"
    upstream_prs = ("#0",)
    targets = (TARGET,)
    def detect(self):
        return Detection.needed("always, for the test", around(TARGET, _around))

FIX = ThirdPartyFix()

@hookimpl
def sglang_swa_plugin_fixes():
    return [FIX]
'''

REAL_TARGET = "sglang.srt.mem_cache.swa_memory_pool.SWAKVPool.translate_loc_from_full_to_swa"
MOVED_TARGET = "sglang.srt.mem_cache.swa_memory_pool.SWAKVPool.method_that_moved_away"


def third_party_dist(tmp_path, target=REAL_TARGET, extra: str = ""):
    """An installed-looking distribution (dist-info with an entry point) on PYTHONPATH."""
    (tmp_path / "acme_swa_fix.py").write_text(f"TARGET = {target!r}\n" + THIRD_PARTY_MODULE + extra)
    di = tmp_path / "acme_swa_fix-0.1.dist-info"
    di.mkdir()
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-swa-fix\nVersion: 0.1\n")
    (di / "entry_points.txt").write_text("[sglang_swa_plugin.fixes]\nacme = acme_swa_fix\n")
    return str(tmp_path)


def release_of(text: str) -> tuple:
    """(major, minor, micro) of a version string, parsed with ``packaging``: an rc, dev or
    local version such as 0.5.12rc1 or 0.5.13.dev4+gabc is its release."""
    from packaging.version import Version

    return (tuple(Version(text).release) + (0, 0, 0))[:3]


def sglang_release() -> tuple:
    """The installed sglang's release as (major, minor, micro)."""
    from importlib.metadata import version

    return release_of(version("sglang"))


def run_cli(*args: str, tmp_path, env: dict = None, python_args=()) -> subprocess.CompletedProcess:
    """``sglang-swa-plugin ARGS`` in a new interpreter (warm where that is the same: run_child),
    outside the source tree."""
    return _python([*python_args, "-m", "sglang_swa_plugin.cli", *args], child_env() if env is None else env, tmp_path, 400)


def copy_dist(name: str, dest: Path) -> None:
    """The installed files of distribution ``name`` (package and dist-info) under ``dest``
    (an interpreter started with ``-S`` and ``dest`` on PYTHONPATH sees only those)."""
    import shutil
    from importlib.metadata import distribution

    dist = distribution(name)
    for f in dist.files or ():
        src = Path(dist.locate_file(f))
        if src.is_file() and ".." not in f.parts and not f.parts[0].endswith(".pth"):
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def report_json(filename: str, name: str, data: dict) -> None:
    """Print a GPU test's figures and, where ``OUT`` is set, merge them into ``$OUT/filename``."""
    print(f"{name}: {json.dumps(data)}")
    out = os.environ.get("OUT")
    if out:
        path = Path(out) / filename
        prev = json.loads(path.read_text()) if path.exists() else {}
        prev[name] = data
        path.write_text(json.dumps(prev, indent=2))


# -- the model-window fixes (mimo_v2_window, step3p5_window): one scenario shape ---------------

WINDOW_LAYERS = ("target_0", "target_1", "target_2", "target_3", "mtp_0")  # sliding, full, sliding, full, MTP


def assert_stock_window_one_key_more(fix, methods: dict, check_module: str) -> None:
    """Where ``fix`` is needed, stock's sliding layers (target and MTP) and the runner attend one
    key more than the model's window of 16."""
    skip_unless_needed(fix)
    with methods_alone(fix, methods):
        out = scenario_or_skip(check_module)
    assert out.bug, out.seen
    for layer in ("target_0", "target_2", "mtp_0"):
        assert (out.seen[layer]["model"], out.seen[layer]["layer"], out.seen[layer]["runner"]) == (16, 17, 17), out.seen


def assert_fixed_window_is_the_models(fix, methods: dict, check_module: str, runners=("target_0",)) -> None:
    """Where ``fix`` is needed it makes the layers and the ``runners`` right; where not, stock is."""
    from sglang_swa_plugin.fix import Verdict

    if fix.detect().verdict is Verdict.NOT_APPLICABLE:
        pytest.skip(f"not applicable here: {fix.detect().reason}")
    with fixed_alone(fix, methods):
        out = scenario_or_skip(check_module)
    assert not out.bug, out.seen
    assert [out.seen[k]["sliding_window_size"] for k in WINDOW_LAYERS] == [15, -1, 15, -1, 15], out.seen
    assert all(out.seen[k]["runner"] == 16 for k in runners), out.seen
