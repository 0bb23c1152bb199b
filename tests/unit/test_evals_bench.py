"""The serving benchmark without servers: config resolution, SGLang result mapping, acceptance, plots."""

import argparse
import importlib.util
import re
from pathlib import Path

import pytest

from sglang_kimi.evals import acceptance, plots
from sglang_kimi.evals.bench import PRESETS, resolve_config, speedups, summarize_level, table
from sglang_kimi.evals.errors import EvalError
from sglang_kimi.evals.servers import Server
from sglang_kimi.evals.sglang_bench import bench_args


def _server(device="cuda", max_model_len=262144):
    return Server(
        "http://h:1",
        {"model_path": "/m", "is_generation": True},
        {"device": device, "internal_states": [{}]},
        max_model_len,
    )


def _args(**kw):
    base = dict(
        concurrency=None,
        preset=None,
        dataset=None,
        input_len=None,
        output_len=None,
        num_prompts=None,
        warmup_requests=1,
        data_dir=None,
        tokenizer=None,
        seed=1,
    )
    return argparse.Namespace(**(base | kw))


def test_defaults_follow_the_server_device():
    gpu = resolve_config(_args(), _server("cuda"))
    assert gpu.concurrency == [1, 8, 32, 64] and gpu.output_len == 512 and gpu.dataset == "gsm8k" and not gpu.cpu
    assert gpu.prompts_for(64) == 256 and gpu.prompts_for(1) == 4
    cpu = resolve_config(_args(), _server("cpu"))
    assert cpu.concurrency == [1, 2, 4] and cpu.output_len == 32 and cpu.input_len == 128 and cpu.cpu
    assert cpu.prompts_for(4) == 8


def test_presets_and_flags():
    long = resolve_config(_args(preset="long"), _server())
    assert (long.dataset, long.input_len, long.output_len) == ("random", 10240, 512) == tuple(PRESETS["long"].values())
    assert long.concurrency == [1, 8, 32, 64]
    gsm = resolve_config(_args(preset="gsm8k", output_len=64, concurrency="8,1"), _server("cpu"))
    assert (gsm.dataset, gsm.output_len, gsm.concurrency) == ("gsm8k", 64, [1, 8])
    with pytest.raises(EvalError, match="8 given more than once"):
        resolve_config(_args(preset="gsm8k", concurrency="8,1,8"), _server("cpu"))
    with pytest.raises(EvalError, match="exceed the model's context"):
        resolve_config(_args(preset="long"), _server(max_model_len=4096))


def test_output_length_must_leave_room_for_the_prompts():
    """GSM8K prompts with an output length past the context: SGLang's server refuses every request with HTTP 400 and
    its benchmark client counts each as completed with the whole output (a throughput of 250,000 tok/s was
    reported). Refused before any level runs, naming the largest output length that fits."""
    from types import SimpleNamespace

    from sglang_kimi.evals.bench import check_rows_fit

    with pytest.raises(EvalError, match="--output-len 4096 leaves no room for a prompt"):
        resolve_config(_args(output_len=4096), _server(max_model_len=4096))
    rows = [SimpleNamespace(prompt_len=n) for n in (50, 111, 80)]
    with pytest.raises(EvalError, match="prompts of up to 111 tokens.*at most 3985"):
        check_rows_fit(rows, 3986, _server(max_model_len=4096))
    check_rows_fit(rows, 3985, _server(max_model_len=4096))
    check_rows_fit(rows, 10_000, _server(max_model_len=None))  # a server that does not say: SGLang's to refuse
    # a KV pool smaller than the context admits shorter prompts (/server_info's max_req_input_len)
    pool = Server("http://h:1", {"model_path": "/m"}, {"device": "cpu", "max_req_input_len": 100}, 4096)
    with pytest.raises(EvalError, match="prompts of up to 111 tokens exceed the longest prompt.*100 tokens"):
        check_rows_fit(rows, 8, pool)
    with pytest.raises(EvalError, match="--input-len 700 exceeds the longest prompt.*100 tokens"):
        resolve_config(_args(dataset="random", input_len=700, output_len=8), pool)


