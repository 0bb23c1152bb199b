"""The GSM8K gate without servers: task definition, lm-eval sample parsing, verdict, report."""

import json

import pytest

from sglang_kimi.evals import report
from sglang_kimi.evals.errors import EvalError
from sglang_kimi.evals.gsm8k import GateConfig, GateResult, Run, judge, parse_samples, parse_seeds
from sglang_kimi.evals.gsm8k_task import LOCAL_TASK, check_data_dir, render_local_task, stock_gsm8k_yaml


@pytest.fixture
def data_dir(tmp_path):
    root = tmp_path / "gsm8k"
    root.mkdir()
    for split in ("train", "test"):
        (root / f"{split}.jsonl").write_text('{"question": "2 + 2?", "answer": "2 + 2 = 4\\n#### 4"}\n')
    return root


DATASET_KEYS = {"task", "dataset_path", "dataset_name", "dataset_kwargs"}


# -- task ------------------------------------------------------------------------------------------------


def test_local_task_is_the_stock_task_but_for_its_data(tmp_path, data_dir):
    from lm_eval.tasks._yaml_loader import load_yaml

    spec = render_local_task(data_dir, tmp_path / "task")
    assert spec.name == LOCAL_TASK and spec.include_path == str(tmp_path / "task")
    local = load_yaml(tmp_path / "task" / "gsm8k_local.yaml", resolve_func=False)
    stock = load_yaml(stock_gsm8k_yaml(), resolve_func=False)
    assert {k: v for k, v in local.items() if k not in DATASET_KEYS} == {
        k: v for k, v in stock.items() if k not in DATASET_KEYS
    }
    assert local["dataset_path"] == "json" and local["dataset_name"] is None
    assert local["dataset_kwargs"]["data_files"] == {
        "train": str(data_dir / "train.jsonl"),
        "test": str(data_dir / "test.jsonl"),
    }
    assert stock["num_fewshot"] == 5 and "flexible-extract" in json.dumps(local["filter_list"])


def test_local_task_paths_with_odd_characters(tmp_path):
    from lm_eval.tasks._yaml_loader import load_yaml

    data = tmp_path / "my data: 'gsm8k' #1"
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text('{"question": "q", "answer": "a #### 1"}\n')
    render_local_task(data, tmp_path / "task")
    local = load_yaml(tmp_path / "task" / "gsm8k_local.yaml", resolve_func=False)
    assert local["dataset_kwargs"]["data_files"]["test"] == str(data / "test.jsonl")


def test_data_dir_checks(tmp_path):
    with pytest.raises(EvalError, match="is not a folder"):
        check_data_dir(tmp_path / "missing")
    with pytest.raises(EvalError, match="has no train.jsonl or test.jsonl"):
        check_data_dir(tmp_path)
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text('{"text": "not gsm8k"}\n')
    with pytest.raises(EvalError, match="does not look like GSM8K"):
        check_data_dir(tmp_path)


def test_parse_seeds():
    assert parse_seeds("3") == [1234, 1235, 1236]
    assert parse_seeds("7,1") == [7, 1]
    for bad in ("0", "x", "1,1", ","):
        with pytest.raises(EvalError):
            parse_seeds(bad)


def test_generation_length_is_checked_against_the_context():
    """--max-gen-toks at or past a server's context is refused before lm-eval runs; a bare HTTP 400 from lm-eval
    (which drops the server's reason) is explained with the usual cause and the flags that fix it."""
    from sglang_kimi.evals.gsm8k import _explain_lm_eval_failure, check_generation_fits
    from sglang_kimi.evals.gsm8k_task import task_spec
    from sglang_kimi.evals.servers import Server

    small = Server("http://h:1", {"model_path": "/m"}, {"internal_states": [{}]}, 4096)
    unknown = Server("http://h:2", {"model_path": "/m"}, {"internal_states": [{}]}, None)
    with pytest.raises(EvalError, match="--max-gen-toks 4096 leaves no room for a prompt.*4096 tokens.*h:1"):
        check_generation_fits(GateConfig(max_gen_toks=4096), unknown, small)
    check_generation_fits(GateConfig(max_gen_toks=4095), small, unknown)
    exc = RuntimeError("400, message='Bad Request', url='http://h:1/v1/completions'")
    message = _explain_lm_eval_failure(exc, small, task_spec(None, None))
    assert "HTTP 400" in message and "--max-gen-toks" in message and "--num-fewshot" in message and "4096" in message


# -- lm-eval samples -> answers ------------------------------------------------------------------------


def _samples(generations: dict[int, str], correct: dict[int, float], prompt="Question: q{d}\nAnswer:"):
    """lm-eval 0.4.13's logged samples: one entry per (question, filter)."""
    out = []
    for d, text in generations.items():
        for name, extracted in (("strict-match", "[invalid]"), ("flexible-extract", text.split()[-1])):
            out.append(
                {
                    "doc_id": d,
                    "target": f"#### {d}",
                    "arguments": {"gen_args_0": {"arg_0": prompt.format(d=d), "arg_1": {}}},
                    "resps": [[text]],
                    "filtered_resps": [extracted],
                    "filter": name,
                    "metrics": ["exact_match"],
                    "prompt_hash": f"h{d}",
                    "exact_match": correct[d] if name == "flexible-extract" else 0.0,
                }
            )
    return out


