"""scripts/gpu_serve_check.py without a GPU: the configurations it serves and in what order, which earlier run it
takes as the autoregressive reference, and how it judges parity (the demo's rule: every reference token, in order)."""

from __future__ import annotations

import json

import pytest
from support.repo_scripts import load_script


@pytest.fixture(scope="module")
def check():
    return load_script("scripts/gpu_serve_check.py")


def run_nothing(check, tmp_path, *args) -> dict:
    """main() with no time left: every configuration is listed as not run, in the order it would have run."""
    out = tmp_path / "out"
    assert check.main(["--out", str(out), "--deadline-s", "0", *args]) == 0
    (result,) = out.glob("serve-*.json")
    return json.loads(result.read_text())


def test_configs_run_in_the_given_order_after_the_autoregressive_reference(check, tmp_path):
    result = run_nothing(check, tmp_path, "--configs", "graphs/dflash-chain,eager/dflash-tree-8")
    assert [r["config"] for r in result["rows"]] == [
        "eager/autoregressive",  # no reference given: served first
        "graphs/dflash-chain",
        "eager/dflash-tree-8",
    ]
    assert all("not run" in r["skipped"] for r in result["rows"])
    default = run_nothing(check, tmp_path / "b", "--graphs", "eager,graphs", "--modes", "dflash-chain")
    assert [r["config"] for r in default["rows"]] == [
        "eager/autoregressive",
        "eager/dflash-chain",
        "graphs/dflash-chain",
    ]


def test_unknown_configurations_are_refused(check, tmp_path):
    with pytest.raises(SystemExit):
        check.main(["--out", str(tmp_path), "--configs", "eager/dflash-chain,fast/dflash-chain"])
    with pytest.raises(SystemExit):
        check.main(["--out", str(tmp_path), "--configs", "eager/medusa"])


def test_a_reference_counts_only_from_the_same_device_length_stand_ins_and_dtype(check, tmp_path):
    earlier = run_nothing(check, tmp_path / "a", "--configs", "eager/autoregressive")
    earlier["rows"] = [{"config": "eager/autoregressive", "output_ids": [[1, 2, 3]]}]
    same = tmp_path / "same.json"
    same.write_text(json.dumps(earlier))
    rows = run_nothing(check, tmp_path / "b", "--configs", "eager/dflash-chain", "--reference", str(same))["rows"]
    assert [r["config"] for r in rows] == ["eager/dflash-chain"]  # the earlier autoregressive tokens serve
    changed = (
        ("stand_ins", ["cuda-stand-in-moe-triton"]),
        ("max_new_tokens", 7),
        ("device", "other"),
        ("dtype", "float32"),
    )
    for field, value in changed:
        other = tmp_path / f"{field}.json"
        other.write_text(json.dumps(dict(earlier, **{field: value})))
        rows = run_nothing(check, tmp_path / field, "--configs", "eager/dflash-chain", "--reference", str(other))
        assert [r["config"] for r in rows["rows"]] == ["eager/autoregressive", "eager/dflash-chain"], field


def test_parity_needs_every_reference_token_in_order(check):
    ref = {"config": "eager/autoregressive", "output_ids": [[1, 2, 3, 4], [5, 6, 7]]}
    rows = [
        {"config": "eager/dflash-chain", "output_ids": [[1, 2, 3, 4], [5, 6, 7]]},
        {"config": "eager/dflash-tree-8", "output_ids": [[1, 2, 9, 4], [5, 6, 7]]},
        {"config": "graphs/eagle3-tree", "output_ids": [[1, 2, 3, 4], [5, 6]]},  # shorter: not equal
    ]
    check.compare(rows, [ref])
    assert rows[0]["equals_autoregressive"] and rows[0]["diverged"] == []
    assert rows[1]["diverged"] == [{"prompt": 0, "first_different_token": 2}]
    assert rows[2]["diverged"] == [{"prompt": 1, "first_different_token": 2}]
    assert rows[2]["reference"].endswith("eager/autoregressive")  # no graphs reference: the eager one


def test_gpu_idle_share_is_the_uncovered_part_of_the_gpu_window(check, tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "kernel", "ts": 5, "dur": 10},  # overlaps the first: busy 0-15
        {"ph": "X", "cat": "gpu_memcpy", "ts": 15, "dur": 5},  # touches it: busy 0-20
        {"ph": "X", "cat": "cpu_op", "ts": 20, "dur": 60},  # host work: not GPU time
        {"ph": "X", "cat": "kernel", "ts": 60, "dur": 40},  # idle 20-60, busy 60-100
        {"ph": "i", "cat": "kernel", "ts": 200},  # an instant event, no interval
    ]
    trace = tmp_path / "t.trace.json.gz"
    with check.gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    result = check.gpu_idle_share(check.trace_events(trace))
    assert result["gpu_events"] == 4
    assert result["window_ms"] == pytest.approx(0.1) and result["gpu_busy_ms"] == pytest.approx(0.06)
    assert result["gpu_idle_share"] == pytest.approx(0.4)
    plain = tmp_path / "cpu.trace.json"
    plain.write_text(json.dumps({"traceEvents": events[3:4]}))
    assert check.gpu_idle_share(check.trace_events(plain)) == {"gpu_events": 0}


