"""The adaptive width policy on synthetic acceptance and cost curves whose optimum is known: it converges to the
argmax of expected tokens per second per bucket, chooses no speculation when nothing pays, follows a drafter whose
acceptance drops, spends a bounded share of steps exploring and does not thrash between near-equal widths."""

import math
import random

import pytest

from sglang_kimi.speculators.policy import ChainAcceptance, CostTable, TreeAcceptance, WidthPolicy

# P(at least d drafts accepted), d = 1..7: a drafter trained for another release of the target (64%, 34%, 18%,
# 9%, <3%, as measured in the field) and a well-matched one.
MISMATCHED = [0.64, 0.34, 0.18, 0.09, 0.03, 0.01, 0.005]
MATCHED = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
WIDTHS = [0, 1, 2, 3, 4, 5, 6, 7]
BUCKETS = [1, 8, 64]


def step_seconds(batch: int, width: int) -> float:
    """A verify-bound cost: fixed overhead, target tokens (batch x (width + 1)), a draft pass per drafted token."""
    if width == 0:
        return 0.010 + 0.0004 * batch
    return 0.010 + 0.0004 * batch * (width + 1) + 0.0006 * width


def expected(curve: list[float], width: int) -> float:
    return 1 + sum(curve[:width])


def true_best(curve: list[float], batch: int) -> int:
    return max(WIDTHS, key=lambda w: expected(curve, w) / step_seconds(batch, w))


def sample_accepted(curve: list[float], width: int, rng: random.Random) -> int:
    """Accepted drafts of one request: position d is reached with P(>= d) / P(>= d - 1)."""
    accepted, previous = 0, 1.0
    for d in range(width):
        if rng.random() >= curve[d] / previous:
            break
        accepted, previous = accepted + 1, curve[d]
    return accepted


def run(policy: WidthPolicy, curve, batch: int, steps: int, rng: random.Random) -> list:
    decisions = []
    for _ in range(steps):
        decision = policy.choose(batch)
        width = decision.width
        accepted = [sample_accepted(curve, width, rng) for _ in range(batch)]
        policy.observe(batch, width, accepted, step_seconds(batch, width) * rng.uniform(0.97, 1.03))
        decisions.append(decision)
    return decisions


def profiled_costs() -> CostTable:
    costs = CostTable()
    for bucket in BUCKETS:
        for width in (0, 1, 4, 7):  # a coarse start-up profile; the rest interpolated, then measured
            costs.set(bucket, width, step_seconds(bucket, width))
    return costs


@pytest.mark.parametrize("curve", [MISMATCHED, MATCHED], ids=["mismatched", "matched"])
@pytest.mark.parametrize("batch", BUCKETS)
def test_converges_to_the_best_width(curve, batch):
    policy = WidthPolicy(WIDTHS, BUCKETS, ChainAcceptance(7), profiled_costs())
    decisions = run(policy, curve, batch, 1500, random.Random(batch))
    best = true_best(curve, batch)
    chosen = policy.state[policy.bucket(batch)].width
    rate = expected(curve, chosen) / step_seconds(batch, chosen)
    best_rate = expected(curve, best) / step_seconds(batch, best)
    assert rate >= 0.97 * best_rate, (chosen, best)
    exploring = sum(d.explore for d in decisions)
    assert exploring <= len(decisions) // policy.explore_every + 2  # the bounded share, plus two early explorations


def test_the_field_case_picks_two_drafts_not_seven():
    # the mismatched drafter at batch 8: seven drafts cost more than they gain, one to three pay off
    assert true_best(MISMATCHED, 8) in (1, 2, 3) and expected(MISMATCHED, 7) / step_seconds(8, 7) < 1 / step_seconds(
        8, 0
    )
    policy = WidthPolicy(WIDTHS, BUCKETS, ChainAcceptance(7), profiled_costs())
    run(policy, MISMATCHED, 8, 1500, random.Random(0))
    assert policy.state[8].width in (1, 2, 3)


def test_no_speculation_when_nothing_pays():
    hopeless = [0.05, 0.01, 0.0, 0.0, 0.0, 0.0, 0.0]
    policy = WidthPolicy(WIDTHS, BUCKETS, ChainAcceptance(7), profiled_costs())
    run(policy, hopeless, 64, 1500, random.Random(1))
    assert policy.state[64].width == 0
    assert true_best(hopeless, 64) == 0


