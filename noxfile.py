"""Test matrix: one session per sglang release, each a fresh env with that release's REAL
wheel (installed --no-deps) plus only what its imports need on a CPU-only machine.

    nox                      # the default: statuses (every release's fix statuses, minutes)
    nox -l                   # every session; '*' marks the default ones
    nox -t ci                # the CI selection: statuses, full tests where a status changes, mainwindow
    nox -s statuses          # the 14 releases' fix statuses against the records, one env
    nox -s "tests(0.5.12)"   # one version's full tests
    nox -s demo              # build a 0.5.11 env and show doctor + check in it
    nox -s mainwindow        # doctor and the fixes' tests on four sglang main commits (S1-S4)
    nox -s lint              # ruff check . (pyflakes' rules, the whole tree; seconds)

nox runs under any Python; the sessions need a Python 3.11 interpreter on PATH.
"""

from __future__ import annotations

import glob
import os
import re
import sys

import nox

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))
import main_window

nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = True
# A bare `nox`: one session of minutes, not the whole matrix (hours).
nox.options.sessions = ["statuses"]

VERSIONS = [f"0.5.{n}" for n in range(10, 24)]
# The releases `nox -t ci` runs the full tests on: the first, and each where some fix's status
# differs from the release before it (the records' "Status by release" lines). The statuses
# session fails where this set is not exactly those releases, or where a release's detection
# is not its record, so a release outside it classifies as the records say.
CI_VERSIONS = {"0.5.10", "0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.16", "0.5.22", "0.5.23"}
DEMO_VERSION = "0.5.11"
# Where the release-independent tests run (pytest marker release_independent: the plugin's own
# start-up and hook verification on each form of sglang's plugin framework): 0.5.10 (the start-up
# hook, no framework) and the newest release (the framework). The statuses session fails where
# these miss a form of sglang's plugin framework (its code).
CLI_VERSIONS = {"0.5.10", VERSIONS[-1]}
# Where the command-line and settings runs go (pytest marker cli: behaviour that depends on no
# release, minutes of subprocesses importing sglang): the newest release alone.
COMMAND_LINE_VERSIONS = {VERSIONS[-1]}
# Where the selftest targets' own float32 computations run (pytest marker targets: transformers'
# models on the CPU, no sglang; minutes a release): the newest release, whose transformers has
# every target's reference class (a target it lacks there is an undeclared skip: the run fails).
TARGET_VERSIONS = {VERSIONS[-1]}
# The fixes' tests on the main commits: every fix a snapshot carries, and every fix whose hooks
# nest with theirs (Fix.wraps), derived from tests/main_window.py's SNAPSHOTS and hooks/.
FIX_TESTS = main_window.fix_tests()
# What mainwindow runs: the fixes' tests, and the check that each snapshot still carries,
# shows and gets corrected the bugs SNAPSHOTS lists for it.
MAIN_WINDOW_TESTS = FIX_TESTS + [os.path.join("tests", "test_main_window.py")]
SHIMS = os.path.join("tests", "cpu_import_shims")

# What sglang's modules import on a CPU machine (../shared facts, measured per release).
BASE = [
    "torchvision==0.28.0", "triton==3.6.0", "numpy<2.3", "orjson", "psutil", "pybase64",
    "requests", "packaging", "pillow", "starlette", "tqdm", "IPython", "pydantic",
    "aiohttp", "pyzmq", "partial-json-parser", "dill", "sentencepiece", "einops",
    "compressed-tensors", "gguf", "msgspec", "setproctitle", "uvicorn", "fastapi",
    # flashinfer is installed --no-deps (its CUDA extras are of no use here); these are
    # what `import flashinfer` needs on a CPU.
    "apache-tvm-ffi", "nvidia-ml-py", "tabulate", "click",
    "pytest", "pytest-xdist", "pluggy",
    # the selftest's targets solve their score profiles with scipy (a dependency of sglang's own)
    "scipy",
]
# numpy<2.3: Triton 3.6's interpreter (TRITON_INTERPRET=1: sglang's own Triton kernels run on
# the CPU, tests/interpreted_*.py) takes a loaded scalar's int() of a one-element array, which
# numpy 2.4 refuses.
# Pins taken from the installed sglang's own metadata (0.5.16-0.5.20 import xgrammar at
# module level).
PINNED = ("transformers", "openai", "apache-tvm-ffi", "xgrammar")
TEST_ENV = {
    "PYTHONPATH": SHIMS,
    # Python writes the bytecode of what a test process imports (the first one to import a
    # module; the rest reuse it) where the machine sets PYTHONDONTWRITEBYTECODE: an env is not
    # compiled as it installs (all of torch, sglang...; most of it never imported here).
    "PYTHONDONTWRITEBYTECODE": "",
    "HF_HUB_OFFLINE": "1",
    "SGLANG_FLASHINFER_WORKSPACE_SIZE": "1048576",
    "TOKENIZERS_PARALLELISM": "false",
}
# pytest spread over the machine's cores (pytest-xdist), a test file per worker at a time (its
# module-scoped fixtures run once): most of the time is child processes importing sglang, one
# core each, forked from a warm interpreter per worker that has imported torch, transformers and
# the rest once (tests/warm_children.py; SWA_TESTS_FRESH_CHILDREN=1: every child a fresh
# interpreter). ``-- -n 0`` after these runs the tests in one process (the last -n counts).
# --no-loadscope-reorder: the files go out in the order tests/conftest.py gives them (the
# costliest first, tests/xdist_costs.json), not by their number of tests (a long file of a
# few slow tests last kept one worker busy while the others had nothing left to run).
PYTEST_WORKERS = ["-n", str(min(os.cpu_count() or 1, 4)), "--dist", "loadfile", "--no-loadscope-reorder"]
# A worker per core: one torch (OpenMP) thread each, none spinning against the other worker
# (two Triton-interpreted test files: 80.3 CPU s with the default threads, 76.4 s with one).
PYTEST_ENV = {**TEST_ENV, "OMP_NUM_THREADS": "1"}


