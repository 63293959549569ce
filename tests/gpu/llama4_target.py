"""Moved to ``sglang_swa_plugin.selftest.targets.llama4`` (the Llama 4 chunk target, which
``sglang-swa-plugin selftest`` builds). This name stays for the GPU harness, which runs with
tests/gpu on sys.path: ``import llama4_target`` is that very module, and
``python tests/gpu/llama4_target.py`` runs its checks as before."""

import sys

from sglang_swa_plugin.selftest.targets import llama4 as _moved

if __name__ == "__main__":  # the harness's settings come from its environment
    import os

    _moved.main(seeds=os.environ.get("PROMPT_SEEDS", "1,2,3"), threads=int(os.environ.get("CHECK_THREADS", "6")))
else:
    sys.modules[__name__] = _moved