def test_step_phases_per_step_and_the_host_share_outside_the_target_forward(check, tmp_path):
    def phase(name, ts, dur):
        return {"ph": "X", "cat": "user_annotation", "name": "sglang_kimi." + name, "ts": ts, "dur": dur}

    events = []
    for start in (0, 1000, 2000):  # three steps, 1 ms apart (microseconds in the trace)
        events += [phase("plan", start, 50), phase("draft_forward", start + 50, 150)]
        events += [phase("target_forward", start + 200, 600), phase("verify_accept", start + 800, 100)]
    events += [
        {"ph": "X", "cat": "user_annotation", "name": "scheduler.step", "ts": 0, "dur": 3000},  # not a phase
        {"ph": "X", "cat": "gpu_user_annotation", "name": "sglang_kimi.plan", "ts": 0, "dur": 999},  # GPU side
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 300, "dur": 400},
    ]
    trace = tmp_path / "t.trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    result = check.step_phases(check.trace_events(trace))
    assert result["steps"] == 3
    assert result["host_ms_per_step"] == {
        "plan": 0.05,
        "draft_forward": 0.15,
        "target_forward": 0.6,
        "verify_accept": 0.1,
    }
    assert result["step_ms"] == pytest.approx(1.0)
    assert result["host_share_outside_target_forward"] == pytest.approx(0.3)  # (0.05 + 0.15 + 0.1) / 1.0
    assert result["launches_per_step"] == {} and result["syncs_per_step"] == {}  # no runtime calls in this trace
    # a last step the trace stretched (the profiler stopping, another process on the core): outside the period,
    # so the means and the period stay those of the whole steps, and their phases add up to at most the period
    slow = [phase("plan", 3000, 500), phase("draft_forward", 3500, 1500), phase("target_forward", 5000, 6000)]
    stretched = tmp_path / "stretched.trace.json"
    stretched.write_text(json.dumps({"traceEvents": events + slow}))
    longer = check.step_phases(check.trace_events(stretched))
    assert longer["steps"] == 4 and longer["host_ms_per_step"] == result["host_ms_per_step"]
    assert longer["step_ms"] == pytest.approx(1.0) and sum(longer["host_ms_per_step"].values()) <= longer["step_ms"]
    other = tmp_path / "chain.trace.json"
    other.write_text(json.dumps({"traceEvents": events[-3:]}))
    assert check.step_phases(check.trace_events(other)) == {}  # SGLang's own worker marks no phases


def test_each_phase_counts_the_launches_and_waits_of_its_own_thread(check, tmp_path, capsys):
    def event(cat, name, ts, dur, tid=1):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}

    events = []
    for start in (0, 1000):  # two steps
        events += [event("user_annotation", "sglang_kimi.draft_forward", start, 300)]
        events += [event("user_annotation", "sglang_kimi.verify_accept", start + 300, 500)]
        events += [event("cuda_runtime", "cudaLaunchKernel", start + 10 * i, 5) for i in range(3)]  # draft: 3
        events += [event("cuda_driver", "cuLaunchKernelEx", start + 100, 5)]  # a Triton launch: the driver's call
        events += [event("cuda_runtime", "cudaStreamSynchronize", start + 400, 120)]  # verify waits once
        events += [event("cuda_runtime", "cudaLaunchKernel", start + 500, 5)]
    events += [
        event("cuda_runtime", "cudaLaunchKernel", 900, 5),  # between the phases: the scheduler's own
        event("cuda_runtime", "cudaLaunchKernel", 50, 5, tid=2),  # another thread, inside a phase's time
        event("cuda_runtime", "cudaMemcpyAsync", 20, 5),  # neither a launch nor a wait
        event("kernel", "gemm", 10, 50),
    ]
    trace = tmp_path / "t.trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    result = check.step_phases(check.trace_events(trace))
    assert result["launches_per_step"] == {"draft_forward": 4, "verify_accept": 1}
    assert result["syncs_per_step"] == {"verify_accept": 1}
    assert result["sync_ms_per_step"] == {"verify_accept": pytest.approx(0.12)}
    check.print_phases({"config": "graphs/dflash-tree-8", "profile": {"phases": result}})
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].split() == ["draft_forward", "0.300", "4.0", "0.0", "0.000"]
    assert lines[-1].split() == ["verify_accept", "0.500", "1.0", "1.0", "0.120"]
