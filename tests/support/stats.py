"""The tests' one chi-square helper (SciPy's chi-square distribution), for every distribution test in the suite."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from scipy.stats import chi2


def chi2_pvalue(counts, probs) -> float:
    """Pearson goodness of fit of observed ``counts`` [C] against cell probabilities ``probs`` [C] (tensors,
    sequences, or dicts keyed by cell). A count in a zero-probability cell is impossible: p = 0."""
    if isinstance(probs, Mapping):
        if any(key not in probs for key in counts):
            return 0.0
        keys = list(probs)
        counts = [counts.get(k, 0) for k in keys]
        probs = [probs[k] for k in keys]
    counts = torch.as_tensor(counts, dtype=torch.float64).flatten()
    probs = torch.as_tensor(probs, dtype=torch.float64).flatten()
    if bool((counts[probs == 0] > 0).any()):
        return 0.0
    support = probs > 0
    expected = probs[support] / probs[support].sum() * counts.sum()
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    return float(chi2.sf(stat, int(support.sum()) - 1))


def homogeneity_pvalue(a: Mapping, b: Mapping) -> float:
    """Two equal-size samples of counts by cell (dicts): the chi-square test that they come from one law."""
    keys = sorted(set(a) | set(b))
    stat = sum((a.get(k, 0) - b.get(k, 0)) ** 2 / (a.get(k, 0) + b.get(k, 0)) for k in keys)
    return float(chi2.sf(stat, len(keys) - 1))


def uniform_pvalue(values: Sequence[float], bins: int) -> float:
    """Values in [0, 1) against the uniform law, in ``bins`` equal bins."""
    counts = torch.histc(torch.as_tensor(values, dtype=torch.float64), bins=bins, min=0.0, max=1.0)
    return chi2_pvalue(counts, torch.full((bins,), 1.0 / bins))
