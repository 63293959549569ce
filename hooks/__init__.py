"""Built-in fixes, one module per upstream bug. Installed as ``sglang_swa_plugin.hooks``.

Each module starts with its record (the bug, upstream PRs, affected versions, how it is
detected, when it can be deleted), exposes ``FIX`` and a pluggy ``sglang_swa_plugin_fixes``
hook implementation. The core lists them in ``sglang_swa_plugin.core.BUILTIN_MODULES``.
"""
