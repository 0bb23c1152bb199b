"""The repository's folders, as the tests reach them: the tests run from the source tree (``tests/`` in it).
Scripts and benchmarks outside ``tests/`` keep their own."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
BENCH = REPO / "bench"
DOCS = REPO / "docs"
DOCKER = REPO / "docker"


def scripts_importable() -> None:
    """``scripts/`` on ``sys.path``, so that its modules (``_drafter_common``, ``check_sglang_range``, ...) import as
    top-level modules, as the scripts import each other."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
