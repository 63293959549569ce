"""The plugin's log lines, in sglang's own log stream.

Our logger (``sglang.srt.plugins.swa_plugin``) has no handler of its own: lines propagate
to the handlers sglang configures, with its format and rank prefix (``[time TP0] ...``).
sglang's plugin loader runs before ``configure_logger`` in each scheduler process: lines
emitted before logging is set up to show them are held back and emitted, once, right after
logging is configured (sglang's ``configure_logger`` calls ``logging.basicConfig``), or,
should that never happen, at interpreter exit.
"""

from __future__ import annotations

import atexit
import logging
from typing import Any, List, Tuple

logger = logging.getLogger("sglang.srt.plugins.swa_plugin")

_pending: List[Tuple[int, str, Tuple[Any, ...]]] = []
_hooked = False
_at_exit = False


def _configured() -> bool:
    """Logging is set up to show our INFO lines (a handler set up at import time at the
    default WARNING level, as some sglang releases have, does not count)."""
    return logger.hasHandlers() and logger.isEnabledFor(logging.INFO)


def emit(level: int, msg: str, *args: Any) -> None:
    """Log now when logging is configured, else once it is (order is kept)."""
    if not _pending and _configured():
        logger.log(level, msg, *args)
        return
    global _at_exit
    if not _at_exit:
        _at_exit = True
        atexit.register(flush)
    _pending.append((level, msg, args))


WARNED: set = set()  # (fix, path) pairs already named in the log


def warn_once(fix: str, path: str, consequence: str) -> None:
    """One warning per process, fix and path: a path ``fix`` leaves as sglang runs it, and what
    that means for the tokens."""
    if (fix, path) not in WARNED:
        WARNED.add((fix, path))
        logger.warning("sglang-swa-plugin: %s: %s: %s; not corrected", fix, path, consequence)


def flush() -> None:
    """Emit the lines held back (in order)."""
    held = list(_pending)
    _pending.clear()
    for level, msg, args in held:
        logger.log(level, msg, *args)


def _flushing(owner: Any, name: str, original: Any) -> Any:
    """``original`` (a logging set-up function), then the held-back lines (at the level the
    set-up chose: ``--log-level warning`` still shows an ERROR line); the first such call puts
    every original back (unless someone wrapped ours since)."""

    def configure(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            if logger.hasHandlers():  # configured now, at the level the operator chose
                _unhook()
                flush()

    configure.__wrapped__ = original
    return configure


_wrapped: List[Tuple[Any, str, Any]] = []


def _unhook() -> None:
    for owner, name, wrapper in _wrapped:
        if getattr(owner, name, None) is wrapper:
            setattr(owner, name, wrapper.__wrapped__)
    _wrapped.clear()


def hook_configure_logger() -> None:
    """Before logging is configured, have the held-back lines emitted when it is. sglang's
    ``configure_logger`` (every process, after the plugin loader) sets logging up through
    ``logging.basicConfig(force=True)``, or ``logging.config.dictConfig`` with
    ``SGLANG_LOGGING_CONFIG_PATH``: both are wrapped, once per process, until the first call
    that makes our lines show. Attribute swaps on two stdlib modules: nothing is scanned and
    nothing of sglang is imported or patched."""
    import logging.config

    global _hooked
    if _hooked or _configured():
        return
    _hooked = True
    for owner, name in ((logging, "basicConfig"), (logging.config, "dictConfig")):
        wrapper = _flushing(owner, name, getattr(owner, name))
        setattr(owner, name, wrapper)
        _wrapped.append((owner, name, wrapper))
