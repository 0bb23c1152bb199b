"""Tau and per-position acceptance rates from acceptance counters: the one formula for both.

A decode step drafts positions 1..D and accepts ``a`` of them (bonus excluded), so it commits ``a + 1`` tokens.
From ``histogram[a]`` (steps that accepted ``a`` drafts):

    tau = sum_a (a + 1) * histogram[a] / sum_a histogram[a] = 1 + sum_a a * histogram[a] / steps

and from ``accepted[d]`` / ``drafted[d]`` (steps that accepted at least / drafted position ``d``) the rate at ``d``.
Counted by :class:`sglang_kimi.speculative.metrics.AcceptanceStats`, merged over ranks by
:mod:`sglang_kimi.launcher.dp_reports`,
differenced per benchmark level by ``evals.acceptance``.
"""

from __future__ import annotations

from collections.abc import Sequence


def tau(histogram: Sequence[int]) -> float | None:
    """Output tokens per verify step; None before the first step."""
    steps = sum(histogram)
    if steps <= 0:
        return None
    return 1 + sum(a * n for a, n in enumerate(histogram)) / steps


def rates(accepted: Sequence[int], drafted: Sequence[int]) -> list[float | None]:
    """``accepted[d] / drafted[d]`` per position; None where the position was never drafted."""
    return [(a / d) if d > 0 else None for a, d in zip(accepted, drafted)]
