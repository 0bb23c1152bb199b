"""``bench/bench_trees.py`` runs end to end on a small vocabulary: both builders give the same trees, and it writes
its JSON and PNG where ``--output`` says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_trees_writes_json_and_png_with_same_trees(tmp_path):
    output = tmp_path / "trees.json"
    sizes = [
        "--batch-sizes",
        "1,5",
        "--budgets",
        "4,9",
        "--vocab",
        "300",
        "--length",
        "4",
        "--repeats",
        "1",
        "--devices",
        "cpu",
    ]
    command = [sys.executable, str(REPO / "bench" / "bench_trees.py"), *sizes, "--output", str(output)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(output.read_text())
    rows = report["results"]
    assert [(r["batch_size"], r["budget"]) for r in rows] == [(1, 4), (1, 9), (5, 4), (5, 9)]
    assert all(r["same_trees"] for r in rows), rows
    assert all(r["batched_median_ms"] > 0 and r["heap_median_ms"] > 0 for r in rows)
    assert output.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "speedup" in done.stdout
