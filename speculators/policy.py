"""Adaptive speculation: the draft width chosen per batch-size bucket from measured acceptance and measured cost.

A speculative step of width ``w`` (``w`` drafted tokens in a chain, or a tree of ``w`` nodes; ``w = 0`` is a plain
decode step) commits ``E_w`` tokens per request on average and costs ``t(B, w)`` seconds for a batch of ``B``
requests (draft and verify together). The batch commits ``B * E_w / t(B, w)`` tokens per second, so the width to
run is

    w* = argmax_w  E_w / t(B, w)          (E_0 = 1: a plain decode step commits one token)

Width 0 wins whenever no width pays for its cost, e.g. a drafter that matches the target poorly at a large batch,
where verify cost grows with the tokens verified. The two inputs are estimated online:

- :class:`ChainAcceptance`: for chains, the conditional acceptance ``a_d = P(position d accepted | d - 1 were)``
  with exponentially decayed counts; ``E_w = 1 + sum_{d <= w} prod_{j <= d} a_j``. A position a step did not reach
  or did not draft says nothing about it: only positions ``d <= min(width, accepted + 1)`` are counted.
- :class:`TreeAcceptance`: for trees (and any family of widths whose gain is not a product of positions), the mean
  committed tokens per step of each width, decayed; a width not yet observed borrows from its nearest observed
  neighbours, optimistically, so that exploration reaches it. DDTree budgets are nested (the tree of budget ``b`` is
  the first ``b`` nodes of any wider one), so a step of width ``w`` that reports its accepted path measures every
  narrower candidate width on the same requests: ``docs/adaptive.md``, "Nested tree budgets".
- :class:`CostTable`: seconds per step by (bucket, width), from a start-up profile scaled by how far the real
  steps' timings fell from it, each cell replaced by the steps' own timings (decayed) once it has run.

:class:`WidthPolicy` combines them per bucket, with some steps spent on other widths (the runner-up, and the least
recently run: so the estimates of widths not chosen do not go stale), as many as a budget of lost throughput allows
(a width whose step is expected to lose much is revisited rarely), and hysteresis (a new width must beat the current
one by a margin, so the choice does not thrash between near-equal widths). Pure Python and PyTorch-free: the serving
workers feed it counts and seconds. Derivation, failure modes and the replay its defaults were chosen on:
``docs/adaptive.md``.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

NO_SPECULATION = 0
EXPLORE_BUDGET = 0.2  # exploration may lose at most EXPLORE_BUDGET / explore_every of a bucket's time (1% at 20)


@dataclass
class Decayed:
    """A decayed sum: each observation weighs 1, everything before it ``decay`` times less than it did."""

    value: float = 0.0
    weight: float = 0.0

    def add(self, x: float, decay: float) -> None:
        self.value = self.value * decay + x
        self.weight = self.weight * decay + 1.0

    def mean(self) -> float | None:
        return self.value / self.weight if self.weight > 0 else None


class ChainAcceptance:
    """Per-position conditional acceptance of a chain drafter, shared by every bucket (acceptance is a property
    of the drafter and the traffic, not of the batch size).

    Each position's counts decay with that position's own observations (``decay`` per request that reached it): a
    position the running width does not reach keeps what the last steps that drafted it measured, instead of fading
    back to the prior between explorations (at a batch of 64, a decay per request-step of every position would
    forget an exploration within a few steps). ``prior`` and ``prior_weight``: a Beta-like pseudo-count per
    position, centred on the estimate of the position before it (the first position on ``prior``): a position
    seldom observed is taken to be about as good as its predecessor, which is what a drafter's acceptance by
    position looks like (it falls slowly with depth), and a few observations dominate it.
    """

    def __init__(self, max_width: int, decay: float = 0.995, prior: float = 0.5, prior_weight: float = 2.0):
        self.max_width = max_width
        self.decay = decay
        self.prior = prior
        self.prior_weight = prior_weight
        self.tried = [0.0] * (max_width + 1)  # index d: decayed steps that reached position d (d drafted)
        self.accepted = [0.0] * (max_width + 1)  # decayed steps that accepted position d
        self._conditional: list[float] | None = None  # a_d by position until the next observation
        self._expected: list[float] | None = None  # E_w by width until the next observation

    def observe(self, width: int, accepted: Sequence[int], paths: Sequence[Sequence[int]] | None = None) -> None:
        """One step of ``width`` drafts; ``accepted[r]`` drafts accepted by request r (bonus excluded). ``paths``
        (trees only) is not needed: a chain's depth already says what every narrower chain accepts."""
        if width <= 0:
            return
        width = min(width, self.max_width)
        at_least = [0] * (width + 2)  # at_least[a]: requests that accepted a drafts, then summed from the top
        for a in accepted:
            at_least[max(0, min(int(a), width))] += 1
        for a in range(width, 0, -1):
            at_least[a - 1] += at_least[a]
        # position d was tried by the requests that accepted >= d - 1 drafts, accepted by those that accepted >= d
        for d in range(1, width + 1):
            tried = at_least[d - 1]
            if tried:
                factor = self.decay**tried
                self.tried[d] = self.tried[d] * factor + tried
                self.accepted[d] = self.accepted[d] * factor + at_least[d]
        self._conditional = self._expected = None

    def conditional(self, d: int) -> float:
        """``a_d``: the chance position d is accepted when the d - 1 before it were."""
        if self._conditional is None:
            rates, prior = [1.0], self.prior
            for k in range(1, self.max_width + 1):
                prior = (self.accepted[k] + prior * self.prior_weight) / (self.tried[k] + self.prior_weight)
                rates.append(prior)
            self._conditional = rates
        return self._conditional[d]

    def observed(self) -> bool:
        return self.tried[1] > 0

    def expected_tokens(self, width: int) -> float:
        """``E_w``: committed tokens per step at width ``width`` (accepted drafts + the bonus)."""
        if self._expected is None:
            total, reach, expected = 1.0, 1.0, [1.0]
            for d in range(1, self.max_width + 1):
                reach *= self.conditional(d)
                total += reach
                expected.append(total)
            self._expected = expected
        return self._expected[max(0, min(width, self.max_width))]

    def snapshot(self) -> list[float]:
        return [round(self.conditional(d), 4) for d in range(1, self.max_width + 1)]


