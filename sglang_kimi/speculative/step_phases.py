"""The phases of a speculative decode step: named ranges in a torch profiler trace, and the host time of the step.

Each phase is a ``torch.profiler.record_function`` range named ``sglang_kimi.<phase>`` on the host's timeline, one
after the other: the host time a phase takes (launching its kernels, and waiting where it synchronises), which is
the time a device without other work waits. While no profiler runs, nothing is recorded and a phase change costs one
flag check. Around the phases, the whole step is a ``sglang_kimi.step`` range and the target's verify forward a
``sglang_kimi.target_forward`` range, for the plugin's DFLASH tree worker and SGLang's own DFLASH chain worker alike
(two hooks, entry ``step-phases``), so ``bench/bench_step_launches.py`` and ``scripts/gpu_serve_check.py`` compare
them phase by phase.

:data:`step_clock` also adds up, always, the host seconds of each DFLASH decode step and of its target forward
(``/server_info``'s ``spec_metrics.host_ms_per_step``): on a CPU that is the step's time; on a GPU, the host's work,
which the device waits for whenever it outlasts the device's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from sglang_kimi.hooks import hook

PREFIX = "sglang_kimi."


class StepPhases:
    """Consecutive ranges: :meth:`enter` closes the open phase and opens the next; :meth:`close` ends the last."""

    def __init__(self, recording: bool | None = None) -> None:
        """``recording``: None to record while a profiler runs; False for a step that records nothing."""
        self._recording = torch.autograd._profiler_enabled() if recording is None else recording
        self._open = None

    def enter(self, phase: str) -> None:
        if not self._recording:
            return
        self.close()
        self._open = torch.profiler.record_function(PREFIX + phase)
        self._open.__enter__()

    def close(self) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None


NO_PHASES = StepPhases(recording=False)  # for a draft outside a decode step (the adaptive policy's profile)


class StepClock:
    """Host seconds of the decode steps of this process, and of their target forwards; and where each DFLASH tree
    worker step's draft came from (:meth:`drafted`)."""

    # a draft step's source: the drafter graph's captured tail (the tree), SGLang's in-graph argmax (adaptive chains),
    # the draft side run eagerly after the drafter's forward, a DFlash2 drafter's selector walked eagerly (adaptive
    # chains), or SGLang's own chain step (adaptive at the full chain)
    DRAFT_SOURCES = ("captured_tail", "captured_argmax", "eager", "selector_walk", "sglang_chain_step")

    def __init__(self) -> None:
        self.steps = 0
        self.step_seconds = 0.0
        self.target_seconds = 0.0
        self.draft_steps = dict.fromkeys(self.DRAFT_SOURCES, 0)
        self._lock = threading.Lock()

    def add(self, step_seconds: float, target_seconds: float) -> None:
        with self._lock:
            self.steps += 1
            self.step_seconds += step_seconds
            self.target_seconds += target_seconds

    def drafted(self, source: str) -> None:
        """One step's draft came from ``source`` (one of :data:`DRAFT_SOURCES`): a host counter, no device read."""
        with self._lock:
            self.draft_steps[source] += 1

    def snapshot(self) -> dict:
        with self._lock:
            steps = max(self.steps, 1)
            return {
                "decode_steps": self.steps,
                "host_ms_per_step": 1e3 * self.step_seconds / steps,
                "host_ms_per_step_outside_target_forward": 1e3 * (self.step_seconds - self.target_seconds) / steps,
                "draft_steps_by_source": dict(self.draft_steps),
            }


step_clock = StepClock()
_step = threading.local()  # this thread's step: target_seconds, and whether its worker names its own phases


@contextmanager
def step_phases(own_phases: bool = True) -> Iterator[StepPhases]:
    """One decode step: its ``sglang_kimi.step`` range (while a profiler runs), its phases, and its host time on
    :data:`step_clock`. ``own_phases``: the worker enters its phases itself (the tree worker), ``target_forward``
    among them; otherwise the target forward's range is the only one. The last phase is closed however the step
    ends."""
    phases = StepPhases()
    step_range = torch.profiler.record_function(PREFIX + "step") if phases._recording else None
    if step_range is not None:
        step_range.__enter__()
    _step.target_seconds, _step.own_phases = 0.0, own_phases
    start = time.perf_counter()
    try:
        yield phases
    finally:
        phases.close()
        if step_range is not None:
            step_range.__exit__(None, None, None)
        step_clock.add(time.perf_counter() - start, _step.target_seconds)
        _step.target_seconds, _step.own_phases = 0.0, True


def _chain_step(original, worker, batch, *args, **kwargs):
    """AROUND ``DFlashWorkerV2.forward_batch_generation``: SGLang's DFLASH chain decode step as one step."""
    if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle():
        return original(worker, batch, *args, **kwargs)
    with step_phases(own_phases=False):
        return original(worker, batch, *args, **kwargs)


def _target_forward(original, worker, *args, is_verify: bool = False, **kwargs):
    """AROUND ``TpModelWorker.forward_batch_generation``: a verify forward as the step's ``target_forward``."""
    if not is_verify:
        return original(worker, *args, is_verify=is_verify, **kwargs)
    named = torch.autograd._profiler_enabled() and not getattr(_step, "own_phases", True)
    target_range = torch.profiler.record_function(PREFIX + "target_forward") if named else None
    if target_range is not None:
        target_range.__enter__()
    start = time.perf_counter()
    try:
        return original(worker, *args, is_verify=is_verify, **kwargs)
    finally:
        _step.target_seconds = getattr(_step, "target_seconds", 0.0) + time.perf_counter() - start
        if target_range is not None:
            target_range.__exit__(None, None, None)


def install_step_phases(chain_step: str, target_forward: str):
    hook(chain_step, _chain_step, "AROUND")
    hook(target_forward, _target_forward, "AROUND")