def test_follows_a_drop_in_acceptance():
    policy = WidthPolicy(WIDTHS, BUCKETS, ChainAcceptance(7, decay=0.99), profiled_costs())
    run(policy, MATCHED, 8, 800, random.Random(2))
    high = policy.state[8].width
    run(policy, MISMATCHED, 8, 1500, random.Random(3))
    low = policy.state[8].width
    assert high >= true_best(MATCHED, 8) - 1 and low <= true_best(MISMATCHED, 8) + 1 and low < high


def test_a_profile_off_by_a_common_factor_does_not_send_the_bucket_touring():
    # the start-up profile runs on dummy inputs and misses part of a real step: every real step takes 1.6x what the
    # profile said. Once the chosen width has run, the widths known only from the profile must be compared at the
    # same scale, else each looks cheaper than the measured one and the bucket visits them all in turn
    batch, off = 8, 1.6
    costs = CostTable()
    for width in WIDTHS:
        costs.set(batch, width, step_seconds(batch, width) / off)
    acceptance = ChainAcceptance(7, decay=0.9999)
    rng = random.Random(6)
    for _ in range(500):  # the drafter's acceptance already learned (it is shared by every bucket)
        acceptance.observe(7, [sample_accepted(MISMATCHED, 7, rng) for _ in range(batch)])
    best = true_best(MISMATCHED, batch)
    policy = WidthPolicy(WIDTHS, [batch], acceptance, costs, initial_width=best, explore_every=1000)
    for _ in range(40):
        width = policy.choose(batch).width
        accepted = [sample_accepted(MISMATCHED, width, rng) for _ in range(batch)]
        policy.observe(batch, width, accepted, step_seconds(batch, width))
    assert policy.state[batch].switches == 0 and policy.state[batch].width == best
    assert policy.costs.calibration(batch) == pytest.approx(off, rel=0.05)
    for width in WIDTHS:  # never run: its profiled value, calibrated
        if width != best:
            assert policy.costs.seconds(batch, width) == pytest.approx(step_seconds(batch, width), rel=0.05)


def test_hysteresis_keeps_near_ties_from_thrashing():
    # two widths within 1% of each other: the choice may settle on either, but must not flip back and forth
    costs = CostTable()
    for width, seconds in ((2, 0.0200), (3, 0.0202)):
        costs.set(8, width, seconds)
    acceptance = TreeAcceptance([2, 3])
    policy = WidthPolicy([2, 3], [8], acceptance, costs, hysteresis=0.05)
    rng = random.Random(4)
    for _ in range(2000):
        width = policy.choose(8).width
        tau = 2.0 if width == 2 else 2.02
        policy.observe(8, width, [round(tau - 1 + rng.uniform(-0.5, 0.5))] * 8, (0.0200 if width == 2 else 0.0202))
    assert policy.state[8].switches <= 3


def test_tree_budgets_peak_at_an_intermediate_budget():
    # tau keeps rising with the budget, the verify cost too: the speedup peaks in the middle
    budgets = [0, 4, 8, 16, 32, 64]

    def tau(b):
        return 1.0 if b == 0 else 1 + 4 * (1 - 0.9**b)

    def cost(b):
        return 0.02 + 0.0006 * b

    costs = CostTable()
    for b in budgets:
        costs.set(16, b, cost(b))
    policy = WidthPolicy(budgets, [16], TreeAcceptance(budgets), costs)
    rng = random.Random(5)
    for _ in range(3000):
        width = policy.choose(16).width
        policy.observe(16, width, [max(0, round(tau(width) - 1 + rng.uniform(-0.5, 0.5))) for _ in range(16)], None)
    best = max(budgets, key=lambda b: tau(b) / cost(b))
    assert best not in (0, 64) and policy.state[16].width == best


def test_expected_tokens_and_snapshot():
    acceptance = ChainAcceptance(3, prior_weight=1e-9)
    acceptance.observe(3, [3, 1, 0, 2])  # positions reached: 1 by 4, 2 by 3, 3 by 2; accepted 3, 2, 1
    assert acceptance.conditional(1) == pytest.approx(3 / 4)
    assert acceptance.conditional(2) == pytest.approx(2 / 3)
    assert acceptance.conditional(3) == pytest.approx(1 / 2)
    assert acceptance.expected_tokens(3) == pytest.approx(1 + 0.75 + 0.5 + 0.25)
    policy = WidthPolicy([0, 1, 2, 3], [4], acceptance, profiled_costs())
    snap = policy.snapshot()
    assert snap["buckets"]["4"]["width"] == 3 and snap["acceptance"][0] == pytest.approx(0.75)


