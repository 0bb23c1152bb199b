"""Statistics of the GSM8K gate: per-seed accuracy, the candidate-minus-baseline difference and its z statistic.

Data: ``x[q][s]`` in {0, 1} is lm-eval's exact_match of question ``q`` (the same ``--limit`` test questions in
every run) under seed ``s`` (the seed picks the few-shot examples and the request's sampling seed), one table
for the baseline (``b``) and one for the candidate (``c``). For a given (q, s) both servers receive the very
same prompt, so the two tables are *paired*.

Accuracy of a seed: ``acc_s = mean_q x[q][s]``; reported as mean and sample standard deviation (ddof 1) over
seeds.

Difference: ``delta = mean(c) - mean(b)`` (a fraction; negative is a drop). The report shows it in
percentage points.

**Paired z (the verdict's test).** ``d_q = mean_s (c[q][s] - b[q][s])``, the per-question difference averaged
over seeds; ``delta = mean_q d_q``, ``se = std_q(d_q, ddof 1) / sqrt(Q)``, ``z = delta / se``. Questions are the
independent units: the runs of one question under several seeds share the question, so they are clustered
(treating the Q*S results as independent would understate the standard error). Pairing removes the
question-difficulty variance that both servers share: two servers that answer every question alike give
``d_q = 0``, ``se = 0`` and ``z = 0`` however hard the questions, and a real drop shows up in the few
questions whose outcome changed. An unpaired test sees the full binomial noise of both accuracies and needs
many times more questions to detect the same drop.

**Unpaired z (reported for reference).** ``z = delta / sqrt(var_b / S + var_c / S)`` from the per-seed
accuracies: the right test only when the two runs did not answer the same prompts.

Edge cases: ``se == 0`` gives ``z = 0`` when ``delta == 0`` and ``+-inf`` otherwise (every question moved the same
way); with one question there is no variance estimate and ``se`` is taken as 0. The one-sided p-value of a
drop is ``P(Z <= z) = Phi(z)``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def sample_std(values: Sequence[float]) -> float:
    """Standard deviation with ddof 1; 0.0 for fewer than two values (no spread can be estimated)."""
    return statistics.stdev(values) if len(values) >= 2 else 0.0


def normal_cdf(z: float) -> float:
    """Phi(z) of the standard normal distribution (exact at +-inf)."""
    if math.isinf(z):
        return 1.0 if z > 0 else 0.0
    return statistics.NormalDist().cdf(z)


def _z(delta: float, se: float) -> float:
    if se > 0:
        return delta / se
    return 0.0 if delta == 0 else math.copysign(math.inf, delta)


@dataclass(frozen=True)
class Comparison:
    """Candidate vs baseline on one metric; accuracies and ``delta`` are fractions in [0, 1] / [-1, 1]."""

    questions: int  # Q
    seeds: int  # S
    baseline_per_seed: list[float]  # [S]
    candidate_per_seed: list[float]  # [S]
    baseline_mean: float
    baseline_std: float
    candidate_mean: float
    candidate_std: float
    delta: float  # candidate - baseline
    paired_se: float
    paired_z: float
    p_drop: float  # one-sided p-value of "candidate is worse", from the paired z
    unpaired_z: float

    def as_dict(self) -> dict:
        out = asdict(self)
        # JSON has no infinity: keep the sign readable.
        for key in ("paired_z", "unpaired_z"):
            if math.isinf(out[key]):
                out[key] = "inf" if out[key] > 0 else "-inf"
        return out


def compare(baseline: Mapping[int, Sequence[float]], candidate: Mapping[int, Sequence[float]]) -> Comparison:
    """Paired comparison of ``{question: [x per seed]}`` tables (same questions, same seed order, 0/1 values)."""
    if set(baseline) != set(candidate):
        raise ValueError("baseline and candidate were scored on different questions")
    questions = sorted(baseline)
    if not questions:
        raise ValueError("no questions to compare")
    seeds = len(baseline[questions[0]])
    if any(len(baseline[q]) != seeds or len(candidate[q]) != seeds for q in questions):
        raise ValueError("every question needs one result per seed in both tables")

    # [S] accuracies per seed
    b_seed = [mean([baseline[q][s] for q in questions]) for s in range(seeds)]
    c_seed = [mean([candidate[q][s] for q in questions]) for s in range(seeds)]
    # [Q] per-question difference, averaged over seeds
    d = [mean([candidate[q][s] - baseline[q][s] for s in range(seeds)]) for q in questions]
    delta = mean(d)
    paired_se = sample_std(d) / math.sqrt(len(d))
    paired_z = _z(delta, paired_se)
    unpaired_se = math.sqrt(sample_std(b_seed) ** 2 / seeds + sample_std(c_seed) ** 2 / seeds)
    return Comparison(
        questions=len(questions),
        seeds=seeds,
        baseline_per_seed=b_seed,
        candidate_per_seed=c_seed,
        baseline_mean=mean(b_seed),
        baseline_std=sample_std(b_seed),
        candidate_mean=mean(c_seed),
        candidate_std=sample_std(c_seed),
        delta=delta,
        paired_se=paired_se,
        paired_z=paired_z,
        p_drop=normal_cdf(paired_z),
        unpaired_z=_z(mean(c_seed) - mean(b_seed), unpaired_se),
    )


def significant_drop(comparison: Comparison, max_drop_pp: float, alpha: float) -> bool:
    """The accuracy criterion: the drop exceeds ``max_drop_pp`` percentage points AND is significant.

    ``drop = -delta`` (in points) must be larger than the allowed drop, and the paired one-sided p-value
    below ``alpha``: a drop within the noise of the sample does not fail the gate, a drop the sample
    establishes does. With greedy decoding the identical-generations check is the sharper criterion (see
    ``sglang_kimi.evals.gsm8k``).
    """
    drop_pp = -100.0 * comparison.delta
    return drop_pp > max_drop_pp and comparison.p_drop < alpha
