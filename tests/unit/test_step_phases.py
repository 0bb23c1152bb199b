"""sglang_kimi.speculative.step_phases: a step's phases as consecutive named ranges in a torch profiler trace, closed
however the
step ends, and nothing recorded while no profiler runs."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from sglang_kimi.speculative.step_phases import NO_PHASES, PREFIX, StepPhases, step_phases


def ranges(prof) -> list:
    return sorted((e for e in prof.events() if e.name.startswith(PREFIX)), key=lambda e: e.time_range.start)


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
