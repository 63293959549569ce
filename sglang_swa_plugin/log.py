"""The plugin's log lines, in sglang's own log stream.

Our logger (``sglang.srt.plugins.swa_plugin``) has no handler of its own: lines propagate
to the handlers sglang configures, with its format and rank prefix (``[time TP0] ...``).
sglang's plugin loader runs before ``configure_logger`` in each scheduler process: lines
emitted before logging is set up to show them are held back and emitted, once, right after
sglang's ``configure_logger`` has run (or, should it never run, at interpreter exit).
"""

from __future__ import annotations

import atexit
import logging
import sys
from typing import Any, List, Tuple

logger = logging.getLogger("sglang.srt.plugins.swa_plugin")

CONFIGURE_LOGGER = "sglang.srt.utils.common.configure_logger"

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


def flush() -> None:
    """Emit the lines held back (in order)."""
    held = list(_pending)
    _pending.clear()
    for level, msg, args in held:
        logger.log(level, msg, *args)


def _flush_after(original, *args, **kwargs):
    """Around ``configure_logger``: emit the held-back lines through the handlers it set."""
    try:
        return original(*args, **kwargs)
    finally:
        flush()


def hook_configure_logger() -> None:
    """Before sglang has configured logging, have the held-back lines emitted when it does. Imports nothing:
    only a ``configure_logger`` already loaded (sglang's plugin loader and model runner both
    load it) is hooked, once per process, directly (in effect at once, whether or not sglang
    applies plugin hooks later; other hooks on it wrap ours)."""
    from .patching import DirectHooks

    global _hooked
    if _hooked or _configured() or CONFIGURE_LOGGER.rpartition(".")[0] not in sys.modules:
        return
    _hooked = True
    try:
        DirectHooks("log").around(CONFIGURE_LOGGER, _flush_after)
    except Exception as e:  # noqa: BLE001 - the lines still come at exit
        emit(logging.WARNING, "sglang-swa-plugin: cannot hook %s (%s): start-up lines come at exit", CONFIGURE_LOGGER, e)