def _torch() -> str:
    """The local CPU torch 2.13.0 wheel when pip's find-links has it (seconds instead of
    a multi-GB CUDA download), else the index's torch 2.13.0."""
    for d in re.split(r"[\s]+", os.environ.get("PIP_FIND_LINKS", "/opt/wheels")):
        hits = sorted(glob.glob(os.path.join(d, "torch-2.13.0*cpu*cp311*.whl")))
        if hits:
            return hits[0]
    return "torch==2.13.0"


def _pins(session: nox.Session) -> list[str]:
    code = (
        "import importlib.metadata as m, re\n"
        f"want = {set(PINNED) | {'flashinfer-python'}!r}\n"
        "for r in m.requires('sglang') or []:\n"
        "    if ';' in r: continue\n"
        "    n = re.split(r'[<>=!~ \\[]', r, 1)[0].strip().lower().replace('_', '-')\n"
        "    if n in want: print(re.sub(r'\\[.*?\\]', '', r.replace(' ', '')))\n"
    )
    # run_install: this query is part of the install, so it runs under --install-only too
    out = session.run_install("python", "-c", code, silent=True) or ""
    return out.split()


def install_sglang(session: nox.Session, version: str, swap: bool = False) -> None:
    """An env of sglang ``version`` for a CPU machine, in three uv calls. ``swap``: the env holds
    another release already (statuses); its sglang and that release's pins are replaced, the rest
    stays. Nothing is byte-compiled as it installs: the test processes write the bytecode of what
    they import (TEST_ENV), once per env, where compiling the whole env took longer."""
    session.log(f"sglang {version}: the release's own wheel, without its dependencies (the CUDA ones "
                "do not install on a CPU machine)")
    session.install("--no-deps", f"sglang=={version}")
    pins = _pins(session)
    flashinfer = [p for p in pins if p.lower().replace("_", "-").startswith("flashinfer-python")]
    others = [p for p in pins if p not in flashinfer]
    if swap:
        session.log(f"sglang {version}'s pins: {' '.join(others)}")
        session.install(*others)
    else:
        session.log(f"what sglang {version}'s modules import on a CPU machine: CPU torch 2.13.0, torchvision, "
                    f"triton and {len(BASE) - 3} small packages, and the release's pins {' '.join(others)} "
                    "(about 2 GB; 1-3 min with an empty package cache); the plugin, built as a wheel from "
                    "this tree (what users install)")
        session.install(_torch(), *BASE, *others, ".", "--reinstall-package", "sglang-swa-plugin")
    session.log(f"{' '.join(flashinfer) or 'flashinfer-python'} without its dependencies (CUDA extras, of no "
                "use here; sglang's modules import it)")
    session.install("--no-deps", *(flashinfer or ["flashinfer-python"]))


