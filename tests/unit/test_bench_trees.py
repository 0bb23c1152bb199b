"""``bench/bench_trees.py`` runs end to end on a small vocabulary: both builders give the same trees, and it writes
its JSON and PNG where ``--output`` says."""

from __future__ import annotations

import json
import subprocess
import sys

from support.paths import BENCH


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
        "--rank-batch-sizes",
        "1,3",
        "--rank-budgets",
        "4,40",
        "--rank-vocab",
        "20000",
    ]
    command = [sys.executable, str(BENCH / "bench_trees.py"), *sizes, "--output", str(output)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(output.read_text())
    rows = report["results"]
    assert [(r["batch_size"], r["budget"]) for r in rows] == [(1, 4), (1, 9), (5, 4), (5, 9)]
    assert all(r["same_trees"] for r in rows), rows
    assert all(r["batched_median_ms"] > 0 and r["heap_median_ms"] > 0 for r in rows)
    assert output.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ranking = report["ranking"]
    assert [(r["batch_size"], r["k"]) for r in ranking] == [(1, 4), (1, 40), (3, 4), (3, 40)]
    assert all(r["same_ids_as_whole_row_keys"] for r in ranking), ranking
    # in place the ranking allocates only its survivors' keys (96 of 20000 at K = 40); whole-row keys 20 bytes a logit
    assert all(r["peak_bytes_per_logit"]["ranking_overwrite"] < 1 < r["peak_bytes_per_logit"]["keys"] for r in ranking)
    assert (tmp_path / "trees_ranking.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "speedup" in done.stdout
