"""Per-position acceptance of speculative decoding, for chains and trees, in /server_info and Prometheus.

Every decode step of every request drafts positions 1..D (D = the deepest draft the configuration can accept:
chain length, EAGLE steps, DFlash tree depth) and accepts a of them (a path of a tree, a prefix of a chain).
Counted in the scheduler, per position d: ``drafted[d]`` (steps that drafted position d) and ``accepted[d]``
(steps that accepted at least d tokens), and the histogram of a. So ``accepted[d] / drafted[d]`` is the chance of
getting d tokens past the step's bonus, and tau = 1 + sum(accepted) / steps. Reported in ``/server_info``
(``internal_states[i]["sglang_kimi"]["spec_metrics"]``) and, with ``--enable-metrics``, as Prometheus counters
``sglang_kimi:spec_drafted_per_position_total{position}``, ``sglang_kimi:spec_accepted_per_position_total{position}``
and ``sglang_kimi:spec_accept_length_total{accepted}``.
"""

from __future__ import annotations

import logging
import threading

import torch

from sglang_kimi.hooks import hook
from sglang_kimi.speculative import acceptance_rates
from sglang_kimi.speculative.adaptive.runtime import record_tagged_step

logger = logging.getLogger("sglang_kimi")


class AcceptanceStats:
    """Counters of one scheduler process."""

    def __init__(self, max_depth: int, prometheus: bool):
        self.max_depth = max_depth
        self.drafted = [0] * (max_depth + 1)  # index d = position d (0 unused: the bonus is never drafted)
        self.accepted = [0] * (max_depth + 1)
        self.histogram = [0] * (max_depth + 1)  # index a = steps that accepted a drafts
        self._lock = threading.Lock()
        self._prometheus = _prometheus_counters() if prometheus else None

    def record(self, accepted_drafts: torch.Tensor, depth: int | None = None) -> None:
        """accepted_drafts [bs] int: drafts accepted by each request this step (bonus excluded); ``depth``: the
        deepest position this step drafted (an adaptive step may draft fewer than ``max_depth``)."""
        depth = self.max_depth if depth is None else min(depth, self.max_depth)
        counts = torch.bincount(
            accepted_drafts.long().clamp(0, self.max_depth),
            minlength=self.max_depth + 1,
        )
        counts = counts.tolist()
        steps = sum(counts)
        with self._lock:
            for a, n in enumerate(counts):
                self.histogram[a] += n
            reached = steps
            for d in range(1, depth + 1):
                reached -= counts[d - 1]  # steps that accepted >= d drafts
                self.drafted[d] += steps
                self.accepted[d] += reached
        if self._prometheus is not None:
            drafted, accepted, lengths = self._prometheus
            reached = steps
            for d in range(1, depth + 1):
                reached -= counts[d - 1]
                drafted.labels(position=str(d)).inc(steps)
                accepted.labels(position=str(d)).inc(reached)
            for a, n in enumerate(counts):
                if n:
                    lengths.labels(accepted=str(a)).inc(n)

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "max_depth": self.max_depth,
                "steps": sum(self.histogram),
                "tau": acceptance_rates.tau(self.histogram),
                "drafted_per_position": self.drafted[1:],
                "accepted_per_position": self.accepted[1:],
                "acceptance_rate_per_position": acceptance_rates.rates(self.accepted[1:], self.drafted[1:]),
                "accept_length_histogram": list(self.histogram),
            }


def _prometheus_counters():
    from prometheus_client import Counter

    return (
        Counter(
            "sglang_kimi:spec_drafted_per_position",
            "Decode steps that drafted this position (1 = first token after the bonus).",
            ["position"],
        ),
        Counter(
            "sglang_kimi:spec_accepted_per_position",
            "Decode steps that accepted a draft at this position.",
            ["position"],
        ),
        Counter(
            "sglang_kimi:spec_accept_length",
            "Decode steps by number of accepted drafts.",
            ["accepted"],
        ),
    )


def max_draft_depth(spec, plugin) -> int:
    """The deepest draft one step can accept: chain drafts, EAGLE steps, or the DFlash tree's block depth."""
    algorithm = (spec.speculative_algorithm or "").upper()
    if algorithm == "DFLASH" and plugin.dflash_tree_budget is not None:
        return int(plugin.dflash_tree_block) - 1
    if (spec.speculative_eagle_topk or 1) > 1:
        return int(spec.speculative_num_steps)
    if getattr(spec, "max_speculative_num_draft_tokens", None):  # adaptive: the widest candidate step
        return max(int(spec.max_speculative_num_draft_tokens), int(spec.speculative_num_draft_tokens)) - 1
    return int(spec.speculative_num_draft_tokens) - 1


_stats: AcceptanceStats | None = None


def stats_for(reporter) -> AcceptanceStats:
    """The counters of this scheduler process, created at its first speculative step (Prometheus counters too
    when the server runs with ``--enable-metrics``: SGLang's ``SchedulerMetricsReporter.enable_metrics``)."""
    global _stats
    if _stats is None:
        from sglang.srt.runtime_context import get_spec

        from sglang_kimi.settings import plugin_args

        _stats = AcceptanceStats(
            max_draft_depth(get_spec(), plugin_args(reporter.scheduler.server_args)),
            prometheus=bool(reporter.enable_metrics),
        )
    return _stats


