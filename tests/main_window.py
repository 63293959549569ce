"""The upstream main commits the ``mainwindow`` nox sessions test: make their snapshots, and
turn an env holding a real sglang release into one holding such a commit.

    python tests/main_window.py make SGLANG_CLONE [FOLDER]   # write the four snapshots
    python tests/main_window.py missing [FOLDER]             # exit 1 naming any that is absent
    python tests/main_window.py install SNAPSHOT.tar.xz COMMIT

A snapshot is ``git archive COMMIT python/sglang``, xz-compressed, named
``sglang-main-<S>-<commit[:10]>.tar.xz``, in FOLDER: ``$SGLANG_MAIN_WINDOW``, else
``shared/main-window`` beside the clone of this project (../shared/main-window from its root).
``make`` needs a full clone of sglang (``git clone https://github.com/sgl-project/sglang``:
a shallow one lacks the commits).

``install``: the installed ``site-packages/sglang/`` is replaced by the snapshot's
``python/sglang/`` and the version is set the way a source build reports it,
``0.0.0.dev0+g<commit>`` (``sglang/_version.py`` and the dist-info ``Version:`` line), then
the package is byte-compiled (imports of sglang are 3x slower without bytecode).
Standard library only: .ci/run and noxfile.py use it outside the test envs.
"""

from __future__ import annotations

import ast
import compileall
import glob
import lzma
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile

PREFIX = "python/sglang/"

# snapshot -> (commit, the release whose dependencies it runs on, {fix: the upstream form of
# its bug that the commit carries}); ../shared/main-window/README.md.
SNAPSHOTS = {
    "S1": ("afc7c9f7f369", "0.5.12", {"trtllm_swa_pool": "#25103", "frozen_kv_views": "#25103"}),
    "S2": ("a711c57a32a5", "0.5.13", {"trtllm_swa_pool": "#26966"}),
    "S3": ("92f281f856d1", "0.5.12", {"trtllm_swa_pool": "allocator", "trtllm_extend_routing": "#24566",
                                      "fa3_spec_translate": "#24617"}),
    "S4": ("365cc2ade5c9", "0.5.13", {"trtllm_swa_pool": "#25103", "frozen_kv_views": "#25103"}),
}
SGLANG_REPO = "https://github.com/sgl-project/sglang"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.environ.get("SGLANG_MAIN_WINDOW") or os.path.join(os.path.dirname(ROOT), "shared", "main-window")


def wraps(root: str = ROOT) -> dict:
    """{fix: the fixes it wraps} as hooks/ declares them (``wraps = (...)``; a module is its fix's
    name), read from the syntax trees, nothing imported."""
    out: dict = {}
    for path in glob.glob(os.path.join(root, "hooks", "*.py")):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "wraps" for t in node.targets):
                out.setdefault(os.path.basename(path)[:-3], set()).update(ast.literal_eval(node.value))
    return out


def fix_tests(links: "dict | None" = None) -> list:
    """The fixes' test files the mainwindow sessions run: those of every fix a snapshot carries,
    and of every fix whose hooks nest with theirs (``links``, default ``wraps()``: either way, over
    any number of links): those share targets with a snapshot's fix, so the snapshot's code
    reaches them too."""
    near: dict = {}
    for fix, wrapped in (wraps() if links is None else links).items():
        for other in wrapped:
            near.setdefault(fix, set()).add(other)
            near.setdefault(other, set()).add(fix)
    found, todo = set(), [fix for _, _, fixes in SNAPSHOTS.values() for fix in fixes]
    while todo:
        fix = todo.pop()
        if fix not in found:
            found.add(fix)
            todo.extend(near.get(fix, ()))
    return [os.path.join("tests", f"test_{name}.py") for name in sorted(found)]


def snapshot_of(sglang_version: str):
    """The snapshot name an installed sglang version (``0.0.0.dev0+g<commit>``) is, or None."""
    return next((name for name, (commit, _, _) in SNAPSHOTS.items() if sglang_version.endswith("+g" + commit)), None)


def tarball(snapshot: str, folder: str = FOLDER) -> str:
    return os.path.join(folder, f"sglang-main-{snapshot}-{SNAPSHOTS[snapshot][0][:10]}.tar.xz")


def how_to_make(folder: str = FOLDER) -> str:
    """The one command that makes the snapshots, for messages."""
    return (f"make them from a full sglang clone: git clone {SGLANG_REPO} /tmp/sglang && "
            f"python tests/main_window.py make /tmp/sglang {folder}  (or set SGLANG_MAIN_WINDOW to the folder "
            "that holds them)")


def make(clone: str, folder: str = FOLDER, snapshots: dict = SNAPSHOTS) -> list:
    """``git archive COMMIT python/sglang | xz`` per snapshot into ``folder``; the paths written.
    A file already there is kept (snapshots are immutable)."""
    os.makedirs(folder, exist_ok=True)
    written = []
    for name, (commit, _, _) in snapshots.items():
        path = os.path.join(folder, f"sglang-main-{name}-{commit[:10]}.tar.xz")
        if os.path.exists(path):
            continue
        git = subprocess.run(["git", "-C", clone, "archive", "--format=tar", commit, PREFIX.rstrip("/")],
                             capture_output=True)
        if git.returncode != 0:
            raise SystemExit(f"git archive {commit} failed in {clone}: {git.stderr.decode().strip()} "
                             f"(a full clone of {SGLANG_REPO} holds the commit; run 'git -C {clone} fetch origin')")
        with lzma.open(path + ".part", "wb") as out:
            out.write(git.stdout)
        os.replace(path + ".part", path)
        written.append(path)
    return written


def missing(folder: str = FOLDER) -> list:
    return [tarball(s, folder) for s in SNAPSHOTS if not os.path.exists(tarball(s, folder))]


def install(tarball_path: str, commit: str) -> str:
    site = sysconfig.get_paths()["purelib"]
    target = os.path.join(site, "sglang")
    shutil.rmtree(target, ignore_errors=True)
    with tarfile.open(tarball_path) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(PREFIX) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = "sglang/" + m.name[len(PREFIX):]
        tar.extractall(site, members=members, filter="data")
    version = f"0.0.0.dev0+g{commit}"
    with open(os.path.join(target, "_version.py"), "w") as f:
        f.write(f"__version__ = version = {version!r}\n__version_tuple__ = version_tuple = (0, 0, 0, 'dev0', 'g{commit}')\n"
                f"__commit_id__ = commit_id = {commit!r}\n")
    for meta in glob.glob(os.path.join(site, "sglang-*.dist-info", "METADATA")):
        with open(meta) as f:
            text = f.read()
        # A new file, never a write in place: installers hard-link wheel files from their cache.
        with open(meta + ".new", "w") as f:
            f.write(re.sub(r"(?m)^Version: .*$", f"Version: {version}", text, count=1))
        os.replace(meta + ".new", meta)
    compileall.compile_dir(target, quiet=1, workers=0)
    return version


def main(argv: list) -> int:
    if argv[:1] == ["make"] and len(argv) in (2, 3):
        for path in make(*argv[1:]):
            print("wrote", path)
        return 0
    if argv[:1] == ["missing"] and len(argv) in (1, 2):
        absent = missing(*argv[1:])
        for path in absent:
            print("missing main-window snapshot:", path)
        if absent:
            print(how_to_make(*argv[1:]))
        return 1 if absent else 0
    if argv[:1] == ["install"] and len(argv) == 3:
        print("sglang", install(*argv[1:]))
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
