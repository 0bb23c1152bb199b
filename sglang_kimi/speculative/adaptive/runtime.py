"""The serving side of adaptive speculation: asks the policy for each step's width, times the step, feeds the
outcome back, logs every change of a bucket's width once, and reports (``/server_info``, Prometheus).

Outcomes are read without stalling the device: a step's accepted counts and its end-of-step timestamp are kept
as tensors and CUDA events, and folded into the policy at a later step once the device has passed them (on the CPU
at once). So on a GPU the policy decides from steps up to one or two behind, like SGLang's own adaptive runtime.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import torch

from sglang_kimi.speculators.policy import WidthPolicy

logger = logging.getLogger("sglang_kimi")

GAUGE_EVERY = 16  # folded-in steps between Prometheus gauge updates (and at every change of width)
SAVE_EVERY_S = 60.0  # seconds between saves of the real steps' cost table to the profile file (when it changed)


class _Clock:
    """Start / end marks of a step: CUDA events on a GPU (read once the device passed them), else wall time.
    (``mark``, ``ready(end)``, ``seconds(start, end)`` and ``cuda`` are all a clock needs.)"""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ready(self, end) -> bool:
        return bool(end.query()) if self.cuda else True

    @staticmethod
    def seconds(start, end) -> float:
        if isinstance(start, float):
            return end - start
        return start.elapsed_time(end) / 1000.0


class AdaptiveRuntime:
    """One per scheduler process. ``sync(width) -> width``: makes every tensor-parallel rank run rank 0's choice
    (timings differ between ranks, so their policies may not agree). ``save(measured)``: keeps the real steps' cost
    table (``CostTable.measured()``) for the next start, called at most every ``save_every`` seconds while steps
    are folded in (rank 0 only: the profile file)."""

    def __init__(
        self,
        policy: WidthPolicy,
        label: str,
        device,
        prometheus: bool,
        sync: Callable[[int], int] | None = None,
        profile: dict | None = None,
        clock=None,
        save: Callable[[dict], None] | None = None,
        save_every: float = SAVE_EVERY_S,
    ):
        self.policy = policy
        self.label = label
        self.clock = clock or _Clock(device)
        self.sync = sync
        self.profile = profile or {}
        self.steps_by_width = {w: 0 for w in policy.widths}
        self._pending: deque = deque()
        self._lock = threading.Lock()
        self._gauges = _prometheus_metrics() if prometheus else None
        self._since_gauges = 0
        self._save = save
        self._save_every = save_every
        self._saved_at = time.monotonic()
        self._unsaved = False

    # -- per step ----------------------------------------------------------------------------------------------

    def choose(self, batch_size: int) -> int:
        """The width of this step (folds in the outcomes of earlier steps first)."""
        self.drain()
        with self._lock:
            decision = self.policy.choose(batch_size)
        width = decision.width
        if self.sync is not None:
            width = int(self.sync(width))
        if decision.changed:
            bucket = self.policy.bucket(batch_size)
            state = self.policy.state[bucket]
            seconds = self.policy.costs.seconds(bucket, state.width)
            logger.info(
                "sglang-kimi adaptive %s: batch bucket <= %d now runs width %d "
                "(expected %.2f tokens/step, %.2f ms/step; switch %d)",
                self.label,
                bucket,
                state.width,
                state.expected_tokens,
                1000.0 * (seconds or 0.0),
                state.switches,
            )
            self._update_gauges(force=True)
        self.steps_by_width[width] = self.steps_by_width.get(width, 0) + 1
        if self._gauges is not None:
            self._gauges["steps"].labels(width=str(width)).inc()
        return width

    def start(self):
        return self.clock.mark()

    def end(self):
        return self.clock.mark()

    def finish(
        self, start, batch_size: int, width: int, accepted: torch.Tensor, paths: torch.Tensor | None = None
    ) -> None:
        """The step ran ``width`` for ``batch_size`` requests and ends now; ``accepted`` [bs] drafts accepted per
        request; ``paths`` [bs, D+1] a tree step's accepted nodes (the root, then the path, negative after)."""
        self.record(start, self.clock.mark(), batch_size, width, accepted, paths)

    def record(
        self, start, end, batch_size: int, width: int, accepted: torch.Tensor, paths: torch.Tensor | None = None
    ) -> None:
        """A step between the marks ``start`` and ``end`` (``start()`` / ``end()``), whose accepted counts were
        known only later (SGLang's EAGLE worker: they reach the host in the scheduler's result processing)."""
        paths = None if paths is None else paths.detach()
        self._pending.append((start, end, batch_size, width, accepted.detach(), paths))
        if not self.clock.cuda:
            self.drain()

    def drain(self) -> None:
        drained = False
        while self._pending and self.clock.ready(self._pending[0][1]):
            start, end, batch_size, width, accepted, paths = self._pending.popleft()
            if paths is not None:  # the root's column dropped, the padding after each path too
                paths = [[n for n in row[1:] if n > 0] for row in paths.tolist()]
            with self._lock:
                self.policy.observe(batch_size, width, accepted.tolist(), self.clock.seconds(start, end), paths)
            drained = True
        if drained:
            self._update_gauges()
            self._unsaved = True
            self._maybe_save()

    def _maybe_save(self, force: bool = False) -> None:
        if self._save is None or not self._unsaved:
            return
        now = time.monotonic()
        if not force and now - self._saved_at < self._save_every:
            return
        with self._lock:
            measured = self.policy.costs.measured()
        self._save(measured)
        self._saved_at, self._unsaved = now, False
        self.profile["measured_saved"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    # -- reporting ---------------------------------------------------------------------------------------------

    def snapshot(self) -> dict:
        with self._lock:
            snap = self.policy.snapshot()
        snap["mode"] = self.label
        snap["widths"] = list(self.policy.widths)
        snap["steps_by_width"] = {str(w): n for w, n in sorted(self.steps_by_width.items())}
        snap["profile"] = dict(self.profile)
        return snap

    def _update_gauges(self, force: bool = False) -> None:
        if self._gauges is None:
            return
        self._since_gauges += 1
        if not force and self._since_gauges < GAUGE_EVERY:
            return
        self._since_gauges = 0
        snap = self.snapshot()
        g = self._gauges
        for bucket, state in snap["buckets"].items():
            g["width"].labels(bucket=bucket).set(state["width"])
            g["expected"].labels(bucket=bucket).set(state["expected_tokens_per_step"])
            if state["realised_tokens_per_step"] is not None:
                g["realised"].labels(bucket=bucket).set(state["realised_tokens_per_step"])
        for bucket, row in snap["costs"].items():
            for width, seconds in row.items():
                g["seconds"].labels(bucket=str(bucket), width=str(width)).set(seconds)
        acceptance = snap["acceptance"]
        if isinstance(acceptance, list):  # chains: conditional acceptance by position
            for d, a in enumerate(acceptance, start=1):
                g["acceptance"].labels(position=str(d)).set(a)
        else:  # trees: committed tokens per step by budget
            for width, tau in acceptance.items():
                if tau is not None:
                    g["tau"].labels(width=str(width)).set(tau)


def _prometheus_metrics() -> dict:
    from prometheus_client import Counter, Gauge

    def gauge(name, doc, labels):
        return Gauge(f"sglang_kimi:adaptive_{name}", doc, labels, multiprocess_mode="mostrecent")

    return {
        "width": gauge("width", "Draft width the policy runs for this batch bucket (0 = no speculation).", ["bucket"]),
        "expected": gauge(
            "expected_tokens_per_step",
            "Committed tokens per request per step expected at the chosen width.",
            ["bucket"],
        ),
        "realised": gauge(
            "realised_tokens_per_step",
            "Committed tokens per request per step observed at the chosen width.",
            ["bucket"],
        ),
        "seconds": gauge("step_seconds", "Cost table: seconds per speculative step.", ["bucket", "width"]),
        "acceptance": gauge(
            "acceptance", "Chains: estimated P(draft position accepted | the ones before were).", ["position"]
        ),
        "tau": gauge("tokens_per_step_estimate", "Trees: estimated committed tokens per step by budget.", ["width"]),
        "steps": Counter("sglang_kimi:adaptive_steps", "Decode steps run at each draft width.", ["width"]),
    }


STEP_TAG = "_sglang_kimi_adaptive_step"  # on a step's result: (runtime, start, end, batch size, width)


def tag_step(result, runtime: AdaptiveRuntime, start, batch_size: int, width: int) -> None:
    """Marks the end of a step whose accepted counts reach the host only with its result (SGLang's EAGLE worker)."""
    setattr(result, STEP_TAG, (runtime, start, runtime.end(), batch_size, width))


def record_tagged_step(result, accepted: torch.Tensor) -> None:
    """Feeds a tagged step's outcome to its runtime (once); ``accepted`` [bs] drafts accepted per request, every
    request the step ran (finished ones included: the step's cost was paid for all)."""
    tag = getattr(result, STEP_TAG, None)
    if tag is not None:
        setattr(result, STEP_TAG, None)
        runtime, start, end, batch_size, width = tag
        runtime.record(start, end, batch_size, width, accepted)


_current: AdaptiveRuntime | None = None


def set_current(runtime: AdaptiveRuntime | None) -> None:
    global _current
    _current = runtime


def current_snapshot() -> dict | None:
    return _current.snapshot() if _current is not None else None