def _run(role, seed, generations, correct):
    answers = parse_samples(_samples(generations, correct))
    acc = {"flexible-extract": sum(correct.values()) / len(correct), "strict-match": 0.0}
    return Run(role=role, seed=seed, accuracy=acc, stderr={}, answers=answers)


def test_parse_samples_merges_filters_per_question():
    answers = parse_samples(_samples({0: "so 18", 1: "so 3"}, {0: 1.0, 1: 0.0}))
    assert set(answers) == {0, 1}
    assert answers[0].generation == "so 18" and answers[0].prompt_hash == "h0"
    assert answers[0].extracted == {"strict-match": "[invalid]", "flexible-extract": "18"}
    assert answers[0].correct == {"strict-match": 0.0, "flexible-extract": 1.0}


def _gate(runs, cfg):
    comparisons, differing, differing_answers, compared, checks = judge(runs, cfg)
    return GateResult(
        config=vars(cfg) | {"identical_required": cfg.identical_required, "greedy": cfg.greedy},
        task={"name": "gsm8k_local", "lm_eval_version": "0.4.13", "data_dir": "/d"},
        baseline=_summary("b"),
        candidate=_summary("c"),
        comparisons=comparisons,
        compared=compared,
        differing=differing,
        differing_answers=differing_answers,
        checks=checks,
        runs=runs,
    )


def _summary(name):
    return {"url": f"http://{name}", "model_path": "/m", "speculative": "none", "device": "cpu", "dtype": "float32"}


GEN = {0: "x = 18", 1: "y = 3", 2: "z = 70"}
RIGHT = {0: 1.0, 1: 0.0, 2: 1.0}


def test_identical_runs_pass():
    cfg = GateConfig(seeds=[1, 2], limit=3)
    runs = [_run(r, s, GEN, RIGHT) for s in (1, 2) for r in ("baseline", "candidate")]
    gate = _gate(runs, cfg)
    assert gate.passed and gate.exit_code == 0 and gate.compared == 6 and not gate.differing
    assert gate.comparisons["flexible-extract"].baseline_mean == pytest.approx(2 / 3)
    assert "IDENTICAL GENERATIONS: 6/6" in report.console(gate)


def test_one_differing_generation_fails_greedy_even_without_accuracy_change():
    cfg = GateConfig(seeds=[1, 2], limit=3)
    other = GEN | {1: "y = 4"}  # still wrong: accuracy identical
    runs = [
        _run("baseline", 1, GEN, RIGHT),
        _run("candidate", 1, other, RIGHT),
        _run("baseline", 2, GEN, RIGHT),
        _run("candidate", 2, GEN, RIGHT),
    ]
    gate = _gate(runs, cfg)
    assert gate.comparisons["flexible-extract"].delta == 0
    assert gate.checks["accuracy"]["passed"] and not gate.checks["identical_generations"]["passed"]
    assert not gate.passed and gate.exit_code == 1
    assert [(d.seed, d.doc_id, d.baseline, d.candidate) for d in gate.differing] == [(1, 1, "y = 3", "y = 4")]
    assert gate.differing_answers == 1
    md = report.markdown(gate)
    assert md.startswith("# GSM8K gate: FAIL")
    assert "**DIFFERING GENERATIONS: 1 of 6 differ" in md and "| 1 | 1 | y = 3 | y = 4 |" in md

    # not required: sampled decoding by default, or --no-require-identical
    for relaxed in (GateConfig(seeds=[1, 2], temperature=0.7), GateConfig(seeds=[1, 2], require_identical=False)):
        gate = _gate(runs, relaxed)
        assert gate.passed and gate.checks["identical_generations"]["required"] is False


def test_an_accuracy_drop_fails_even_without_the_identity_check():
    cfg = GateConfig(seeds=[1], require_identical=False)
    gen = {d: f"x = {d}" for d in range(6)}
    right = {d: 1.0 for d in range(6)}
    wrong = {d: 0.0 for d in range(6)}
    gate = _gate([_run("baseline", 1, gen, right), _run("candidate", 1, {d: "x = -1" for d in range(6)}, wrong)], cfg)
    assert not gate.checks["accuracy"]["passed"] and gate.exit_code == 1
    assert gate.comparisons["flexible-extract"].delta == -1.0


def test_prompts_must_match_between_servers():
    base = _run("baseline", 1, GEN, RIGHT)
    cand = _run("candidate", 1, GEN, RIGHT)
    cand.answers[2].prompt_hash = "other"
    with pytest.raises(EvalError, match="different prompts"):
        judge([base, cand], GateConfig(seeds=[1]))


def test_report_files(tmp_path):
    runs = [_run(r, 1, GEN, RIGHT) for r in ("baseline", "candidate")]
    gate = _gate(runs, GateConfig(seeds=[1]))
    json_path, md_path = report.write(gate, tmp_path)
    data = json.loads(json_path.read_text())
    assert data["verdict"] == "PASS" and data["differing_generations"] == 0 and data["compared_generations"] == 3
    assert set(data["comparisons"]) == {"flexible-extract", "strict-match"}
    assert len(data["runs"]) == 2 and len(data["runs"][0]["answers"]) == 3
    text = md_path.read_text()
    for section in ("## Accuracy (exact_match, %)", "## Difference (candidate − baseline)", "## Verdict", "paired z"):
        assert section in text
