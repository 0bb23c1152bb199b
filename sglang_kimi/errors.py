"""The plugin's errors that more than one area raises or reports (a leaf module: imports nothing of the plugin).

Errors of one area stay in it: ``launcher.checks.LaunchError`` (a server that cannot be started),
``evals.errors.EvalError`` (the eval and bench commands' bad input).
"""

from __future__ import annotations

import sys


class SpeculativeConfigError(ValueError):
    """A speculative decoding setting that cannot be served; the message names the values and the fix."""


def command_failed(message: str, code: int = 2) -> int:
    """Print a ``sglang-kimi`` command's one-line error on stderr; return its exit code (2: bad input)."""
    print(f"sglang-kimi: error: {message}", file=sys.stderr)
    return code
