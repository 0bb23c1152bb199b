"""sglang_kimi.speculative.step_phases: a step's phases as consecutive named ranges inside its step range in a torch
profiler trace, closed however the step ends, nothing recorded while no profiler runs; the target forward named in
SGLang's chain step; each step's host time on the step clock."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from sglang_kimi.speculative import step_phases as sp
from sglang_kimi.speculative.step_phases import NO_PHASES, PREFIX, StepPhases, step_phases

STEP = PREFIX + "step"


def ranges(prof) -> list:
    """The phases (the step range holds them)."""
    found = (e for e in prof.events() if e.name.startswith(PREFIX) and e.name != STEP)
    return sorted(found, key=lambda e: e.time_range.start)


def step_ranges(prof) -> list:
    return [e for e in prof.events() if e.name == STEP]


def test_phases_are_consecutive_ranges_in_the_trace():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with step_phases() as phases:
            phases.enter("draft")
            torch.ones(64, 64).matmul(torch.ones(64, 64))
            phases.enter("verify")
            torch.ones(64).sum()
    found = ranges(prof)
    assert [e.name for e in found] == [PREFIX + "draft", PREFIX + "verify"]
    assert found[0].time_range.end <= found[1].time_range.start  # one after the other, not nested
    assert any(child.name == "aten::matmul" for child in found[0].cpu_children)
    (step,) = step_ranges(prof)
    assert step.time_range.start <= found[0].time_range.start and found[1].time_range.end <= step.time_range.end


def test_the_open_phase_is_closed_when_the_step_raises():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with pytest.raises(RuntimeError), step_phases() as phases:
            phases.enter("plan")
            raise RuntimeError("step failed")
        torch.ones(3).sum()  # after the step: outside every phase
    (plan,) = ranges(prof)
    after = [e for e in prof.events() if e.name == "aten::sum"]
    assert after and all(e.time_range.start >= plan.time_range.end for e in after)


def test_nothing_is_recorded_without_a_profiler():
    phases = StepPhases()
    phases.enter("draft")
    assert phases._open is None


def test_no_phases_records_nothing_even_under_a_profiler():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        NO_PHASES.enter("draft_forward")
        torch.ones(3).sum()
    assert ranges(prof) == [] and NO_PHASES._open is None


class _Worker:
    """A stand-in for SGLang's workers: the target forward sleeps, the step does some work of its own."""

    @staticmethod
    def target(worker, batch=None, forward_batch=None, is_verify=False, **kwargs):
        torch.ones(32, 32).matmul(torch.ones(32, 32))
        return "verified" if is_verify else "extended"

    @staticmethod
    def chain_step(worker, batch, *args, **kwargs):
        torch.ones(8).sum()
        out = sp._target_forward(_Worker.target, worker, forward_batch="fb", is_verify=True)
        torch.ones(8).sum()
        return out


class _Decode:
    def __init__(self, extend: bool = False):
        self.forward_mode = type("Mode", (), {"is_extend": lambda s: extend, "is_idle": lambda s: False})()
        self.is_extend_in_batch = extend


def test_sglang_chain_step_gets_its_step_and_target_forward_ranges():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert sp._chain_step(_Worker.chain_step, None, _Decode()) == "verified"
    assert [e.name for e in ranges(prof)] == [PREFIX + "target_forward"]
    (step,) = step_ranges(prof)
    (target,) = ranges(prof)
    assert step.time_range.start <= target.time_range.start <= target.time_range.end <= step.time_range.end


def test_a_worker_naming_its_own_phases_gets_no_second_target_range():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with step_phases() as phases:
            phases.enter("target_forward")
            sp._target_forward(_Worker.target, None, is_verify=True)
    assert [e.name for e in ranges(prof)] == [PREFIX + "target_forward"]  # the worker's own, once


def test_prefill_and_non_verify_forwards_are_not_steps(monkeypatch):
    clock = sp.StepClock()
    monkeypatch.setattr(sp, "step_clock", clock)
    assert sp._chain_step(lambda w, b: "prefilled", None, _Decode(extend=True)) == "prefilled"
    assert sp._target_forward(_Worker.target, None, is_verify=False) == "extended"
    assert clock.snapshot()["decode_steps"] == 0


def test_step_clock_adds_each_step_and_its_target_forward(monkeypatch):
    clock = sp.StepClock()
    monkeypatch.setattr(sp, "step_clock", clock)
    times = iter([10.0, 10.25, 10.75, 11.0, 20.0, 20.5, 21.0, 21.5])  # step, target, target end, step end; twice
    monkeypatch.setattr(sp.time, "perf_counter", lambda: next(times))
    for _ in range(2):
        sp._chain_step(_Worker.chain_step, None, _Decode())
    snap = clock.snapshot()
    assert snap["decode_steps"] == 2
    assert snap["host_ms_per_step"] == pytest.approx(1e3 * (1.0 + 1.5) / 2)
    assert snap["host_ms_per_step_outside_target_forward"] == pytest.approx(1e3 * (0.5 + 1.0) / 2)
