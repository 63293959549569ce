"""Built-in fixes, one module per upstream bug. Installed as ``sglang_swa_plugin.hooks``.

Each module starts with its record (the bug, upstream PRs, affected versions, how it is
detected, when it can be deleted) and defines ``FIX``. The core finds every module here by
name (``sglang_swa_plugin.core.BUILTIN_MODULES``) and installs the fixes in the order their
``Fix.wraps`` give.
"""