def test_bad_configurations_are_refused():
    with pytest.raises(ValueError, match="ascending"):
        WidthPolicy([2, 1], [1], ChainAcceptance(2), CostTable())
    with pytest.raises(ValueError, match="buckets"):
        WidthPolicy([0, 1], [0], ChainAcceptance(2), CostTable())
    with pytest.raises(ValueError, match="explore_every"):
        WidthPolicy([0, 1], [1], ChainAcceptance(2), CostTable(), explore_every=1)
    with pytest.raises(ValueError, match="initial width"):
        WidthPolicy([0, 1], [1], ChainAcceptance(2), CostTable(), initial_width=5)


def test_without_a_profile_the_extreme_widths_are_measured_before_any_is_compared():
    widths = [0, 1, 2, 4]
    policy = WidthPolicy(widths, [1, 8], ChainAcceptance(4), CostTable(), explore_every=20)
    seen = []
    for _ in range(2):
        decision = policy.choose(8)
        assert decision.explore
        seen.append(decision.width)
        policy.observe(8, decision.width, [min(decision.width, 1)], 0.01 * (1 + decision.width))
    assert seen == [0, 4]
    assert policy.costs.seconds(8, 2) == pytest.approx(0.03)  # the rest interpolated
    assert policy.choose(1).explore  # bucket 1 has no measurements yet: it measures too


def test_a_far_width_with_a_stale_estimate_is_revisited_and_recovered():
    """A noisy profile made widths 3..7 look 30x dearer than they are; exploring only the current width's
    neighbours would never measure them again."""
    widths = list(range(8))
    true_cost = {w: 0.010 + 0.0005 * w for w in widths}  # batch 1: verify cost barely grows
    costs = CostTable()
    for w in widths:
        costs.set(1, w, true_cost[w] * (30 if w >= 3 else 1))
    policy = WidthPolicy(widths, [1], ChainAcceptance(7), costs, explore_every=10)
    rng = random.Random(0)
    for _ in range(3000):
        width = policy.choose(1).width
        accepted = next((d for d in range(width) if rng.random() > 0.9), width)  # 90% per position
        policy.observe(1, width, [accepted], true_cost[width])
    assert policy.state[1].width >= 5


def test_tree_estimates_are_pooled_into_a_non_decreasing_curve():
    acceptance = TreeAcceptance([1, 4, 8, 16, 32], decay=1.0)
    assert not acceptance.observed() and acceptance.expected_tokens(16) == pytest.approx(1.5)  # 1 + optimism
    acceptance.observe(4, [3, 3, 3])  # width 4: mean 4 tokens over 3 samples
    acceptance.observe(16, [1])  # width 16: one unlucky sample (2 tokens)
    assert acceptance.observed()
    assert acceptance.expected_tokens(4) == pytest.approx(3.5)  # (4 * 3 + 2 * 1) / 4
    assert acceptance.expected_tokens(16) == pytest.approx(3.5)
    assert acceptance.expected_tokens(1) == pytest.approx(2.0)  # unobserved: capped at 1 + width
    acceptance.observe(16, [7, 7, 7, 7])
    assert acceptance.expected_tokens(4) == pytest.approx(4.0)
    assert acceptance.expected_tokens(16) == pytest.approx((2 + 4 * 8) / 5)
    # unobserved between 4 and 16: interpolated in log(1 + width), plus the optimism, at most the width above
    between = 4.0 + (6.8 - 4.0) * math.log(5) / math.log(13) + 0.5
    assert acceptance.expected_tokens(8) == pytest.approx(between) and between < 6.8
    assert acceptance.expected_tokens(32) == pytest.approx(6.8 + 0.5)  # above every observed width: + optimism


def test_the_first_steps_run_the_initial_width_until_the_drafter_is_observed():
    """Before any acceptance is known every draft looks alike, and a cheap width (0 above all) would win on cost
    alone; then width 0 would never learn anything of the drafter. The first steps run the initial width."""
    budgets = [0, 1, 4, 16]
    costs = CostTable()
    for b in budgets:
        costs.set(1, b, 0.010 + 0.0002 * b)  # batch 1: a wider verify costs little more
    policy = WidthPolicy(budgets, [1, 8], TreeAcceptance(budgets), costs)
    assert [policy.choose(1).width for _ in range(3)] == [16, 16, 16]
    policy.observe(1, 16, [5], 0.0132)
    # 6 tokens in 13.2 ms beat the unobserved widths' optimistic estimates (4: 4.3 tokens in 10.8 ms)
    assert policy.choose(1).width == 16 and policy.state[1].switches == 0


