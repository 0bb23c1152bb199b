"""``sglang-kimi bench`` end to end on CPU (SGLang's own benchmark code): a launched DFLASH server side by side
with the plain tiny model, and random prompts of a fixed length."""

import json

import pytest
from support.data import GSM8K_DIR
from support.spec_e2e import TINY

from sglang_kimi.assets import TINY_DFLASH
from sglang_kimi.cli import main as cli

pytestmark = pytest.mark.e2e
SERVERS = [TINY]

DATA_DIR = GSM8K_DIR
PNG = b"\x89PNG\r\n\x1a\n"


def _check_latency(stats: dict, name: str) -> None:
    assert set(stats) == {"mean", "p50", "p95", "p99"}, name
    assert 0 < stats["p50"] <= stats["p95"] <= stats["p99"], (name, stats)
    assert stats["mean"] > 0, (name, stats)


def _check_level(level: dict, concurrency: int, prompts: int, output_len: int) -> None:
    assert level["concurrency"] == concurrency
    assert level["completed"] == level["requests"] == prompts and level["failed"] == 0
    assert level["output_tokens"] == prompts * output_len  # EOS ignored: fixed output length
    assert level["output_throughput"] > 0 and level["duration_s"] > 0
    # units: the level lasted at least as long as its slowest request (e2e in ms, throughput in tok/s)
    assert level["duration_s"] * 1000.0 >= level["e2e_ms"]["p99"]
    assert level["output_throughput"] == pytest.approx(level["output_tokens"] / level["duration_s"])
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        _check_latency(level[metric], metric)
    assert level["e2e_ms"]["p99"] >= level["ttft_ms"]["p50"]


def test_bench_dflash_side_by_side_with_the_plain_model(tiny_server, tmp_path, capsys):
    drafter = TINY_DFLASH
    server_args = (
        f"--attention-backend kimi_cpu --speculative-algorithm DFLASH --speculative-draft-model-path {drafter}"
    )
    code = cli.main(
        [
            "bench",
            "--launch",
            "--server-args",
            server_args,
            "--baseline-url",
            tiny_server.base_url,
            "--concurrency",
            "1,2",
            "--num-prompts",
            "2",
            "--output-len",
            "8",
            "--data-dir",
            str(DATA_DIR),
            "--output-dir",
            str(tmp_path),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, out[-2000:] + err[-2000:]
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["config"]["cpu"] is True and data["config"]["dataset"] == "gsm8k"
    assert data["server"]["speculative"].startswith("DFLASH") and data["baseline"]["server"]["speculative"] == "none"
    for levels in (data["levels"], data["baseline"]["levels"]):
        assert [lv["concurrency"] for lv in levels] == [1, 2]
        for level in levels:
            _check_level(level, level["concurrency"], prompts=2, output_len=8)

    for level in data["levels"]:  # speculative: tau and the plugin's per-position counters of this level
        assert level["tau"] is not None and level["tau"] >= 1.0
        acc = level["acceptance"]
        assert acc is not None and acc["steps"] > 0
        assert (
            len(acc["drafted_per_position"])
            == len(acc["accepted_per_position"])
            == len(acc["acceptance_per_position"])
            > 0
        )
        assert all(d == acc["steps"] for d in acc["drafted_per_position"])  # every step drafts every position
        assert all(0 <= a <= d for a, d in zip(acc["accepted_per_position"], acc["drafted_per_position"]))
        assert acc["accepted_per_position"] == sorted(acc["accepted_per_position"], reverse=True)  # prefix acceptance
        assert 1.0 <= acc["tau_level"] <= 1 + len(acc["drafted_per_position"])
        # output tokens of the level (warm-up excluded) = steps x tau, for 2 requests of 8 tokens minus the
        # first token of each (the prefill's) -- within the warm-up requests' share
        assert acc["steps"] * acc["tau_level"] >= 2 * (8 - 1)
    for level in data["baseline"]["levels"]:
        assert level["tau"] is None and level["acceptance"] is None

    assert [s["concurrency"] for s in data["speedup"]] == [1, 2]
    assert all(s["throughput_speedup"] > 0 and s["tpot_speedup"] > 0 for s in data["speedup"])
    for name in ("throughput.png", "tpot.png", "acceptance.png"):
        path = tmp_path / name
        assert path.read_bytes()[:8] == PNG and path.stat().st_size > 5000, name
    raw = (tmp_path / "sglang_bench_serving_server.jsonl").read_text().splitlines()  # SGLang's own result lines
    assert len(raw) == 2 and json.loads(raw[0])["completed"] == 2
    assert "Serving Benchmark Result" in out  # SGLang's printed table
    assert "speedup" in out and "acceptance by position @ concurrency 1" in out
    assert (tmp_path / "server-server.log").exists()


def test_bench_random_prompts_of_fixed_length(tiny_server, tmp_path, capsys):
    code = cli.main(
        [
            "bench",
            "--base-url",
            tiny_server.base_url,
            "--dataset",
            "random",
            "--input-len",
            "24",
            "--output-len",
            "6",
            "--concurrency",
            "2",
            "--num-prompts",
            "2",
            "--warmup-requests",
            "0",
            "--output-dir",
            str(tmp_path),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, out[-2000:] + err[-2000:]
    data = json.loads((tmp_path / "bench.json").read_text())
    (level,) = data["levels"]
    _check_level(level, 2, prompts=2, output_len=6)
    assert level["input_tokens"] == 2 * 24
    assert level["tau"] is None and level["acceptance"] is None  # no speculative decoding on this server
    assert "acceptance by position: n/a" in out
