"""Tests run against the plugin as INSTALLED into an env that holds a real sglang wheel
(see noxfile.py); refuse to run them against the source tree. A run whose skips go beyond
what tests/expected_skips.py declares for the installed release fails."""

import json
import os

import pytest

import expected_skips
from helpers import _installed_plugin_path, main_window_snapshot, release_of

# Where the release-independent tests run (noxfile.CLI_VERSIONS), the marker the noxfile
# deselects on every other release.
MARKERS = ("release_independent: the plugin's own behaviour, the same on every sglang release that has the same "
           "plugin framework (run on noxfile.CLI_VERSIONS only; the statuses session checks that those hold "
           "every form of the framework)",)

_skips = []  # (nodeid, reason) of this run's skips; under xdist, the controller's (every worker's)
_KEY = pytest.StashKey[list]()  # the undeclared ones, for the summary


def pytest_configure(config):
    import pathlib

    origin = pathlib.Path(_installed_plugin_path()).resolve()
    repo = pathlib.Path(__file__).resolve().parent.parent
    assert origin.parent != repo / "sglang_swa_plugin", f"tests must run against the installed plugin, not {origin}"
    for line in MARKERS:
        config.addinivalue_line("markers", line)


def _where() -> str:
    """The main-window snapshot ("S1"...) or the release ("0.5.12") this run tests."""
    from importlib.metadata import version

    snapshot = main_window_snapshot()
    return snapshot or ".".join(map(str, release_of(version("sglang"))))


def pytest_runtest_logreport(report):
    """Every skip of the run (with xdist, each worker's report reaches the controller)."""
    if not report.skipped or hasattr(report, "wasxfail") or "gpu" in report.keywords:
        return
    if report.nodeid.startswith("tests/gpu/"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    _skips.append((report.nodeid, reason.removeprefix("Skipped: ")))


def _undeclared(session) -> list:
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller judges
        return []
    where = _where()
    out = os.environ.get("SGLANG_SWA_SKIPS_OUT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"release": where, "test": None, "reason": None}) + "\n")
            for nodeid, reason in _skips:
                f.write(json.dumps({"release": where, "test": expected_skips.key(nodeid), "reason": reason}) + "\n")
    return expected_skips.undeclared(_skips, where)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    bad = _undeclared(session)
    session.config.stash[_KEY] = bad
    if bad and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED



def pytest_terminal_summary(terminalreporter, exitstatus, config):
    bad = config.stash.get(_KEY, [])
    if not bad:
        return
    where = _where()
    terminalreporter.section(f"undeclared skips on {where}: FAILED", sep="=", red=True, bold=True)
    for nodeid, reason in bad:
        terminalreporter.line(f"{nodeid}: {reason}")
    terminalreporter.line(f"A test that may skip on {where} declares it in tests/expected_skips.py, e.g.")
    for nodeid, _ in bad:
        spec = expected_skips.spec_for(nodeid)
        terminalreporter.line(f'    "{expected_skips.base(nodeid)}": "{spec + ", " if spec else ""}{where}",')


# pytest-xdist's --dist loadfile hands out whole files, by default the files with the most
# tests first: a file of a few tests of a child process each (tens of seconds apiece) then
# comes last and one worker runs it while the other has nothing left. Under xdist (the
# noxfile's PYTEST_WORKERS: --no-loadscope-reorder) the files go out in the order given here,
# the costliest first; the order never selects or deselects a test.
COSTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xdist_costs.json")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Under an xdist worker: the files ordered by their tests' rough cost (tests/xdist_costs.json,
    seconds per test case measured on 2 cores, by ``file::function``; an unlisted test counts 0.5),
    the costliest file first; each file's tests keep their order. Every worker sorts the same
    collection the same way (xdist requires identical collections)."""
    if not hasattr(config, "workerinput"):
        return
    with open(COSTS) as f:
        costs = json.load(f)
    per_file, first = {}, {}
    for i, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        per_file[path] = per_file.get(path, 0.0) + costs.get(item.nodeid.split("[", 1)[0], 0.5)
        first.setdefault(path, i)
    items.sort(key=lambda item: (-per_file[item.nodeid.split("::", 1)[0]], first[item.nodeid.split("::", 1)[0]]))


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests: the test workers share the cores (several threads
    each would spin against each other); the count before is restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
