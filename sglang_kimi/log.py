"""The plugin's logger, and the one way to log a warning once per process (a leaf module)."""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_kimi")

_warned: set[str] = set()


def warn_once(key: str, message: str, *args) -> None:
    """Log ``message % args`` as a warning the first time ``key`` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)
