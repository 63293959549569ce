"""Moved to ``sglang_swa_plugin.selftest.targets.readout`` (the readout targets' shared pieces,
which ``sglang-swa-plugin selftest`` builds its targets from). This name stays for the GPU
harness, which runs with tests/gpu on sys.path: ``import readout`` is that very module."""

import sys

from sglang_swa_plugin.selftest.targets import readout as _moved

sys.modules[__name__] = _moved
