"""The repository's offline data: GSM8K (``data/gsm8k``, MIT), read by the tests."""

from __future__ import annotations

import json

from support.paths import REPO

GSM8K_DIR = REPO / "data" / "gsm8k"


def gsm8k_items(split: str, limit: int | None = None) -> list[dict]:
    """The first ``limit`` items (``question``, ``answer``) of ``data/gsm8k/{split}.jsonl``."""
    with open(GSM8K_DIR / f"{split}.jsonl") as f:
        items = [json.loads(line) for line in f if line.strip()]
    return items[:limit]
