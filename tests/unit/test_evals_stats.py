"""The gate's statistics: per-seed accuracy, paired and unpaired z, the accuracy criterion."""

import math

import pytest

from sglang_kimi.evals.stats import compare, normal_cdf, sample_std, significant_drop


def test_identical_tables_give_zero_difference_and_z():
    table = {0: [1, 1], 1: [0, 1], 2: [0, 0], 3: [1, 0]}
    comp = compare(table, table)
    assert comp.delta == 0 and comp.paired_se == 0 and comp.paired_z == 0 and comp.p_drop == 0.5
    assert comp.baseline_per_seed == comp.candidate_per_seed == [0.5, 0.5]
    assert not significant_drop(comp, max_drop_pp=1.0, alpha=0.05)


def test_paired_z_by_hand():
    # 4 questions, 2 seeds. d_q = mean_s(c - b): [0, -0.5, -1, 0.5]
    base = {0: [1, 1], 1: [1, 0], 2: [1, 1], 3: [0, 0]}
    cand = {0: [1, 1], 1: [0, 0], 2: [0, 0], 3: [1, 0]}
    comp = compare(base, cand)
    d = [0.0, -0.5, -1.0, 0.5]
    m = sum(d) / 4
    se = math.sqrt(sum((x - m) ** 2 for x in d) / 3) / 2
    assert comp.delta == pytest.approx(m) == pytest.approx(-0.25)
    assert comp.paired_se == pytest.approx(se)
    assert comp.paired_z == pytest.approx(m / se)
    assert comp.p_drop == pytest.approx(normal_cdf(m / se))
    # per seed: baseline [3/4, 2/4], candidate [2/4, 1/4]
    assert comp.baseline_per_seed == [0.75, 0.5] and comp.candidate_per_seed == [0.5, 0.25]
    assert comp.baseline_std == pytest.approx(sample_std([0.75, 0.5]))
    unpaired_se = math.sqrt(sample_std([0.75, 0.5]) ** 2 / 2 + sample_std([0.5, 0.25]) ** 2 / 2)
    assert comp.unpaired_z == pytest.approx(-0.25 / unpaired_se)


def test_a_uniform_drop_has_infinite_z_and_fails_the_criterion():
    base = {q: [1, 1, 1] for q in range(5)}
    cand = {q: [0, 0, 0] for q in range(5)}
    comp = compare(base, cand)
    assert comp.delta == -1.0 and comp.paired_z == -math.inf and comp.p_drop == 0.0
    assert significant_drop(comp, max_drop_pp=1.0, alpha=0.05)
    assert comp.as_dict()["paired_z"] == "-inf"


def test_a_drop_within_the_allowance_or_within_noise_passes():
    # 1 of 200 questions flips: drop 0.5 pp < 1 pp
    base = {q: [1] for q in range(200)}
    cand = {q: [0 if q == 0 else 1] for q in range(200)}
    assert not significant_drop(compare(base, cand), max_drop_pp=1.0, alpha=0.05)
    # 2 pp drop, but noisy: 6 worse, 2 better of 200 -> z about -1.4, not significant at 0.05
    base = {q: [1 if q < 6 else 0] for q in range(200)}
    cand = {q: [1 if 6 <= q < 8 else 0] for q in range(200)}
    comp = compare(base, cand)
    assert -100 * comp.delta == pytest.approx(2.0)
    assert -2.0 < comp.paired_z < -1.0
    assert not significant_drop(comp, max_drop_pp=1.0, alpha=0.05)
    assert significant_drop(comp, max_drop_pp=1.0, alpha=0.2)


def test_improvement_never_fails():
    base = {q: [0] for q in range(10)}
    cand = {q: [1] for q in range(10)}
    comp = compare(base, cand)
    assert comp.paired_z == math.inf and comp.p_drop == 1.0
    assert not significant_drop(comp, max_drop_pp=0.0, alpha=0.5)


def test_tables_must_match():
    with pytest.raises(ValueError, match="different questions"):
        compare({0: [1]}, {1: [1]})
    with pytest.raises(ValueError, match="one result per seed"):
        compare({0: [1, 0]}, {0: [1]})


def test_normal_cdf():
    assert normal_cdf(0) == 0.5
    assert normal_cdf(-1.6448536) == pytest.approx(0.05, abs=1e-6)
    assert normal_cdf(-math.inf) == 0.0 and normal_cdf(math.inf) == 1.0
