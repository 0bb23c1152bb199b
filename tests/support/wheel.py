"""The plugin's wheel, built from a copy of the working tree (setuptools reuses a ``build/`` folder, where a module
deleted since the last build would still be found and packed)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from support.paths import REPO

NOT_COPIED = (
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".ruff_cache",
)


def build_wheel(scratch: Path) -> Path:
    """Build ``sglang_kimi-*.whl`` under ``scratch`` (a fresh folder) and return its path."""
    source = scratch / "sglang-kimi"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*NOT_COPIED))
    out = scratch / "wheel"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (path,) = out.glob("sglang_kimi-*.whl")
    return path
