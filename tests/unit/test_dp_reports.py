"""The plugin's report over data-parallel ranks: counters summed, KV maxima over ranks, failures united."""

from __future__ import annotations

import json

import pytest

from sglang_kimi.launcher.dp_reports import merged_report, reports
from sglang_kimi.speculative.metrics import AcceptanceStats


def _stats(accepted: list[int], depth: int) -> dict:
    import torch

    stats = AcceptanceStats(depth, prometheus=False)
    stats.record(torch.tensor(accepted))
    return stats.snapshot()


def _report(spec=None, kv=None, failed=(), adaptive=None) -> dict:
    return {
        "sglang_kimi": {
            "version": "x",
            "failed": list(failed),
            "spec_metrics": spec,
            "kv_scales": kv,
            "adaptive": adaptive,
        }
    }


def test_one_rank_is_its_own_report_and_no_plugin_is_empty():
    only = _report(spec=_stats([0, 2], 3))
    assert merged_report({"internal_states": [only]}) == only["sglang_kimi"]
    assert merged_report({"internal_states": [{}]}) == {} == merged_report({})
    assert reports({"internal_states": [{}, only, None]}) == [only["sglang_kimi"]]


def test_acceptance_counters_of_two_ranks_equal_one_rank_that_saw_both():
    a, b = [0, 1, 3, 3], [2, 0, 5]
    both = _stats(a + b, 5)
    # rank 0 drafted 3 positions only: its lists are shorter and are padded, not truncated
    merged = merged_report({"internal_states": [_report(spec=_stats(a, 3)), _report(spec=_stats(b, 5))]})
    spec = merged["spec_metrics"]
    for key in ("steps", "drafted_per_position", "accepted_per_position", "accept_length_histogram"):
        if key == "drafted_per_position":  # rank 0 never drafted positions 4 and 5
            assert spec[key] == [7, 7, 7, 3, 3]
            continue
        assert spec[key] == both[key], key
    assert spec["tau"] == pytest.approx(both["tau"])
    assert spec["max_depth"] == 5 and merged["data_parallel_ranks"] == 2


def test_kv_maxima_over_ranks_and_failures_united():
    def kv(k, v, tokens, layers=("0",)):
        return {
            "format": "f",
            "mode": "observe",
            "target": {
                "model": "m",
                "layers": {
                    i: {"k_amax": k, "v_amax": v, "k_scale": k / 448, "v_scale": v / 448, "tokens": tokens, "mla": True}
                    for i in layers
                },
            },
        }

    rank0 = _report(kv=kv(3.0, 1.0, 10), failed=["a"])
    rank1 = _report(kv=kv(2.0, 5.0, 7, layers=("0", "1")), failed=["b"])
    rank1["sglang_kimi"]["kv_scales"]["draft"] = {"model": "d", "layers": {"0": {"k_amax": 9.0, "tokens": 1}}}
    merged = merged_report({"internal_states": [rank0, rank1]})
    layer0 = merged["kv_scales"]["target"]["layers"]["0"]
    assert (layer0["k_amax"], layer0["v_amax"], layer0["tokens"]) == (3.0, 5.0, 17)
    assert layer0["v_scale"] == pytest.approx(5.0 / 448)
    assert merged["kv_scales"]["target"]["layers"]["1"]["tokens"] == 7  # a layer only rank 1 saw
    assert merged["kv_scales"]["draft"]["layers"]["0"]["k_amax"] == 9.0  # a role only rank 1 reported
    assert merged["failed"] == ["a", "b"]
    assert rank0["sglang_kimi"]["kv_scales"]["target"]["layers"]["0"]["tokens"] == 10  # inputs not modified


def test_adaptive_steps_summed_and_clients_read_every_rank(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "")
    from support.fake_servers import serve, sglang_payloads

    from sglang_kimi.cli import main as cli
    from sglang_kimi.evals import acceptance
    from sglang_kimi.evals.bench import adaptive_steps

    info = {
        "internal_states": [
            _report(spec=_stats([1, 1], 2), adaptive={"steps_by_width": {"0": 1, "4": 2}}),
            _report(spec=_stats([2], 2), adaptive={"steps_by_width": {"4": 5, "16": 1}}),
        ]
    }
    assert adaptive_steps(info) == {"0": 1, "4": 7, "16": 1}
    assert acceptance.snapshot(info)["spec_metrics"]["accept_length_histogram"] == [0, 2, 1]

    # calibrate-kv writes scales from the largest KV values of all ranks
    def kv(k):
        layer = {"k_amax": k, "v_amax": k, "k_scale": 1.0, "v_scale": 1.0, "tokens": 4, "mla": True}
        return {"mode": "observe", "target": {"model": "m", "layers": {"0": layer}}}

    payloads = sglang_payloads()
    payloads[("GET", "/server_info")]["internal_states"] = [_report(kv=kv(2.0)), _report(kv=kv(8.0))]
    payloads[("POST", "/generate")] = {"output_ids": [5], "meta_info": {"input_token_logprobs": [[0.0, 1, None]]}}
    data = tmp_path / "gsm8k"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps({"question": "How many?", "answer": "#### 1"}) + "\n")
    out = tmp_path / "scales.json"
    with serve(payloads) as url:
        code = cli.main(["calibrate-kv", "--base-url", url, "--out", str(out), "--data-dir", str(data)])
    assert code == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["target"]["layers"]["0"]["k_amax"] == 8.0