def test_requests_that_got_no_token_are_found():
    """SGLang's client reads a streamed error event (HTTP 200, no token) as a request completed with its whole
    output; such requests are counted, real errors and answered requests are not."""
    from sglang_kimi.evals.bench import silent_failures

    result = {
        "errors": ["", "", "Bad Request: ...", ""],
        "generated_texts": ["", "a", "", ""],
        "ttfts": [0.0, 0.1, 0.0, 0.2],
    }
    assert silent_failures(result) == 1
    assert silent_failures({"errors": [""], "generated_texts": ["x"], "ttfts": [0.1]}) == 0


def _sglang_result(ttft=(0.1, 0.2), tpot=(10.0, 20.0), errors=("", "")):
    """The keys SGLang's benchmark() returns that we read (ms for the latency stats)."""
    out = {
        "completed": sum(1 for e in errors if not e),
        "duration": 2.0,
        "total_output_tokens": 64,
        "total_input_tokens": 40,
        "output_throughput": 32.0,
        "request_throughput": 1.0,
        "errors": list(errors),
    }
    for metric, (lo, hi) in {"ttft": ttft, "tpot": tpot, "itl": tpot, "e2e_latency": (100.0, 200.0)}.items():
        for key, value in {"mean": (lo + hi) / 2, "median": lo, "p95": hi, "p99": hi}.items():
            out[f"{key}_{metric}_ms"] = value
    return out


def test_summarize_level_maps_sglang_metrics():
    none = {"tau": None, "spec_metrics": None}
    level = summarize_level(2, 2, _sglang_result(), none, none)
    assert level["output_throughput"] == 32.0 and level["completed"] == 2 and level["failed"] == 0
    assert level["tpot_ms"] == {"mean": 15.0, "p50": 10.0, "p95": 20.0, "p99": 20.0}
    assert set(level["ttft_ms"]) == set(level["itl_ms"]) == {"mean", "p50", "p95", "p99"}
    assert level["tau"] is None and level["acceptance"] is None
    failed = summarize_level(2, 2, _sglang_result(errors=("boom", "")), none, none)
    assert failed["failed"] == 1 and failed["first_error"] == "boom"


def _info(drafted, accepted, hist, tau=2.0):
    spec = {
        "drafted_per_position": drafted,
        "accepted_per_position": accepted,
        "accept_length_histogram": hist,
        "acceptance_rate_per_position": [None] * len(drafted),
    }
    return {"internal_states": [{"avg_spec_accept_length": tau, "sglang_kimi": {"spec_metrics": spec}}]}


def test_acceptance_of_a_level_is_the_counter_difference():
    before = acceptance.snapshot(_info([10, 10], [6, 3], [4, 3, 3]))
    # 10 more steps: 2 accepted 0, 4 accepted 1, 4 accepted 2
    after = acceptance.snapshot(_info([20, 20], [14, 7], [6, 7, 7], tau=1.9))
    level = acceptance.level_acceptance(before, after)
    assert level["drafted_per_position"] == [10, 10] and level["accepted_per_position"] == [8, 4]
    assert level["acceptance_per_position"] == [0.8, 0.4]
    assert level["accept_length_histogram"] == [2, 4, 4] and level["steps"] == 10
    assert level["tau_level"] == pytest.approx(1 + (4 * 1 + 4 * 2) / 10)  # = 1 + sum(accepted) / steps
    assert level["tau_level"] == pytest.approx(1 + sum(level["accepted_per_position"]) / 10)
    assert after["tau"] == 1.9


def test_level_tau_comes_from_the_counters_else_from_sglang():
    before = acceptance.snapshot(_info([10, 10], [6, 3], [4, 3, 3]))
    after = acceptance.snapshot(_info([20, 20], [14, 7], [6, 7, 7], tau=1.9))
    level = summarize_level(1, 2, _sglang_result(), before, after)
    assert level["tau"] == pytest.approx(2.2) and level["tau_sglang_lifetime"] == 1.9
    sglang_only = {"tau": 1.7, "spec_metrics": None}
    assert summarize_level(1, 2, _sglang_result(), sglang_only, sglang_only)["tau"] == 1.7


def test_acceptance_without_speculation_or_after_a_reset():
    plain = {"internal_states": [{}]}
    assert acceptance.snapshot(plain) == {"tau": None, "spec_metrics": None}
    assert acceptance.level_acceptance(acceptance.snapshot(plain), acceptance.snapshot(plain)) is None
    # counters went down (server restarted): totals are reported
    level = acceptance.level_acceptance(
        acceptance.snapshot(_info([9], [9], [0, 9])), acceptance.snapshot(_info([2], [1], [1, 1]))
    )
    assert level["drafted_per_position"] == [2] and level["acceptance_per_position"] == [0.5]


