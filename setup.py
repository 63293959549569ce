"""All metadata is in pyproject.toml. This file only adds the start-up hook for sglang
without a plugin framework: ``sglang_swa_plugin/autoload.pth`` is installed at the root of
site-packages as ``sglang_swa_plugin_autoload.pth`` (see sglang_swa_plugin/_autoload.py),
by a wheel and by an editable install alike."""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_SOURCE = os.path.join("sglang_swa_plugin", "autoload.pth")
PTH_NAME = "sglang_swa_plugin_autoload.pth"


class build_py_with_pth(build_py):
    """build_py, plus the .pth file next to the packages (the wheel's root). An editable
    install does not ship what build_py builds, so there it goes straight to the root of
    the editable wheel (the ``install`` command's ``install_lib``)."""

    def _pth_target(self) -> str:
        root = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        return os.path.join(root, PTH_NAME)

    def run(self) -> None:
        if not self.editable_mode:  # build/lib is reused between builds: no stale module may ship
            shutil.rmtree(os.path.join(self.build_lib, "sglang_swa_plugin"), ignore_errors=True)
        super().run()
        self.copy_file(PTH_SOURCE, self._pth_target(), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [self._pth_target()]


setup(cmdclass={"build_py": build_py_with_pth})
