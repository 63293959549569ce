"""Moved to ``sglang_swa_plugin.selftest.targets.gemma4`` (the Gemma 4 window target, which
``sglang-swa-plugin selftest`` builds). This name stays for the GPU harness, which runs with
tests/gpu on sys.path: ``import gemma4_target`` is that very module, and
``python tests/gpu/gemma4_target.py`` runs its checks as before."""

import sys

from sglang_swa_plugin.selftest.targets import gemma4 as _moved

if __name__ == "__main__":  # the harness's settings come from its environment
    import os

    _moved.main(seeds=os.environ.get("PROMPT_SEEDS", "1,2,3"), threads=int(os.environ.get("CHECK_THREADS", "6")))
else:
    sys.modules[__name__] = _moved