@nox.session(python="3.11", tags=["ci"])
def statuses(session: nox.Session) -> None:
    """Every release's fix statuses against the records (README's release columns), in one
    env whose sglang is swapped release by release: no full tests. Fails where a fix's
    detection on a release is not its record's status, or where CI_VERSIONS is not exactly
    the releases at which some status changes (those get the full tests in ``nox -t ci``)."""
    out = os.path.join(session.create_tmp(), "statuses.jsonl")
    if os.path.exists(out):
        os.remove(out)
    script = os.path.join("tests", "release_statuses.py")
    for i, version in enumerate(VERSIONS):
        install_sglang(session, version, swap=i > 0)
        session.run("python", script, "detect", out, env=TEST_ENV)
    session.run("python", script, "compare", out, ",".join(sorted(CI_VERSIONS, key=VERSIONS.index)),
                ",".join(sorted(CLI_VERSIONS, key=VERSIONS.index)), env=TEST_ENV)


@nox.session(python="3.11")
@nox.parametrize("sglang", [nox.param(v, id=v, tags=["ci"] if v in CI_VERSIONS else []) for v in VERSIONS])
def tests(session: nox.Session, sglang: str) -> None:
    """The full tests on one release (3.5-8 min on 2 cores; ``-- tests/test_x.py`` for one file)."""
    install_sglang(session, sglang)
    # The release-independent tests run on CLI_VERSIONS, the command-line ones on
    # COMMAND_LINE_VERSIONS, the targets' on TARGET_VERSIONS; every other test on every release.
    skipped = [*(("release_independent",) if sglang not in CLI_VERSIONS else ()),
               *(("cli",) if sglang not in COMMAND_LINE_VERSIONS else ()),
               *(("targets",) if sglang not in TARGET_VERSIONS else ())]
    marks = " and ".join(["not gpu", *(f"not {m}" for m in skipped)])
    session.run("pytest", *PYTEST_WORKERS, "-m", marks, *session.posargs, env=PYTEST_ENV)


@nox.session(python="3.11")
# In CI: the four together took 6m39s on 2 shared cores (warm package cache); their pytest
# runs (MAIN_WINDOW_TESTS) take 44-77 s each on 2 busy shared cores (S1 58, S2 77, S3 44,
# S4 62 s). Without the snapshots' folder each one fails in CI (CI=true) and is skipped
# elsewhere, saying how to make them.
@nox.parametrize("snapshot", [nox.param(s, id=s, tags=["ci"]) for s in main_window.SNAPSHOTS])
def mainwindow(session: nox.Session, snapshot: str) -> None:
    """doctor and the fixes' tests on an upstream main commit: the nearest release's env with
    its ``sglang`` package replaced by the commit's (version ``0.0.0.dev0+g<commit>``)."""
    commit, release, _ = main_window.SNAPSHOTS[snapshot]
    tarball = main_window.tarball(snapshot)
    if not os.path.exists(tarball):
        why = f"NOT RUN: no snapshot {tarball}; {main_window.how_to_make()}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            session.error(why)  # CI has ../shared beside the clone: a missing snapshot is a failure
        session.skip(why)
    install_sglang(session, release)
    session.log(f"sglang {release}'s package replaced by main commit {commit} ({tarball})")
    session.run("python", os.path.join("tests", "main_window.py"), "install", tarball, commit)
    session.run("sglang-swa-plugin", "doctor", env=TEST_ENV)  # exit 1 on a fix it cannot decide
    session.run("pytest", *PYTEST_WORKERS, "-m", "not gpu", *(session.posargs or MAIN_WINDOW_TESTS),
                env={**PYTEST_ENV, "SGLANG_SWA_EXPECTED_SNAPSHOT": snapshot})


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    """A default sglang (0.5.11) with the plugin: what doctor and check say."""
    install_sglang(session, session.posargs[0] if session.posargs else DEMO_VERSION)
    session.run("sglang-swa-plugin", "doctor", env=TEST_ENV)
    session.run("sglang-swa-plugin", "check", env=TEST_ENV)


@nox.session(python="3.11")
@nox.parametrize("sglang", [nox.param(v, id=v) for v in VERSIONS])
def bench(session: nox.Session, sglang: str) -> None:
    """Benchmarks that print figures: register() cost, start-up hook cost, per-step costs.
    The ``*_gpu.py`` ones need a GPU and a GPU sglang: tests/gpu/run_on_device.sh runs them."""
    install_sglang(session, sglang)
    for script in sorted(glob.glob(os.path.join("tests", "benchmarks", "bench_*.py"))):
        if not script.endswith("_gpu.py"):
            session.run("python", script, env=TEST_ENV)


@nox.session(python="3.11", tags=["ci"])
def lint(session: nox.Session) -> None:
    """ruff's pyflakes rules over the whole tree, the GPU-only scripts included ([tool.ruff.lint]
    in pyproject.toml): an undefined name or an unused import fails here, not on a GPU."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")
