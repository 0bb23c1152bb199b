"""The phases of a speculative step as named ranges in a torch profiler trace (SGLang's ``/start_profile``).

Each phase is a ``torch.profiler.record_function`` range named ``sglang_kimi.<phase>`` on the host's timeline, one
after the other: the host time a phase takes (launching its kernels, and waiting where it synchronises), which is
the time a device without other work waits. ``scripts/gpu_serve_check.py`` sums them per step. While no profiler
runs, nothing is recorded and a phase change costs one flag check.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

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


@contextmanager
def step_phases() -> Iterator[StepPhases]:
    """The phases of one step; the last one is closed however the step ends."""
    phases = StepPhases()
    try:
        yield phases
    finally:
        phases.close()