def nodes_within(path: Sequence[int], budget: int) -> int:
    """The leading nodes of an accepted ``path`` (node numbers, root excluded, increasing) that a tree of the first
    ``budget`` nodes holds: the drafts that tree accepts. Example: path [1, 3, 9], budget 4 -> 2."""
    n = 0
    for node in path:
        if node > budget:
            break
        n += 1
    return n


class TreeAcceptance:
    """Committed tokens per step for each candidate width (tree budgets), decayed, shared by every bucket.

    A larger budget never commits fewer tokens in expectation, so the per-width means are pooled into a
    non-decreasing curve (weighted isotonic regression, pool-adjacent-violators): a width whose few samples were
    unlucky borrows from its neighbours instead of losing to a smaller width on noise. A width never observed is
    interpolated between its nearest observed neighbours (width 0 commits 1 token) in ``log(1 + width)`` (a tree's
    gain per doubling of the budget shrinks), plus ``optimism`` tokens so that exploration tries it, and capped by
    what it could commit: no more than the next observed width above it, nor than ``1 + width`` (a tree of
    ``width`` nodes accepts at most ``width`` of them). Before any observation every width is ``1 + optimism``.
    """

    def __init__(self, widths: Sequence[int], decay: float = 0.995, optimism: float = 0.5):
        self.widths = sorted(w for w in widths if w > 0)
        self.decay = decay
        self.optimism = optimism
        self.tau = {w: Decayed() for w in self.widths}
        self._pooled: dict[int, float] | None = None  # pooled() until the next observation

    def observe(self, width: int, accepted: Sequence[int], paths: Sequence[Sequence[int]] | None = None) -> None:
        """One step of a tree of ``width`` nodes; ``accepted[r]`` drafts accepted by request r. ``paths[r]``, when
        given, are request r's accepted node numbers (root excluded; a DDTree numbers its nodes best first, so they
        increase along the path): the tree of a narrower budget ``b`` is the first ``b`` nodes, and it would have
        accepted the path's leading nodes numbered ``<= b`` (greedy exactly; sampled, coin for coin). Every
        candidate width up to ``width`` is then measured on the same requests."""
        if paths is None:
            if width in self.tau:
                for a in accepted:
                    self.tau[width].add(1.0 + int(a), self.decay)
                self._pooled = None
            return
        for b in self.widths:
            if b > width:
                break
            for path in paths:
                self.tau[b].add(1.0 + nodes_within(path, b), self.decay)
        self._pooled = None

    def pooled(self) -> dict[int, float]:
        """The observed widths' means, made non-decreasing in the width (weights: the decayed sample counts)."""
        if self._pooled is None:
            self._pooled = self._pool()
        return self._pooled

    def _pool(self) -> dict[int, float]:
        blocks: list[list] = []  # [mean, weight, widths]
        for w in self.widths:
            cell = self.tau[w]
            if cell.mean() is None:
                continue
            blocks.append([cell.mean(), cell.weight, [w]])
            while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
                (m2, w2, ws2), (m1, w1, ws1) = blocks.pop(), blocks.pop()
                blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, ws1 + ws2])
        return {w: mean for mean, _, ws in blocks for w in ws}

    def observed(self) -> bool:
        return bool(self.pooled())

    def expected_tokens(self, width: int) -> float:
        if width <= 0:
            return 1.0
        pooled = self.pooled()
        if width in pooled:
            return pooled[width]
        below = [w for w in pooled if w < width]
        above = [w for w in pooled if w > width]
        a = max(below) if below else 0
        ea = pooled[a] if below else 1.0
        if not above:
            return min(ea + self.optimism, 1.0 + width)
        b = min(above)
        eb = pooled[b]
        between = ea + (eb - ea) * math.log1p(width - a) / math.log1p(b - a)
        return min(between + self.optimism, eb, 1.0 + width)

    def snapshot(self) -> dict[int, float | None]:
        pooled = self.pooled()
        return {w: (round(pooled[w], 4) if w in pooled else None) for w in self.widths}


