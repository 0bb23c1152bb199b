"""``sglang-kimi eval gsm8k`` end to end: lm-eval's GSM8K task against real SGLang servers on CPU.

The gate passes for a DFLASH draft-tree candidate (the session's DDTree server: lossless, so greedy generations
identical to the plain tiny model's), fails (exit 1) against a corrupted copy of the tiny model and refuses (exit 2)
to compare two different checkpoints (a front end answering what the tiny model's server answers, but for a
shallower checkpoint written here). Small runs: 8 questions, 2 seeds, 1-shot, 16 new tokens. ``--launch``, which
only builds the two servers' arguments for the launcher the benchmark's end-to-end test runs, is checked in
``tests/unit/test_evals_cli.py``.
"""

import json
import shutil
from pathlib import Path

import pytest
import requests
from support.data import GSM8K_DIR
from support.fake_servers import serve
from support.spec_e2e import TINY, TREE_SERVERS, shared_tree_server

from sglang_kimi.assets import TINY_MODEL
from sglang_kimi.cli import main as cli
from sglang_kimi.evals.servers import PROBE_TEXT
from sglang_kimi.launcher.server import ANY_PORT, start_server

pytestmark = pytest.mark.e2e
SERVERS = [TINY, TREE_SERVERS["dflash-tree-32"]]

DATA_DIR = GSM8K_DIR
LIMIT, SEEDS = 8, 2
SMALL_RUN = [
    "--data-dir",
    str(DATA_DIR),
    "--limit",
    str(LIMIT),
    "--seeds",
    str(SEEDS),
    "--num-fewshot",
    "1",
    "--max-gen-toks",
    "16",
    "--num-concurrent",
    "8",
]
LM_HEAD = "language_model.lm_head.weight"


def corrupted_copy(dst: Path) -> Path:
    """The tiny model with its output projection's rows shifted by one token.

    logits'[i] = w[i - 1] . h, so every greedy argmax moves to the next token id: every answer changes, while the
    architecture, tokenizer and config stay those of the tiny model (the gate must judge it, not refuse it).
    """
    from safetensors.torch import load_file, save_file

    shutil.copytree(TINY_MODEL, dst)
    tensors = load_file(dst / "model.safetensors")
    tensors[LM_HEAD] = tensors[LM_HEAD].roll(1, dims=0).contiguous()
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def shallower_copy(dst: Path, layers: int = 4) -> Path:
    """A different checkpoint of the same architecture: the tiny model's first ``layers`` decoder layers."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(TINY_MODEL, dst)
    tensors = load_file(dst / "model.safetensors")
    dropped = tuple(f"language_model.model.layers.{i}." for i in range(layers, 64))
    save_file(
        {k: v for k, v in tensors.items() if not k.startswith(dropped)},
        dst / "model.safetensors",
        metadata={"format": "pt"},
    )
    config = json.loads((dst / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = layers
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


@pytest.fixture(scope="module")
def corrupted_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("corrupted")
    server = start_server(["--model-path", str(corrupted_copy(root / "model"))], port=ANY_PORT,
                          log_path=root / "server.log", timeout=900)  # fmt: skip
    yield server
    server.stop()


def mirrored_payloads(url: str, model_path: str) -> dict:
    """What the SGLang server at ``url`` answers to the gate's probe, told of ``model_path`` instead of its own."""
    info = requests.get(url + "/model_info", timeout=60).json()
    own = info["model_path"]
    payloads = {
        ("GET", "/model_info"): info,
        ("GET", "/server_info"): requests.get(url + "/server_info", timeout=60).json(),
        ("GET", "/v1/models"): requests.get(url + "/v1/models", timeout=60).json(),
        ("POST", "/tokenize"): requests.post(url + "/tokenize", json={"prompt": PROBE_TEXT}, timeout=60).json(),
    }
    return {
        key: json.loads(json.dumps(body).replace(json.dumps(own), json.dumps(model_path)))
        for key, body in payloads.items()
    }