def field_case_at_64(**kw) -> WidthPolicy:
    """Chains of 0..7 at batch 64, profiled with their true step costs (``kw``: WidthPolicy settings)."""
    costs = CostTable()
    for w in range(8):
        costs.set(64, w, step_seconds(64, w))
    return WidthPolicy(list(range(8)), [64], ChainAcceptance(7), costs, **kw)


def test_exploration_loses_at_most_its_budget_where_other_widths_cost_several_steps():
    """The field case at batch 64: no speculation is best and a chain of 7 costs several plain steps. Exploring
    at every step the schedule allows (1 in 20, a far width every third time) loses ~2% here; the budget (1% of the
    bucket's time by default) bounds it, and every width is still revisited."""
    widths, batch, steps = list(range(8)), 64, 3000

    def lost(policy: WidthPolicy) -> float:
        rng, seconds, ran = random.Random(4), 0.0, set()
        for _ in range(steps):
            width = policy.choose(batch).width
            ran.add(width)
            accepted = [sample_accepted(MISMATCHED, width, rng) for _ in range(batch)]
            policy.observe(batch, width, accepted, step_seconds(batch, width))
            seconds += step_seconds(batch, width) * expected(MISMATCHED, 0) / (1 + sum(accepted) / batch)
        assert ran == set(widths)
        return seconds / (steps * step_seconds(batch, 0)) - 1  # time per committed token over width 0's

    budgeted, unbounded = lost(field_case_at_64()), lost(field_case_at_64(explore_budget=1.0))
    assert budgeted < 0.01 < unbounded, (budgeted, unbounded)


def test_no_limit_on_the_budget_runs_every_due_exploration():
    """``explore_budget`` 1 (how the end-to-end tests force widths to switch): every step the schedule marks as due
    explores, even where each exploration is expected to lose most of a step; the default budget skips most."""
    batch, steps = 64, 400

    def explorations(policy: WidthPolicy) -> tuple[int, int]:
        rng, explored, due = random.Random(5), 0, 0
        for step in range(1, steps + 1):
            decision = policy.choose(batch)
            explored += decision.explore
            due += policy.acceptance.observed() and policy.exploration_due(step)
            accepted = [sample_accepted(MISMATCHED, decision.width, rng) for _ in range(batch)]
            policy.observe(batch, decision.width, accepted, step_seconds(batch, decision.width))
        return explored, due

    explored, due = explorations(field_case_at_64(explore_budget=1))
    assert due > 20 and explored >= due
    budgeted, _ = explorations(field_case_at_64())
    assert budgeted < due / 2, (budgeted, due)


@pytest.mark.parametrize("budget", [None, 1.0])
def test_a_new_bucket_can_explore_at_its_first_step(budget):
    """A bucket's first step may be due to explore (``explore_every`` 2) once another bucket has observed the drafter:
    nothing has accrued to its widths' allowances yet, and the challenger runs when it can be afforded (with no
    limit; or, with the default budget, because it is expected to lose nothing: better than the current width, by
    less than the hysteresis that holds the bucket back)."""
    widths = [0, 1, 2, 4]
    costs = CostTable()
    for bucket in (1, 8):
        for w, seconds in zip(widths, [0.8, 1.0, 1.3, 1.6]):
            costs.set(bucket, w, seconds)  # wider commits more per second, by less than the hysteresis of 90%
    policy = WidthPolicy(widths, [1, 8], ChainAcceptance(4), costs, initial_width=1, explore_every=2,
                         hysteresis=0.9, explore_budget=budget)  # fmt: skip
    rng = random.Random(6)
    for _ in range(6):
        width = policy.choose(1).width
        policy.observe(1, width, [sample_accepted(MATCHED, width, rng)], 1.0)
    decision = policy.choose(8)
    assert policy.exploration_due(1) and decision.explore and decision.width in widths


def test_a_position_beyond_the_running_width_keeps_what_it_last_measured():
    """At a batch of 64, a bucket running 2 drafts observes positions 1..2 every step; positions 3..7, measured
    by one step of 7, must not fade back to the prior meanwhile (a decay per request-step of every position
    forgot them within a few steps)."""
    acceptance = ChainAcceptance(7)
    acceptance.observe(7, [7] * 64)  # every draft accepted: positions 1..7 at ~1
    for _ in range(200):
        acceptance.observe(2, [1] * 32 + [2] * 32)  # positions 1..2 at 1 and 0.5
    assert acceptance.conditional(2) == pytest.approx(0.5, abs=0.02)
    assert acceptance.conditional(5) > 0.9  # measured at ~1 by the step of 7, and kept
    assert acceptance.expected_tokens(7) > acceptance.expected_tokens(2) + 0.9 * 5 * 0.5
