"""sglang-swa-plugin: makes hybrid sliding-window-attention models work with speculative
decoding on sglang releases whose attention backends mix up the full-pool and SWA-pool
index spaces. sglang (>= 0.5.11) loads it through the ``sglang.srt.plugins`` entry point
and calls :func:`register` in every process that builds attention backends."""

__version__ = "0.1.0"


def register() -> None:
    """Called by sglang's ``load_plugins()``. Idempotent, cheap, never raises."""
    try:
        from .startup import register as _register
    except Exception:  # noqa: BLE001 - e.g. a dependency missing: sglang must still start
        import logging

        logging.getLogger("sglang.srt.plugins.swa_plugin").exception(
            "sglang-swa-plugin: cannot load the plugin; nothing is installed")
        return
    _register("entry point")


def status() -> dict:
    """What actually took effect in this process: per fix its status, reason, upstream
    PRs and whether its hooks are in effect right now."""
    from .startup import status as _status

    return _status()


__all__ = ["register", "status", "__version__"]
