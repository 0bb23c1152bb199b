"""Per-position acceptance counters."""

from types import SimpleNamespace

import torch

from sglang_kimi.metrics import AcceptanceStats, max_draft_depth
from sglang_kimi.options import PluginArgs


def test_counts_per_position_and_histogram():
    stats = AcceptanceStats(max_depth=3, prometheus=False)
    stats.record(torch.tensor([0, 3, 1]))
    stats.record(torch.tensor([2]))
    snap = stats.snapshot()
    assert snap["steps"] == 4
    assert snap["accept_length_histogram"] == [1, 1, 1, 1]
    assert snap["drafted_per_position"] == [4, 4, 4]
    assert snap["accepted_per_position"] == [3, 2, 1]  # steps with >= 1, >= 2, >= 3 accepted
    assert snap["acceptance_rate_per_position"] == [0.75, 0.5, 0.25]
    assert snap["tau"] == 1 + (0 + 3 + 1 + 2) / 4


def test_tau_matches_mean_output_tokens_per_step():
    gen = torch.Generator().manual_seed(1)
    stats = AcceptanceStats(max_depth=7, prometheus=False)
    accepted = torch.randint(0, 8, (500,), generator=gen)
    for chunk in accepted.split(37):
        stats.record(chunk)
    snap = stats.snapshot()
    assert abs(snap["tau"] - (accepted.double().mean().item() + 1)) < 1e-12
    assert sum(snap["accepted_per_position"]) == accepted.sum().item()


def test_max_depth_per_configuration():
    def spec(**kw):
        return SimpleNamespace(**{"speculative_eagle_topk": 1, "speculative_num_steps": 3, **kw})

    none = PluginArgs()
    assert max_draft_depth(spec(speculative_algorithm="DFLASH", speculative_num_draft_tokens=8), none) == 7
    assert max_draft_depth(spec(speculative_algorithm="EAGLE3", speculative_num_draft_tokens=4), none) == 3
    tree = spec(
        speculative_algorithm="EAGLE3",
        speculative_eagle_topk=4,
        speculative_num_steps=5,
        speculative_num_draft_tokens=16,
    )
    assert max_draft_depth(tree, none) == 5
    ddtree = PluginArgs(dflash_tree_budget=32, dflash_tree_block=8)
    assert max_draft_depth(spec(speculative_algorithm="DFLASH", speculative_num_draft_tokens=33), ddtree) == 7


def test_no_steps_and_undrafted_positions_have_no_rate():
    stats = AcceptanceStats(max_depth=4, prometheus=False)
    assert stats.snapshot()["tau"] is None
    stats.record(torch.tensor([1, 2]), depth=2)  # an adaptive step that drafted positions 1..2 only
    snap = stats.snapshot()
    assert snap["acceptance_rate_per_position"] == [1.0, 0.5, None, None]
    assert snap["tau"] == 2.5
