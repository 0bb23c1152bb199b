"""``scripts/gpu_decide.py``, the planned GPU run: its plan fits one command on a lent GPU, a plan over the budget is
refused before anything starts, and a run cut short in the middle of the deciding comparison leaves a JSON that
reads, with the rounds it finished, their medians and the ratios to SGLang's chain. The run itself is rehearsed on
CPU servers by ``--device cpu`` (``docs/gpu.md``)."""

from __future__ import annotations

import json

import pytest
from support.repo_scripts import load_script

decide = load_script("scripts/gpu_decide.py")


def test_the_gpu_plan_fits_one_command_and_an_over_budget_plan_is_refused(capsys):
    steps = decide.plan(decide.SETTINGS["cuda"])
    assert sum(s.estimate_s for s in steps) <= decide.BUDGETS["cuda"] == 480
    assert sum(s.limit_s for s in steps) <= decide.COMMAND_LIMIT_S
    assert [s.name for s in steps][:3] == ["start", "parity", "rounds"]  # the deciding comparison before the rest
    assert all(s.limit_s >= s.estimate_s for s in steps)
    cpu = decide.plan(decide.SETTINGS["cpu"])
    assert sum(s.estimate_s for s in cpu) <= decide.BUDGETS["cpu"] == 600  # the rehearsal: at most 10 minutes
    assert decide.main(["--plan-only"]) == 0
    assert decide.main(["--plan-only", "--level-s", "8"]) == 2  # 5 s a level is the floor; 8 no longer fits
    assert "exceeds --budget-s 480" in capsys.readouterr().err


def test_a_run_cut_short_leaves_the_rounds_it_finished(tmp_path):
    settings = decide.Settings(**{**decide.asdict(decide.SETTINGS["cpu"]), "rounds": 3, "levels": (1, 4)})
    urls = {name: f"http://{name}" for name in decide.DECIDING}
    calls = []

    def measure(url, prompts, concurrency, seconds, max_new_tokens):
        calls.append(url)
        if len(calls) > len(urls) * len(settings.levels) + 3:  # three servers into the second round: killed
            raise KeyboardInterrupt
        speed = {"http://dflash-chain": 100.0, "http://dflash-tree-8": 120.0}.get(url, 80.0) * concurrency
        return {"tokens_per_s": speed + len(calls), "step_ms": 10.0, "tau": 3.0, "decode_steps": 50}

    record = decide.Record(tmp_path / "run.json", {"schema": decide.SCHEMA, "complete": False})
    with pytest.raises(KeyboardInterrupt):
        decide.run_rounds(record, urls, settings, ["q"], limit_s=1e9, measure=measure)
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["schema"] == decide.SCHEMA and doc["complete"] is False
    assert len(doc["rounds"]) == 1 and set(doc["rounds"][0]["levels"]) == {"1", "4"}
    assert set(doc["rounds"][0]["levels"]["4"]) == set(decide.DECIDING)
    tree = doc["summary"]["dflash-tree-8"]["4"]
    chain = doc["summary"]["dflash-chain"]["4"]
    assert tree["tokens_per_s_vs_chain"] == pytest.approx(tree["tokens_per_s"] / chain["tokens_per_s"])
    assert tree["step_ms_vs_chain"] == 1.0 and tree["tokens_per_s_spread"] == [tree["tokens_per_s"]] * 2
    # the servers' order rotates from level to level
    first_level, second_level = calls[: len(urls)], calls[len(urls) : 2 * len(urls)]
    assert first_level != second_level and sorted(first_level) == sorted(second_level)
