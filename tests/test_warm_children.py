"""A child forked from the warm interpreter (tests/warm_children.py) shows what a fresh one shows:
the same output, exit status, argv, path, environment and working directory, for ``-c`` and
``-m``, on success, ``sys.exit``, an uncaught exception and a crash. Each case runs both ways and
the forked one is checked to have been forked (else this would compare fresh with fresh)."""

import json
import sys
import textwrap

import pytest

import warm_children
from helpers import child_env

pytestmark = pytest.mark.release_independent  # Python's process model, not sglang's

PROBE = textwrap.dedent("""
    import atexit, json, os, subprocess, sys
    from importlib.metadata import entry_points
    atexit.register(lambda: print("atexit ran", flush=True))
    print(json.dumps({
        "argv": sys.argv, "name": __name__, "cwd": os.getcwd(),
        "path": [p.replace(os.getcwd(), "CWD") for p in sys.path],
        "env": {k: os.environ.get(k) for k in ("SGLANG_SWA_PLUGIN", "PYTHONPATH", "PROBE_ONLY")},
        "stdin": sys.stdin.read(),
        "sglang_imported": any(m.split(".")[0] == "sglang" for m in sys.modules),
        "plugins": sorted(e.name for e in entry_points(group="probe.group")),
        "subprocess_rc": subprocess.run([sys.executable, "-c", "raise SystemExit(7)"]).returncode,
    }))
    print("to stderr", file=sys.stderr)
""")


def both(argv, tmp_path, **extra):
    """(fresh, forked) results of ``python ARGV`` with child_env(**extra), in tmp_path."""
    env, base = child_env(**extra), child_env()
    with pytest.MonkeyPatch.context() as m:
        m.setenv("SWA_TESTS_FRESH_CHILDREN", "1")
        fresh = warm_children.run(argv, env=env, base_env=base, cwd=str(tmp_path), timeout=120)
    forked = warm_children.run(argv, env=env, base_env=base, cwd=str(tmp_path), timeout=240)
    assert not fresh.warm and forked.warm
    return fresh, forked


def entry_point_dist(tmp_path):
    site = tmp_path / "site"
    info = site / "probe_dist-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: probe-dist\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[probe.group]\nprobe = probe_mod:run\n")
    (site / "probe_mod.py").write_text(textwrap.dedent("""
        import sys
        print("module", __name__, sys.argv[1:], sys.path[0] == __import__("os").getcwd())
        if sys.argv[1:] == ["fail"]:
            raise SystemExit("bad argument")
    """))
    return str(site)


def test_a_forked_c_child_shows_what_a_fresh_one_shows(tmp_path):
    site = entry_point_dist(tmp_path)
    fresh, forked = both(["-c", PROBE, "a1"], tmp_path, SGLANG_SWA_PLUGIN="0", PYTHONPATH=site)
    assert fresh.returncode == 0, fresh.stderr
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    seen = json.loads(fresh.stdout.splitlines()[0])
    assert seen["argv"] == ["-c", "a1"] and seen["plugins"] == ["probe"] and seen["subprocess_rc"] == 7
    assert seen["env"]["SGLANG_SWA_PLUGIN"] == "0" and not seen["sglang_imported"]


def test_exit_statuses_and_tracebacks_are_a_fresh_ones(tmp_path):
    for code in ("raise SystemExit(3)", "import sys; sys.exit('a message')", "raise ValueError('boom')",
                 "import sys; sys.exit(256 + 4)"):
        fresh, forked = both(["-c", code], tmp_path)
        assert forked.returncode == fresh.returncode != 0, code
        assert forked.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:], code


def test_a_forked_m_child_runs_the_module_as_main(tmp_path):
    site = entry_point_dist(tmp_path)
    for args in (["x", "y"], ["fail"]):
        fresh, forked = both(["-m", "probe_mod", *args], tmp_path, PYTHONPATH=site)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.returncode == 1 and fresh.stdout == "module __main__ ['fail'] True\n"


def test_a_crash_and_a_timeout_are_reported(tmp_path):
    import subprocess

    _, forked = both(["-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], tmp_path)
    assert forked.returncode != 0 and "without an exit status" in forked.stderr
    with pytest.raises(subprocess.TimeoutExpired):
        warm_children.run(["-c", "import time; time.sleep(60)"], env=child_env(), base_env=child_env(),
                          cwd=str(tmp_path), timeout=2)


def test_what_could_differ_runs_fresh(tmp_path):
    env = child_env()
    assert not warm_children.run(["-S", "-c", "pass"], env=env, base_env=env, cwd=str(tmp_path), timeout=60).warm
    other = child_env(TRITON_INTERPRET="1")
    assert not warm_children.run(["-c", "pass"], env=other, base_env=env, cwd=str(tmp_path), timeout=60).warm
    assert sys.executable  # the fresh ones run this interpreter


def test_a_plugin_build_first_on_the_path_is_the_one_a_forked_child_starts_with(tmp_path):
    """The plugin's .pth import runs in each child under its own sys.path: a copy of the plugin
    on PYTHONPATH is the one imported (test_registration's missing-fix build), finder and all."""
    from helpers import copy_dist

    site = tmp_path / "site"
    copy_dist("sglang-swa-plugin", site)
    code = ("import sys, sglang_swa_plugin\n"
            "print(sglang_swa_plugin.__file__, [type(f).__module__ for f in sys.meta_path if 'swa' in type(f).__module__])")
    fresh, forked = both(["-c", code], tmp_path, PYTHONPATH=str(site))
    assert fresh.stdout.startswith(str(site)) and "sglang_swa_plugin._autoload" in fresh.stdout, fresh.stdout + fresh.stderr
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_children_run_fresh_where_the_warm_interpreter_does_not_start(tmp_path, monkeypatch):
    monkeypatch.setattr(warm_children, "_ZYGOTE", "raise SystemExit(1)")
    monkeypatch.setattr(warm_children, "_zygote", None)
    proc = warm_children.run(["-c", "print('hi')"], env=child_env(), base_env=child_env(), cwd=str(tmp_path), timeout=60)
    assert not proc.warm and (proc.returncode, proc.stdout) == (0, "hi\n")