def _levels(throughputs, tpots, acc=None):
    return [
        {
            "concurrency": c,
            "output_throughput": t,
            "tpot_ms": {"mean": p, "p50": p, "p95": p, "p99": p},
            "itl_ms": {"mean": 1.0, "p50": 1.0, "p95": 1.0, "p99": 1.0},
            "ttft_ms": {"mean": 5.0, "p50": 5.0, "p95": 5.0, "p99": 5.0},
            "tau": 2.5 if acc else None,
            "acceptance": acc,
        }
        for c, t, p in zip((1, 8), throughputs, tpots)
    ]


def test_speedups_and_table():
    cand, base = _levels([30.0, 200.0], [10.0, 20.0]), _levels([10.0, 100.0], [30.0, 40.0])
    ratios = speedups(cand, base)
    assert ratios == [
        {"concurrency": 1, "throughput_speedup": 3.0, "tpot_speedup": 3.0},
        {"concurrency": 8, "throughput_speedup": 2.0, "tpot_speedup": 2.0},
    ]
    text = table(cand, base)
    assert "3.00x" in text and "2.00x" in text and "n/a (the server reports no" in text


def test_plots_are_written(tmp_path):
    acc = {"acceptance_per_position": [0.9, 0.7, None], "tau_level": 2.6}
    data = {
        "levels": _levels([30.0, 200.0], [10.0, 20.0], acc),
        "baseline": {"levels": _levels([10.0, 100.0], [30.0, 40.0])},
    }
    paths = plots.write_all(data, tmp_path)
    assert [p.name for p in paths] == ["throughput.png", "tpot.png", "acceptance.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    (tmp_path / "bare").mkdir()
    bare = plots.write_all({"levels": _levels([1.0, 2.0], [3.0, 4.0]), "baseline": None}, tmp_path / "bare")
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in bare)  # the "n/a" acceptance frame included


def test_bench_args_cover_what_sglang_reads():
    """Every ``args.X`` that SGLang's benchmark() and the sglang request function read is set."""
    source = Path(importlib.util.find_spec("sglang.benchmark").submodule_search_locations[0], "serving.py").read_text()
    start, end = (
        source.index("async def async_request_sglang_generate"),
        source.index("async def async_request_openai_embeddings"),
    )
    bench_start, bench_end = source.index("async def benchmark("), source.index("def check_chat_template")
    read = set(re.findall(r"\bargs\.([a-z_]+)", source[start:end] + source[bench_start:bench_end]))
    optional = {"profile_steps", "image_count", "image_resolution"}  # hasattr-guarded, or only for image datasets
    args = bench_args(
        dataset="gsm8k", num_prompts=4, input_len=8, output_len=8, warmup_requests=1, output_file="/tmp/x"
    )
    assert read - optional - set(vars(args)) == set()
    assert args.backend == "sglang" and args.disable_ignore_eos is False and args.temperature == 0.0


def test_adaptive_widths_of_a_level_are_the_step_difference():
    from sglang_kimi.evals.bench import adaptive_steps, widths_run

    def info(steps):
        return {"internal_states": [{"sglang_kimi": {"adaptive": {"steps_by_width": steps}}}]}

    before = adaptive_steps(info({"0": 5, "2": 10, "7": 1}))
    after = adaptive_steps(info({"0": 5, "2": 40, "7": 11}))
    widths = widths_run(before, after)
    assert widths == {"2": 30, "7": 10}
    assert adaptive_steps({"internal_states": [{"sglang_kimi": {"adaptive": None}}]}) is None
    assert widths_run(None, None) is None
    plain = {"tau": None, "spec_metrics": None}
    level = summarize_level(4, 2, _sglang_result(), plain, plain, widths)
    assert level["chosen_width"] == 2 and level["adaptive_widths"] == widths
    assert "adaptive widths @ concurrency 4: chosen 2 (2: 75%, 7: 25%)" in table([level], None)
    assert summarize_level(4, 2, _sglang_result(), plain, plain)["chosen_width"] is None