class CostTable:
    """Seconds per speculative step by (batch bucket, width): a start-up profile, refined online.

    A cell a real step has timed is that cell's decayed mean. A cell known only from the profile is the profiled
    value times the bucket's *calibration*: how much longer the real steps took than the profile said, over the
    cells of this bucket that both profiled and measured (with the same ratio over every bucket as a prior of
    weight one observation; 1 before any real step). The profile runs on dummy inputs (a short context, no
    bookkeeping of accepted tokens, possibly a busy machine), so it is off by a factor that is much the same across
    widths; without the calibration every measured cell would look worse than every profiled one, and a bucket would
    tour all its widths before settling.

    ``seconds(bucket, width)`` interpolates linearly in the width between known widths of the bucket (and
    extrapolates from the two nearest) when a width was neither profiled nor measured.
    """

    def __init__(self, decay: float = 0.98):
        self.decay = decay
        self.table: dict[int, dict[int, Decayed]] = {}  # measured: bucket -> width -> the real steps' seconds
        self.profile: dict[int, dict[int, float]] = {}  # profiled: bucket -> width -> seconds
        self._calibration: dict[int, float] | None = None  # per bucket, until the next observation
        self._rows: dict[int, dict[int, float]] = {}  # row() per bucket, until the next observation

    def _changed(self) -> None:
        self._calibration = None
        self._rows.clear()

    def set(self, bucket: int, width: int, seconds: float) -> None:
        """A profiled value (calibrated until the first real step of this (bucket, width) replaces it)."""
        self.profile.setdefault(bucket, {})[width] = seconds
        self._changed()

    def observe(self, bucket: int, width: int, seconds: float) -> None:
        self.table.setdefault(bucket, {}).setdefault(width, Decayed()).add(seconds, self.decay)
        self._changed()

    def restore(self, bucket: int, width: int, seconds: float, steps: float, trust: float = 8.0) -> None:
        """A cell real steps measured before a restart (mean ``seconds`` over ``steps`` decayed steps), weighed as
        at most ``trust`` steps: it replaces the profiled value, and this server's own steps take over within a few
        dozen steps if the traffic has changed."""
        if seconds > 0 and steps > 0 and math.isfinite(seconds):
            weight = min(steps, trust)
            self.table.setdefault(bucket, {})[width] = Decayed(seconds * weight, weight)
            self._changed()

    def measured(self) -> dict[int, dict[int, tuple[float, float]]]:
        """The cells real steps have timed: bucket -> width -> (mean seconds, decayed steps)."""
        return {
            b: {w: (c.mean(), c.weight) for w, c in sorted(row.items()) if c.mean() is not None}
            for b, row in sorted(self.table.items())
        }

    def _ratios(self, bucket: int) -> list[tuple[float, float]]:
        """(real / profiled seconds, decayed steps) of the bucket's cells that were both profiled and measured."""
        profiled = self.profile.get(bucket, {})
        return [
            (cell.mean() / profiled[w], cell.weight)
            for w, cell in self.table.get(bucket, {}).items()
            if profiled.get(w, 0) > 0 and cell.mean() is not None
        ]

    def calibration(self, bucket: int) -> float:
        """Real over profiled seconds in this bucket (see the class docstring)."""
        if self._calibration is None:
            ratios = {b: self._ratios(b) for b in self.profile}
            everywhere = [r for rs in ratios.values() for r in rs]
            prior = sum(r * n for r, n in everywhere) / sum(n for _, n in everywhere) if everywhere else 1.0
            self._calibration = {
                b: (sum(r * n for r, n in rs) + prior) / (sum(n for _, n in rs) + 1.0) for b, rs in ratios.items()
            }
        return self._calibration.get(bucket, 1.0)

    def row(self, bucket: int) -> dict[int, float]:
        """The bucket's known widths: measured means, else calibrated profiled values."""
        row = self._rows.get(bucket)
        if row is None:
            scale = self.calibration(bucket)
            row = {w: s * scale for w, s in self.profile.get(bucket, {}).items()}
            row.update({w: c.mean() for w, c in self.table.get(bucket, {}).items() if c.mean() is not None})
            self._rows[bucket] = row
        return row

    def seconds(self, bucket: int, width: int) -> float | None:
        row = self.row(bucket)
        if width in row:
            return row[width]
        if len(row) < 2:
            return next(iter(row.values())) if row else None
        known = sorted(row)
        lo = [w for w in known if w < width]
        hi = [w for w in known if w > width]
        a, b = (lo[-1], hi[0]) if lo and hi else ((known[-2], known[-1]) if lo else (known[0], known[1]))
        slope = (row[b] - row[a]) / (b - a)
        return max(row[a] + slope * (width - a), 1e-9)

    def snapshot(self) -> dict[int, dict[int, float]]:
        buckets = sorted(set(self.table) | set(self.profile))
        return {b: {w: round(s, 6) for w, s in sorted(self.row(b).items())} for b in buckets}