class DraftHealth:
    """Draft positions whose logits were not finite (NaN or +inf: a corrupted or diverged drafter). Verification
    stays lossless whatever the draft; these positions only cost acceptance, so they are counted, logged once and
    exported (``sglang_kimi:spec_nonfinite_draft_positions_total``) rather than allowed to fail a step.

    The worker adds each step's count on the device (:meth:`add`: no host sync inside a decode step, which would
    stall SGLang's overlap of host and device); the totals reach the host in :meth:`settle`, when ``/server_info``
    asks and every ``SETTLE_EVERY`` steps after SGLang has brought a step's accept lengths to the host."""

    SETTLE_EVERY = 64
    FOLD_EVERY = 64  # steps whose counts wait, on the device, to be added into the totals at once

    def __init__(self) -> None:
        self.positions = 0  # settled totals
        self.steps = 0
        self._lock = threading.Lock()
        self._counter = None
        self._device = None  # int64 [2]: positions, steps; the totals, added on the worker's device
        self._pending: list[torch.Tensor] = []  # per step, its count [] on the device, not yet in the totals
        self._since_settle = 0
        self._prometheus = False  # the server exports Prometheus metrics (told with each step)

    def add(self, nonfinite: torch.Tensor) -> None:
        """One step's draft log-probs' non-finite mask, bool [bs, positions, K]: two device operators a step."""
        count = nonfinite.any(dim=-1).sum()  # []: the step's non-finite draft positions, on the device
        with self._lock:
            self._pending.append(count)
            if len(self._pending) >= self.FOLD_EVERY:
                self._fold()

    def _fold(self) -> None:
        """The pending counts into the device totals (the lock held; device work only)."""
        if not self._pending:
            return
        counts = torch.stack(self._pending)  # [steps]
        self._pending = []
        step = torch.stack([counts.sum(), (counts > 0).sum()])  # [2]
        # out of place: steps run in and out of torch.inference_mode, and neither may update in place a tensor
        # the other created
        self._device = step if self._device is None else self._device + step

    def step_done(self, prometheus: bool) -> None:
        """After a step's results reached the host: every ``SETTLE_EVERY`` steps, :meth:`settle`."""
        self._prometheus = prometheus
        self._since_settle += 1
        if self._since_settle >= self.SETTLE_EVERY:
            self.settle()

    def settle(self) -> None:
        with self._lock:
            self._since_settle = 0
            self._fold()
            if self._device is None:
                return
            # The device totals only grow and are never reset here: the worker adds on its own stream, and a reset
            # from this one could land after an add it had not read. A read missing the latest adds settles them
            # next time.
            total_positions, total_steps = (int(v) for v in self._device.tolist())  # the one host sync
            positions, steps = total_positions - self.positions, total_steps - self.steps
            first = self.steps == 0 and steps > 0
            self.positions, self.steps = total_positions, total_steps
        if first:
            logger.warning(
                "sglang-kimi: the drafter produced non-finite logits (%d draft positions in %d steps); those positions "
                "are drafted blind (output stays lossless, acceptance drops). Counted in /server_info "
                "spec_metrics.nonfinite_draft_positions; check the drafter checkpoint",
                positions,
                steps,
            )
        if self._prometheus and positions:
            if self._counter is None:
                from prometheus_client import Counter

                self._counter = Counter(
                    "sglang_kimi:spec_nonfinite_draft_positions",
                    "Draft positions whose logits were NaN or +inf (drafted blind; output stays lossless).",
                )
            self._counter.inc(positions)


draft_health = DraftHealth()


def current_snapshot() -> dict | None:
    from sglang_kimi.speculative.step_phases import step_clock
    from sglang_kimi.speculative.workers.drafter_graph import replay_checks

    draft_health.settle()
    if _stats is None and draft_health.steps == 0:
        return None
    snapshot = _stats.snapshot() if _stats is not None else {"steps": 0}
    snapshot["nonfinite_draft_positions"] = draft_health.positions
    snapshot["nonfinite_draft_steps"] = draft_health.steps
    snapshot.update(step_clock.snapshot())  # DFLASH decode steps' host time (0 steps for other workers)
    snapshot.update(replay_checks())  # SGLANG_KIMI_DRAFT_GRAPHS=check: replayed drafts compared with eager ones
    return snapshot


def _record_step(result_none, reporter, batch, result):
    """After SGLang's spec-v2 metrics snapshot: the step's accept lengths are on the host here. Requests already
    finished or retracted ride along in an overlapped batch; SGLang settles nothing for them (nor counts their
    ``spec_verify_ct``), and neither do these counters."""
    if result.accept_lens is None or batch.spec_algorithm.is_none():
        return
    draft_health.step_done(prometheus=bool(reporter.enable_metrics))
    accepted = result.accept_lens.reshape(-1) - int(result.num_non_draft_tokens_per_req)  # [bs]
    record_tagged_step(result, accepted)  # adaptive EAGLE3: the step's outcome for the policy
    live = torch.tensor(
        [not (req.is_retracted or req.finished()) for req in batch.reqs],
        dtype=torch.bool,
    )
    if len(live) == len(accepted):
        accepted = accepted[live.to(accepted.device)]
    stats = stats_for(reporter)
    width = getattr(result, "speculative_num_draft_tokens", None)
    depth = stats.max_depth if width is None else min(int(width) - 1, stats.max_depth)
    if depth <= 0:  # an adaptive step without speculation (width 0): nothing drafted, nothing to count
        return
    stats.record(accepted, depth)
    return


def _before_resolve_spec_v2_tokens(processor, result, batch):
    """BEFORE ``SchedulerBatchResultProcessor._resolve_spec_v2_tokens`` (SGLang 0.5.20+): where 0.5.23 calls
    ``metrics_reporter.snapshot_spec_decode_metrics(batch, result)``, which 0.5.20-0.5.22 do not have."""
    _record_step(None, processor.metrics_reporter, batch, result)


def install(target: str):
    hook(target, _before_resolve_spec_v2_tokens, "BEFORE")