def run_gate(baseline: str, candidate: str, out_dir: Path) -> int:
    """``sglang-kimi eval gsm8k`` (the small run) of ``candidate`` against ``baseline``: its exit code."""
    return cli.main(
        ["eval", "gsm8k", "--baseline", baseline, "--candidate", candidate, *SMALL_RUN, "--output-dir", str(out_dir)]
    )


def _report(out_dir: Path) -> tuple[dict, str]:
    return json.loads((out_dir / "gsm8k_gate.json").read_text()), (out_dir / "gsm8k_gate.md").read_text()


def test_gate_passes_for_a_dflash_tree_candidate(request, tiny_server, server_pool, tmp_path, capsys):
    candidate = shared_tree_server(server_pool, request, "dflash-tree-32")
    code = run_gate(tiny_server.base_url, candidate.base_url, tmp_path)
    out, err = capsys.readouterr()
    assert code == 0, out[-2000:] + err[-2000:]
    data, md = _report(tmp_path)
    compared = LIMIT * SEEDS
    assert f"IDENTICAL GENERATIONS: {compared}/{compared} (0 differ)" in out and "VERDICT: PASS" in out
    assert data["verdict"] == "PASS" and data["differing_generations"] == 0 and data["compared_generations"] == compared
    assert data["candidate"]["speculative"].startswith("DFLASH") and data["baseline"]["speculative"] == "none"
    assert data["task"]["name"] == "gsm8k_local" and data["config"]["identical_required"] is True
    for name in ("flexible-extract", "strict-match"):
        comp = data["comparisons"][name]
        assert comp["questions"] == LIMIT and comp["seeds"] == SEEDS and comp["delta"] == 0
        assert comp["baseline_per_seed"] == comp["candidate_per_seed"] and len(comp["baseline_per_seed"]) == SEEDS
    runs = data["runs"]
    assert sorted((r["role"], r["seed"]) for r in runs) == sorted(
        (role, seed) for role in ("baseline", "candidate") for seed in (1234, 1235)
    )
    assert all(len(r["answers"]) == LIMIT for r in runs)
    assert any(a["generation"].strip() for r in runs for a in r["answers"]), "the servers generated nothing"
    # the seeds changed the few-shot examples: different prompts for the same question
    hashes = {r["seed"]: {a["doc_id"]: a["prompt_hash"] for a in r["answers"]} for r in runs if r["role"] == "baseline"}
    assert hashes[1234] != hashes[1235]
    assert md.startswith("# GSM8K gate: PASS") and f"**IDENTICAL GENERATIONS: {compared}/{compared}" in md
    assert "| speculative decoding | none | DFLASH" in md


def test_gate_fails_against_a_corrupted_candidate(tiny_server, corrupted_server, tmp_path, capsys):
    candidate = corrupted_server
    code = run_gate(tiny_server.base_url, candidate.base_url, tmp_path)
    out, err = capsys.readouterr()
    assert code == 1, out[-2000:] + err[-2000:]
    data, md = _report(tmp_path)
    assert data["verdict"] == "FAIL" and data["exit_code"] == 1
    assert data["differing_generations"] == LIMIT * SEEDS  # every greedy token moved
    assert data["checks"]["identical_generations"] == {
        "passed": False,
        "required": True,
        "detail": f"{LIMIT * SEEDS} of {LIMIT * SEEDS} generations differ",
    }
    assert f"DIFFERING GENERATIONS: {LIMIT * SEEDS} of {LIMIT * SEEDS} differ" in out and "VERDICT: FAIL" in out
    assert md.startswith("# GSM8K gate: FAIL") and "## Differing generations" in md
    first = data["differences"][0]
    assert first["baseline"] != first["candidate"]


def test_gate_refuses_two_different_checkpoints(tiny_server, tmp_path, capsys):
    shallower = shallower_copy(tmp_path / "shallower")
    with serve(mirrored_payloads(tiny_server.base_url, str(shallower))) as candidate:
        code = run_gate(tiny_server.base_url, candidate, tmp_path / "out")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("sglang-kimi: error: ")
    assert "serve different models" in err[0] and "num_hidden_layers 6 vs 4" in err[0]
    assert not (tmp_path / "out" / "gsm8k_gate.json").exists()
