#!/usr/bin/env python
"""Make the mismatched DFlash drafter: a drafter trained for another checkpoint of the tiny target.

    python scripts/make_mismatched_drafter.py          # sglang_kimi/assets/tiny-kimi-k2.5-dflash/

It reproduces in miniature a drafter trained for Kimi-K2.5 served on Kimi-K2.6: the matched drafter
(``train_drafters.py``'s recipe) fine-tuned for a few minutes on another checkpoint, i.e. regenerated text, teacher
features and the frozen embedding / LM head of a perturbed copy of the embedded target (every weight moved by
0.5 x its standard deviation x seeded noise; teacher-forced, its greedy argmax agrees with the real target's on
about two tokens in three). Served on the real target, the drafter's acceptance falls steeply with the draft
position, and its config declares ``target_model:
tiny-kimi-k2.5`` so the pairing warning at start-up says it was trained for another release.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ARGS = [
    "--only", "dflash",
    "--perturb-target", "0.5",
    "--dflash-name", "tiny-kimi-k2.5-dflash",
    "--declared-target", "tiny-kimi-k2.5",
    "--init-from", str(REPO / "sglang_kimi" / "assets" / "tiny-kimi-k2.6-dflash"),
    "--prompts", "400",
    "--minutes", "4",
    "--report", str(REPO / "bench" / "results" / "bench_tau_training_mismatched.json"),
]  # fmt: skip


if __name__ == "__main__":
    sys.exit(subprocess.call([sys.executable, str(REPO / "scripts" / "train_drafters.py"), *ARGS, *sys.argv[1:]]))
