"""A Hugging Face hub cache laid out on disk as ``huggingface_hub`` reads it, for tests that run offline."""

from __future__ import annotations

import shutil
from pathlib import Path

COMMIT = "0" * 40


def cache_snapshot(cache: Path, repo_id: str, files: list[Path]) -> Path:
    """``repo_id`` at ``main`` in the hub cache ``cache``, holding copies of ``files``; returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for file in files:
        shutil.copy(file, snapshot / file.name)
    return snapshot
