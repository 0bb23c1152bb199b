"""scripts/divergence_margins.py on the tiny model: the float64 gap it reports at a divergence is the gap between
the two tokens' logits at that position, and a departure from greedy is found where one was made."""

from __future__ import annotations

import pytest
import torch
from support.repo_scripts import load_script

from sglang_kimi.assets import TINY_MODEL
from sglang_kimi.speculators.reference.deepseek_v3 import CompactDeepseekV3


@pytest.fixture(scope="module")
def margins():
    return load_script("scripts/divergence_margins.py")


@pytest.fixture(scope="module")
def model():
    return CompactDeepseekV3.from_pretrained(TINY_MODEL, dtype=torch.float64)


@torch.no_grad()
def greedy(model, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt) :]


def test_bf16_spacing_is_the_gap_between_adjacent_bfloat16_numbers(margins):
    def exact(v: float) -> bool:
        return torch.tensor(v, dtype=torch.float64).bfloat16().double().item() == v

    for v in (1.0, 1.5, 3.0, 4.338, -6.2, 0.01, 10.1188):
        x = torch.tensor(v).bfloat16().double().item()  # a bfloat16 number near v
        step = margins.bf16_spacing(x)
        assert exact(x) and exact(x + step if x > 0 else x - step), v
        assert not exact(x + step / 2 if x > 0 else x - step / 2), v


def test_gap_at_a_divergence_and_the_departures(margins, model):
    prompt = [1, 52, 301, 77, 12, 9]
    reference = greedy(model, prompt, 10)  # the float64 greedy path: no departures
    logits = margins.teacher_forced_logits(model, prompt, reference)  # [10, vocab]
    assert logits.argmax(-1).tolist() == reference
    assert margins.departures(logits, reference) == []
    k = 6
    second = int(torch.topk(logits[k], 2).indices[1])
    speculative = reference[:k] + [second] + greedy(model, prompt + reference[:k] + [second], 3)
    found = margins.explain(logits, reference, speculative)
    assert found["first_different_token"] == k
    assert (found["reference_token"], found["speculative_token"], found["float64_choice"]) == (
        reference[k],
        second,
        reference[k],
    )
    top2 = torch.topk(logits[k], 2).values
    assert found["gap"] == pytest.approx(float(top2[0] - top2[1]), rel=1e-9) and found["gap"] > 0
    assert margins.explain(logits, reference, list(reference)) is None
    spec_logits = margins.teacher_forced_logits(model, prompt, speculative)
    (dep,) = margins.departures(spec_logits, speculative)  # the forced token only; greedy after it
    assert (dep.position, dep.token, dep.float64_choice) == (k, second, reference[k])


def test_inputs_it_cannot_read_are_refused_naming_the_file(margins, tmp_path, capsys):
    import json

    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "text.json").write_text("not json")
    row = {"config": "eager/dflash-tree-8", "output_ids": [[1]], "reference": "serve-earlier.json eager/autoregressive"}
    (tmp_path / "run.json").write_text(json.dumps({"max_new_tokens": 1, "rows": [row]}))
    for name, message in (
        ("list.json", "is not a JSON of scripts/gpu_serve_check.py"),
        ("text.json", "text.json: Expecting value"),
        ("absent.json", "No such file"),
        ("run.json", "take their reference from serve-earlier.json, not found next to it"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            margins.main([str(tmp_path / name)])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err, name
