"""``sglang-kimi drafter compare`` end to end on CPU: the tiny target served with its matched DFlash drafter and
with the mismatched one (trained for another checkpoint of the target, as a Kimi-K2.5 drafter is for Kimi-K2.6),
the same prompts (the embedded GSM8K questions and a chat set) through each, tau by tree budget, acceptance by
depth and the best budget per concurrency from the shipped Kimi-K2.6 H200 step costs. The matched drafter must
accept more, measured: at every budget above 0, and at the first draft."""

from __future__ import annotations

import json

import pytest
from support.paths import BENCH

from sglang_kimi.assets import DEMO_QUESTIONS, TINY_DFLASH, TINY_K25_DFLASH, TINY_MODEL
from sglang_kimi.cli import main as cli

pytestmark = pytest.mark.e2e
COSTS = BENCH / "data" / "costs" / "kimi-k2.6-h200-tp8-projected.step_costs.json"


def test_the_matched_drafter_accepts_more_than_the_mismatched_one(tmp_path, capsys):
    chat = tmp_path / "chat.jsonl"
    chat.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": q}]}) for q in (
        "Tom has 3 apples and buys 5 more. How many apples does he have?",
        "A train travels 60 miles in 2 hours. What is its speed?",
    )))  # fmt: skip
    out = tmp_path / "compare"
    args = ["drafter", "compare", "--target", str(TINY_MODEL), "--drafter", f"matched={TINY_DFLASH}",
            "--drafter", f"mismatched={TINY_K25_DFLASH}", "--prompts", f"gsm8k={DEMO_QUESTIONS}",
            "--prompts", f"chat={chat}", "--num-prompts", "3", "--max-tokens", "48", "--budget", "8",
            "--step-costs", str(COSTS), "--out", str(out), "--", "--attention-backend", "kimi_cpu"]  # fmt: skip
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "drafter_compare.json").read_text())
    assert (out / "drafter_compare.png").stat().st_size > 10_000
    matched, mismatched = (data["drafters"][n]["all"] for n in ("matched", "mismatched"))
    print(printed)
    assert data["prompts"] == {"gsm8k": 3, "chat": 2}
    for b in ("1", "2", "4", "8"):
        assert matched["tau_by_budget"][b] > mismatched["tau_by_budget"][b], b
    assert matched["accepted_by_depth"][0] > mismatched["accepted_by_depth"][0]
    assert set(data["drafters"]["matched"]["prompt_sets"]) == {"gsm8k", "chat"}
    best = data["drafters"]["matched"]["best_budget_by_concurrency"]
    assert set(best) == {"1", "2", "4", "8", "16", "32", "64"} and all(v["budget"] in (0, 8) for v in best.values())
    assert "best tree budget per concurrency" in printed and "mismatched" in printed
