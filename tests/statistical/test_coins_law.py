"""Seeded verification coins are uniform on [0, 1) and uncorrelated across columns and steps."""

import torch
from support.stats import chi2_pvalue

from sglang_kimi.speculators.verify import seeded_coins

SLOTS = 9


def test_seeded_coins_are_uniform():
    # 200 seeds x 250 steps x 18 coins = 900k coins in 50 bins: a 1% excess in one bin would give p ~ 1e-5
    seeds = torch.arange(200).repeat_interleave(250)
    offsets = torch.arange(250).repeat(200)
    coins = seeded_coins(seeds, offsets, SLOTS)
    values = torch.cat([coins.uniform, coins.final], dim=1).flatten()
    counts = torch.histc(values, bins=50, min=0.0, max=1.0)
    assert chi2_pvalue(counts, torch.full((50,), 1 / 50)) > 1e-4
    # neighbouring columns and steps are not correlated
    corr = torch.corrcoef(torch.stack([coins.uniform[:, 0], coins.uniform[:, 1], coins.final[:, 0]]))
    assert float((corr - torch.eye(3)).abs().max()) < 0.02
