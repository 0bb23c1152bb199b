"""The matched-drafter recipe end to end on CPU, and ``sglang-kimi drafter compare`` over its result.

1. ``sglang-kimi drafter regenerate``: GSM8K *train* questions answered by the served tiny target (the session's
   autoregressive server), written as SpecForge's conversation rows.
2. ``scripts/train_drafters.py --data`` (run by ``bench/bench_matched_drafter.py``'s ``train``): the mismatched
   DFlash drafter (trained for another checkpoint of the target, as a Kimi-K2.5 drafter is for Kimi-K2.6)
   fine-tuned for a minute on those rows, written as SpecForge's training checkpoint.
3. SpecForge's own ``export --to hf`` (``support.specforge``) reads that checkpoint back and writes the served folder.
4. ``drafter compare``: the shipped matched drafter, the mismatched one and the trained one, each served as a tree
   on the same prompts (the embedded GSM8K questions and a chat set); tau by tree budget, acceptance by depth and
   the best budget per concurrency from the shipped Kimi-K2.6 H200 step costs.

Measured, not assumed: the matched drafter accepts more than the mismatched one, and so does the one trained from
the served target's answers, at every budget above 0 (budget 1: the first draft alone)."""

from __future__ import annotations

import json

import pytest
from support import specforge
from support.paths import BENCH, REPO
from support.repo_scripts import load_script
from support.spec_e2e import TINY

from sglang_kimi.assets import DEMO_QUESTIONS, TINY_DFLASH, TINY_K25_DFLASH, TINY_MODEL
from sglang_kimi.cli import main as cli

pytestmark = pytest.mark.e2e
SERVERS = [TINY]
COSTS = BENCH / "data" / "costs" / "kimi-k2.6-h200-tp8-projected.step_costs.json"


@pytest.fixture(scope="module")
def trained_drafter(tiny_server, tmp_path_factory):
    """The mismatched drafter fine-tuned on the served target's answers, through SpecForge's checkpoint and export."""
    root = tmp_path_factory.mktemp("trained-drafter")
    rows = root / "regenerated.jsonl"
    assert cli.main(["drafter", "regenerate", "--input", str(REPO / "data" / "gsm8k" / "train.jsonl"), "--limit",
                     "128", "--output", str(rows), "--base-url", tiny_server.base_url, "--temperature", "0",
                     "--max-tokens", "96", "--concurrency", "8"]) == 0  # fmt: skip
    checkpoint, report = load_script("bench/bench_matched_drafter.py").train(root, rows, 1, timeout=900)
    assert report["num_sequences"] == 128 and report["dflash"]["sglang_loader_check_ok"], report
    config = json.loads((checkpoint / "draft_config.json").read_text())
    assert config["target_model_name_or_path"] == str(TINY_MODEL) and "target_model" not in config
    return specforge.export("hf", checkpoint / "training_state.pt", checkpoint / "draft_config.json",
                            root / "specforge-export")  # fmt: skip


def test_the_matched_and_the_trained_drafters_accept_more_than_the_mismatched_one(trained_drafter, tmp_path, capsys):
    chat = tmp_path / "chat.jsonl"
    chat.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": q}]}) for q in (
        "Tom has 3 apples and buys 5 more. How many apples does he have?",
        "A train travels 60 miles in 2 hours. What is its speed?",
    )))  # fmt: skip
    out = tmp_path / "compare"
    args = ["drafter", "compare", "--target", str(TINY_MODEL), "--drafter", f"matched={TINY_DFLASH}",
            "--drafter", f"mismatched={TINY_K25_DFLASH}", "--drafter", f"trained={trained_drafter}",
            "--prompts", f"gsm8k={DEMO_QUESTIONS}", "--prompts", f"chat={chat}", "--num-prompts", "3",
            "--max-tokens", "48", "--budget", "8", "--step-costs", str(COSTS), "--out", str(out), "--",
            "--attention-backend", "kimi_cpu"]  # fmt: skip
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "drafter_compare.json").read_text())
    assert (out / "drafter_compare.png").stat().st_size > 10_000
    matched, mismatched, trained = (data["drafters"][n]["all"] for n in ("matched", "mismatched", "trained"))
    print(printed)
    assert data["prompts"] == {"gsm8k": 3, "chat": 2}
    # budget 1 is the first draft alone. (Not the tree's acceptance at depth 1, where any of budget 8's depth-1
    # siblings counts: one run had 59 of 71 steps for a better drafter against 74 of 88 for the mismatched one, a
    # difference well inside its noise.)
    for better in (matched, trained):
        for b in ("1", "2", "4", "8"):
            assert better["tau_by_budget"][b] > mismatched["tau_by_budget"][b], (b, better, mismatched)
    assert set(data["drafters"]["matched"]["prompt_sets"]) == {"gsm8k", "chat"}
    best = data["drafters"]["matched"]["best_budget_by_concurrency"]
    assert set(best) == {"1", "2", "4", "8", "16", "32", "64"} and all(v["budget"] in (0, 8) for v in best.values())
    assert "best tree budget per concurrency" in printed and "mismatched" in printed
