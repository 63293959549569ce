"""Start-up hook for sglang releases without a plugin framework (0.5.10 and older).

The wheel installs ``sglang_swa_plugin_autoload.pth`` into site-packages; Python runs its
one line (``import sglang_swa_plugin._autoload``) at every interpreter start. All this
module does then is put a finder on ``sys.meta_path`` that waits for sglang's model runner
module to be imported (every process that builds attention backends imports it, the
spawned scheduler included). When that import completes, and only if this sglang lacks
``sglang.srt.plugins``, it applies the plugin exactly as ``register()`` does. On sglang
>= 0.5.11 it does nothing: sglang itself loads the plugin through its entry point.

A process that never imports sglang pays for importing this file and nothing else: the
settings are read only when the trigger fires, by the plugin's one settings parser
(``sglang_swa_plugin.config``); ``SGLANG_SWA_PLUGIN=0`` (or any value it reads as off) keeps
the hook inert. To remove it, ``pip uninstall sglang-swa-plugin``
(the .pth file is part of the installed files and goes with them).
"""

import sys

TRIGGER = "sglang.srt.model_executor.model_runner"


def _activate() -> None:
    """Apply the plugin; whatever goes wrong is logged, never raised into sglang's import."""
    import importlib.util

    try:
        if importlib.util.find_spec("sglang.srt.plugins") is not None:
            return  # sglang's own loader will call register() through the entry point
    except Exception:  # noqa: BLE001
        return
    try:
        from sglang_swa_plugin import config

        if not config.get().enabled:
            return
        from sglang_swa_plugin.startup import register

        register("start-up hook")
    except Exception:  # noqa: BLE001 - e.g. a dependency missing: the scheduler must still start
        import logging

        logging.getLogger("sglang.srt.plugins.swa_plugin").exception(
            "sglang-swa-plugin: the start-up hook could not load the plugin; nothing is installed")


class _Finder:
    """Meta-path finder that fires once, after ``TRIGGER`` has been executed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TRIGGER:
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        import importlib.util

        try:
            spec = importlib.util.find_spec(fullname)
        except Exception:  # noqa: BLE001 - let the import system report it as usual
            return None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_activate(module):
            exec_module(module)
            _activate()

        spec.loader.exec_module = exec_then_activate
        return spec


def disarm() -> None:
    """Remove the finder (``check``/``doctor`` must see sglang without our fixes)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