@dataclass
class BucketState:
    width: int  # the width this bucket runs now
    steps: int = 0
    switches: int = 0
    expected_tokens: float = 1.0  # E_w of the chosen width when it was chosen
    realised: Decayed = field(default_factory=Decayed)  # committed tokens per request per step, as observed
    last_run: dict[int, int] = field(default_factory=dict)  # width -> this bucket's step that last ran it
    explorations: int = 0  # steps of this bucket that ran another width than the chosen one
    attempts: int = 0  # explorations that were due (some wait for the allowance)
    allowance: dict[int, float] = field(default_factory=dict)  # width -> seconds exploring it may still lose


@dataclass(frozen=True)
class Decision:
    width: int
    explore: bool  # another width run to keep its estimates fresh, not the chosen one
    changed: bool  # the bucket's chosen width changed with this decision (log it)


class WidthPolicy:
    """Chooses the draft width of each step for its batch size, and learns from the step's outcome.

    ``widths``: the candidate widths, ascending, 0 (no speculation) allowed; ``buckets``: batch-size bucket bounds
    (a batch of B requests falls in the first bucket >= B, the last one beyond); ``acceptance``: a
    :class:`ChainAcceptance` or :class:`TreeAcceptance`; ``costs``: a :class:`CostTable`. One in every
    ``explore_every`` steps of a bucket (and two early ones: :meth:`exploration_due`) may run another width instead:
    the runner-up or the least recently run width (at most ``1 / explore_every`` of the steps), if the bucket can
    afford what that step is expected to lose: exploration may cost at most ``explore_budget`` of the bucket's time
    (default ``EXPLORE_BUDGET / explore_every``); the bucket switches to a width only when its expected rate beats
    the current width's by ``hysteresis`` (a fraction).
    """

    def __init__(
        self,
        widths: Sequence[int],
        buckets: Sequence[int],
        acceptance: ChainAcceptance | TreeAcceptance,
        costs: CostTable,
        *,
        initial_width: int | None = None,
        explore_every: int = 20,
        hysteresis: float = 0.05,
        explore_budget: float | None = None,
    ):
        if not widths or list(widths) != sorted(set(widths)) or widths[0] < 0:
            raise ValueError(f"widths must be distinct, ascending and >= 0, got {list(widths)}")
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
            raise ValueError(f"buckets must be distinct, ascending and >= 1, got {list(buckets)}")
        if explore_every < 2:
            raise ValueError(f"explore_every must be >= 2 (1 would explore every step), got {explore_every}")
        if not 0 <= hysteresis < 1:
            raise ValueError(f"hysteresis must be in [0, 1), got {hysteresis}")
        if explore_budget is not None and not 0 <= explore_budget <= 1:
            raise ValueError(f"explore_budget must be in [0, 1], got {explore_budget}")
        self.widths = list(widths)
        self.buckets = list(buckets)
        self.acceptance = acceptance
        self.costs = costs
        self.explore_every = explore_every
        self.hysteresis = hysteresis
        self.explore_budget = EXPLORE_BUDGET / explore_every if explore_budget is None else explore_budget
        start = self.widths[-1] if initial_width is None else initial_width
        if start not in self.widths:
            raise ValueError(f"initial width {start} is not a candidate width {self.widths}")
        self.state = {b: BucketState(width=start) for b in self.buckets}

    def bucket(self, batch_size: int) -> int:
        return self.buckets[min(bisect_left(self.buckets, batch_size), len(self.buckets) - 1)]

    def rate(self, bucket: int, width: int) -> float:
        """Expected committed tokens per request per second at this width (0 when its cost is unknown)."""
        seconds = self.costs.seconds(bucket, width)
        if seconds is None or seconds <= 0:
            return 0.0
        return self.acceptance.expected_tokens(width) / seconds

    def best(self, bucket: int) -> int:
        rates = {w: self.rate(bucket, w) for w in self.widths}
        return max(self.widths, key=lambda w: (rates[w], -w))  # ties: the smaller width (cheaper, less risk)

    def choose(self, batch_size: int) -> Decision:
        bucket = self.bucket(batch_size)
        state = self.state[bucket]
        state.steps += 1
        current = state.width
        measured = self.costs.row(bucket)
        if len(measured) < min(2, len(self.widths)):  # no profile for this bucket: measure two widths (the table
            # interpolates the rest) before comparing any
            unmeasured = [w for w in self.widths if w not in measured]
            return Decision(unmeasured[0] if not measured else unmeasured[-1], explore=True, changed=False)
        if not self.acceptance.observed():  # nothing known of the drafter yet: its first steps run the initial
            # (by default the widest) width, which measures every draft position at once
            return self._run(bucket, state, current, explore=False, changed=False)
        best = self.best(bucket)
        changed = False
        if best != current and self.rate(bucket, best) > self.rate(bucket, current) * (1 + self.hysteresis):
            state.width, state.switches, changed = best, state.switches + 1, True
            current = best
        state.expected_tokens = self.acceptance.expected_tokens(current)
        if self.exploration_due(state.steps) and len(self.widths) > 1:
            explored = self._explored(bucket, state, current)
            if explored is not None:
                return self._run(bucket, state, explored, explore=True, changed=changed)
        return self._run(bucket, state, current, explore=False, changed=changed)

    def _run(self, bucket: int, state: BucketState, width: int, explore: bool, changed: bool) -> Decision:
        """The decision to run ``width``: its step's expected seconds times ``explore_budget`` accrue to the
        exploration allowances of the bucket's other widths, in equal shares."""
        state.last_run[width] = state.steps
        if len(self.widths) > 1:
            share = self.explore_budget * (self.costs.seconds(bucket, width) or 0.0) / (len(self.widths) - 1)
            for w in self.widths:
                if w != state.width:
                    state.allowance[w] = state.allowance.get(w, 0.0) + share
        return Decision(width, explore=explore, changed=changed)

    def regret(self, bucket: int, current: int, width: int) -> float:
        """Seconds a step of ``width`` is expected to lose against ``current``: its time, less the time ``current``
        takes to commit as many tokens (0 when ``width`` is expected to be as fast or faster)."""
        seconds = self.costs.seconds(bucket, width) or 0.0
        rate = self.rate(bucket, current)
        if rate <= 0:
            return 0.0
        return max(0.0, seconds - self.acceptance.expected_tokens(width) / rate)

    def exploration_due(self, step: int) -> bool:
        """Whether a bucket's ``step``-th step (from 1) explores: every ``explore_every``-th, and two early ones at a
        quarter and a half of that interval, while the bucket's choice still rests on the start-up profile alone
        (a bounded share: at most ``1 / explore_every`` of the steps, plus two per bucket)."""
        e = self.explore_every
        return step % e == 0 or step in (max(1, e // 4), max(1, e // 2))

    def _explored(self, bucket: int, state: BucketState, current: int) -> int | None:
        """Two explorations in three run the *challenger*, the width with the best expected rate after the current
        one: the width whose estimate decides whether the bucket should move (a switch that hysteresis holds back
        while the challenger's cost is only a profiled value is settled by measuring it). The third runs the width
        this bucket has run least recently, so that a width far from the current one (whose cost or acceptance
        estimate may be stale, e.g. from a noisy profile or a change of traffic) is still revisited.

        Either runs only when its own allowance covers its :meth:`regret` (None: not this time); the third takes the
        least recently run of the widths it can afford. Each step accrues ``explore_budget`` of its expected seconds,
        shared equally among the bucket's other widths: a challenger held back by hysteresis costs nothing to
        measure, a width expected to lose half a step waits until its share has grown that much, so a far width
        whose step costs several plain ones (a wide window at a large batch) is revisited rarely without keeping the
        cheap ones from being revisited, and exploration loses at most ``explore_budget`` of the bucket's time. An
        ``explore_budget`` of 1 sets no limit: every due exploration runs, whatever it is expected to lose."""
        others = [w for w in self.widths if w != current]
        far = state.attempts % 3 == 2
        state.attempts += 1
        regrets = {w: self.regret(bucket, current, w) for w in others}
        if self.explore_budget >= 1:  # no limit on what exploring may cost: every due exploration runs
            affordable = others
        else:
            affordable = [w for w in others if regrets[w] <= state.allowance.get(w, 0.0)]
        if far:
            if not affordable:
                return None
            width = min(affordable, key=lambda w: (state.last_run.get(w, -1), w))
        else:
            rates = {w: self.rate(bucket, w) for w in others}
            width = max(others, key=lambda w: (rates[w], -w))
            if width not in affordable:
                return None
        state.allowance[width] = state.allowance.get(width, 0.0) - regrets[width]  # none accrued yet: a new bucket
        state.explorations += 1
        return width

    def observe(
        self,
        batch_size: int,
        width: int,
        accepted: Sequence[int],
        seconds: float | None,
        paths: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """The outcome of a step: ``accepted[r]`` drafts accepted per request, ``seconds`` it took (None if not
        measured), ``paths[r]`` the accepted node numbers of a tree step (:meth:`TreeAcceptance.observe`)."""
        bucket = self.bucket(batch_size)
        if width > 0:
            self.acceptance.observe(width, accepted, paths)
        if seconds is not None and seconds > 0 and math.isfinite(seconds):
            self.costs.observe(bucket, width, seconds)
        state = self.state[bucket]
        if width == state.width and accepted:
            state.realised.add(1.0 + sum(accepted) / len(accepted), self.acceptance.decay)

    def snapshot(self) -> dict:
        """Per bucket the chosen width, expected and realised tokens per step, switches; the estimates."""
        return {
            "buckets": {
                str(b): {
                    "width": s.width,
                    "steps": s.steps,
                    "switches": s.switches,
                    "explorations": s.explorations,
                    "expected_tokens_per_step": round(s.expected_tokens, 4),
                    "realised_tokens_per_step": (round(s.realised.mean(), 4) if s.realised.mean() else None),
                }
                for b, s in self.state.items()
            },
            "acceptance": self.acceptance.snapshot(),
            "costs": self.costs.snapshot(),
            # real over profiled seconds per bucket: how far the start-up profile was from the steps
            "cost_calibration": {str(b): round(self.costs.calibration(b), 4) for b in self.buckets},
        }
