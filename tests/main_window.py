"""Turn an env holding a real sglang release into one holding an upstream main commit.

    python tests/main_window.py SNAPSHOT.tar.xz COMMIT

``SNAPSHOT.tar.xz`` is ``git archive COMMIT python/sglang`` (../shared/main-window/, see its
README). The installed ``site-packages/sglang/`` is replaced by the snapshot's
``python/sglang/`` and the version is set the way a source build reports it,
``0.0.0.dev0+g<commit>`` (``sglang/_version.py`` and the dist-info ``Version:`` line), then
the package is byte-compiled (imports of sglang are 3x slower without bytecode).
"""

from __future__ import annotations

import compileall
import glob
import os
import re
import shutil
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


def snapshot_of(sglang_version: str):
    """The snapshot name an installed sglang version (``0.0.0.dev0+g<commit>``) is, or None."""
    return next((name for name, (commit, _, _) in SNAPSHOTS.items() if sglang_version.endswith("+g" + commit)), None)


def install(tarball: str, commit: str) -> str:
    site = sysconfig.get_paths()["purelib"]
    target = os.path.join(site, "sglang")
    shutil.rmtree(target, ignore_errors=True)
    with tarfile.open(tarball) as tar:
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


if __name__ == "__main__":
    print("sglang", install(sys.argv[1], sys.argv[2]))
