"""Per-position acceptance counters."""

from types import SimpleNamespace

import torch

from sglang_kimi.settings import PluginArgs
from sglang_kimi.speculative.metrics import AcceptanceStats, max_draft_depth


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


def test_nonfinite_drafts_are_counted_on_the_device_and_settled_on_the_host(caplog):
    """The tree worker adds each step's non-finite draft positions without a host sync; the totals reach the host
    every SETTLE_EVERY steps (after SGLang brought a step's results there) and when /server_info asks, with one
    warning the first time any appear."""
    from sglang_kimi.speculative.metrics import DraftHealth

    health = DraftHealth()
    health.settle()  # nothing added yet
    assert (health.positions, health.steps) == (0, 0)
    clean = torch.zeros(2, 3, 4, dtype=torch.bool)  # [bs, positions, K]
    bad = clean.clone()
    bad[0, 1, 2] = bad[0, 1, 3] = bad[1, 0, 0] = True  # 2 positions (one with 2 bad candidates)
    with caplog.at_level("WARNING", logger="sglang_kimi"):
        for i, mask in enumerate((clean, bad, clean, bad)):  # steps in and out of inference mode (profiles, decode)
            with torch.inference_mode(i % 2 == 0):
                health.add(mask)
        assert (health.positions, health.steps) == (0, 0)  # still on the device
        for _ in range(DraftHealth.SETTLE_EVERY - 1):
            health.step_done(prometheus=False)
        assert (health.positions, health.steps) == (0, 0)
        health.step_done(prometheus=False)
        assert (health.positions, health.steps) == (4, 2)
        health.add(bad)
        health.settle()  # as /server_info does
        assert (health.positions, health.steps) == (6, 3)
    warnings = [r.getMessage() for r in caplog.records if "non-finite logits" in r.getMessage()]
    assert len(warnings) == 1 and "4 draft positions in 2 steps" in warnings[0]
