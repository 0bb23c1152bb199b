#!/usr/bin/env python
"""The matched-drafter recipe (docs/drafters.md) end to end on the embedded tiny target, on CPU, and the drafters
it compares: the shipped matched drafter, the mismatched one (trained for another checkpoint of the target, as the
Kimi-K2.5 drafter is for Kimi-K2.6), and one trained here from the served target's answers.

    python bench/bench_matched_drafter.py              # 512 rows, 3 minutes of training: bench/results/drafter_compare
    python bench/bench_matched_drafter.py --rows 64 --minutes 0.5 --out /tmp/compare   # a quick run

Steps:
1. serve the tiny target (`sglang-kimi serve`'s launcher, autoregressive);
2. `drafter regenerate`: ``--rows`` GSM8K *train* questions answered by it, greedily, as SpecForge's conversation
   rows;
3. `scripts/train_drafters.py --data`: the mismatched drafter fine-tuned on them for ``--minutes`` (the warm start
   SpecForge's ``model.draft_checkpoint_path`` gives), written as SpecForge's training checkpoint;
4. SpecForge's own `export --to hf` (in its environment: ``sglang_kimi.drafters.specforge_env``) reads the
   checkpoint back and writes the served folder;
5. `drafter compare` of the three on the embedded GSM8K questions and ``bench/data/chat_prompts.jsonl``, as trees of
   ``--budget``, with the best budget per concurrency from the shipped Kimi-K2.6 H200 step costs.

Writes ``drafter_compare.json`` (with a ``trained`` section: the data, the training report, the commands' settings)
and ``drafter_compare.png`` to ``--out``. tau does not depend on the hardware; the seconds are CPU wall time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from sglang_kimi.assets import DEMO_QUESTIONS, TINY_DFLASH, TINY_K25_DFLASH, TINY_MODEL
from sglang_kimi.drafters import compare, specforge_env
from sglang_kimi.drafters.regenerate import Sampling, regenerate
from sglang_kimi.launcher.server import ANY_PORT, ServerProcess, launch_command
from sglang_kimi.speculative.adaptive.profile import read_step_costs

CHAT_PROMPTS = REPO / "bench" / "data" / "chat_prompts.jsonl"
STEP_COSTS = REPO / "bench" / "data" / "costs" / "kimi-k2.6-h200-tp8-projected.step_costs.json"
GSM8K_TRAIN = REPO / "data" / "gsm8k" / "train.jsonl"
SERVER_ARGS = ["--attention-backend", "kimi_cpu"]


def relative(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def regenerate_rows(work: Path, rows: int, max_tokens: int) -> tuple[Path, float]:
    out = work / "regenerated.jsonl"
    start = time.time()
    with ServerProcess(launch_command(SERVER_ARGS, port=ANY_PORT), work / "target.log") as server:
        server.wait_ready(1800)
        summary = regenerate(GSM8K_TRAIN, out, [server.base_url], Sampling(max_tokens=max_tokens, temperature=0.0),
                             concurrency=8, limit=rows)  # fmt: skip
    print(f"regenerated: {summary}", flush=True)
    return out, time.time() - start


def train(work: Path, data: Path, minutes: float, timeout: float | None = None) -> tuple[Path, dict]:
    """The mismatched drafter fine-tuned on ``data`` by ``scripts/train_drafters.py``: (its SpecForge checkpoint
    folder, the training report)."""
    checkpoint = work / "specforge-checkpoint"
    report = work / "training.json"
    command = [sys.executable, str(REPO / "scripts" / "train_drafters.py"), "--only", "dflash", "--data", str(data),
               "--init-from", str(TINY_K25_DFLASH), "--minutes", str(minutes), "--out-dir", str(work),
               "--dflash-name", "published", "--specforge-checkpoint", str(checkpoint), "--tau-prompts", "0",
               "--report", str(report)]  # fmt: skip
    subprocess.run(command, check=True, timeout=timeout)
    return checkpoint, json.loads(report.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=512, help="GSM8K train questions the target answers")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per regenerated answer")
    ap.add_argument("--minutes", type=float, default=3.0, help="training wall time")
    ap.add_argument("--budget", type=int, default=32, help="the widest tree budget compared")
    ap.add_argument("--compare-max-tokens", type=int, default=96)
    ap.add_argument("--gsm8k-prompts", type=int, default=5, help="embedded GSM8K questions compared")
    ap.add_argument("--work", type=Path, help="folder for the data and the trained drafter (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "drafter_compare")
    args = ap.parse_args()

    work = args.work or Path(tempfile.mkdtemp(prefix="matched-drafter-"))
    work.mkdir(parents=True, exist_ok=True)
    data, regenerate_seconds = regenerate_rows(work, args.rows, args.max_tokens)
    checkpoint, training = train(work, data, args.minutes)
    trained = specforge_env.export("hf", checkpoint / "training_state.pt", checkpoint / "draft_config.json",
                                   work / "specforge-export")  # fmt: skip
    prompt_sets = {"gsm8k": compare.load_prompt_set(DEMO_QUESTIONS, args.gsm8k_prompts),
                   "chat": compare.load_prompt_set(CHAT_PROMPTS, None)}  # fmt: skip
    drafters = {"matched": TINY_DFLASH, "mismatched": TINY_K25_DFLASH, "trained": trained}
    costs = read_step_costs(STEP_COSTS).seconds["tree"]
    result = compare.compare(relative(TINY_MODEL), {k: str(v) for k, v in drafters.items()}, prompt_sets,
                             budget=args.budget, max_tokens=args.compare_max_tokens, server_args=SERVER_ARGS,
                             step_costs=costs, log_dir=work / "compare")  # fmt: skip
    for entry in result["drafters"].values():
        entry["path"] = relative(entry["path"])
    result.pop("logs", None)
    dflash = training["dflash"]
    result["trained"] = {
        "recipe": "bench/bench_matched_drafter.py",
        "data": {"source": relative(GSM8K_TRAIN), "rows": args.rows, "max_tokens": args.max_tokens,
                 "temperature": 0.0, "sequences": training["num_sequences"],
                 "answer_tokens": training["num_generated_tokens"], "regenerate_seconds": round(regenerate_seconds)},
        "init_from": relative(TINY_K25_DFLASH),
        "training": {"minutes": args.minutes, "steps": dflash["steps"], "final": dflash["final"]},
        "export": "specforge " + specforge_env.VERSION + " export --to hf",
    }  # fmt: skip
    compare.print_tables(result)
    for path in compare.write(result, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
