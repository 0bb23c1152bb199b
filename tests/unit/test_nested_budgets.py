"""DDTree budgets are nested, so one verified step of a wide tree says what every narrower budget would have accepted
on the same request (``speculators.policy.nodes_within``), and the adaptive policy's tree estimate measures every
candidate width up to the one it ran (``TreeAcceptance.observe`` with the accepted paths).

The claim is checked against the project's own tree build and verification: trees of budgets 1..W are built from
the same ranked drafts, each verified against the same target (each node's target row a function of the tokens on
its path, as a real target's is) with the same coins per node, and the narrow tree's accepted drafts must be the
wide path's leading nodes within the budget, greedy and sampled alike."""

from __future__ import annotations

import random

import pytest
import torch

from sglang_kimi.speculators.ddtree import build_ddtree_ranked, rank_draft_logits
from sglang_kimi.speculators.policy import TreeAcceptance, WidthPolicy, nodes_within
from sglang_kimi.speculators.trees import NO_PARENT
from sglang_kimi.speculators.verify import Coins, verify_tree

VOCAB, DEPTH, WIDE = 5, 6, 24


def node_paths(tree) -> list[list[tuple[int, ...]]]:
    """Per request and node, the tokens from the first draft down to the node (the root's: ())."""
    out = []
    for tokens, parents, n in zip(tree.tokens.tolist(), tree.parents.tolist(), tree.num_nodes.tolist()):
        paths: list[tuple[int, ...]] = []
        for i in range(len(tokens)):
            p = parents[i]
            paths.append(() if i == 0 or i >= n or p == NO_PARENT else paths[p] + (tokens[i],))
        out.append(paths)
    return out


def target_rows(tree, seed: int) -> torch.Tensor:
    """[B, N, V] logits: each node's row drawn from a generator seeded by its request and its path's tokens."""
    rows = []
    for b, paths in enumerate(node_paths(tree)):
        per_node = []
        for path in paths:
            rng = random.Random(f"{seed}:{b}:{path}")
            per_node.append([3.0 * rng.random() for _ in range(VOCAB)])
        rows.append(per_node)
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize("sampled", [False, True])
def test_a_narrower_budget_accepts_the_wide_paths_nodes_within_it(sampled):
    batch = 64
    gen = torch.Generator().manual_seed(7)
    draft_logits = 2.0 * torch.randn(batch, DEPTH, VOCAB, generator=gen)  # [B, D, V]
    root = torch.randint(0, VOCAB, (batch,), generator=gen)
    coins = torch.rand(2, batch, WIDE + 1, generator=gen)  # per node number: the same node in every tree

    def accepted_nodes(budget: int):
        ranked_lp, ranked_ids = rank_draft_logits(draft_logits, min(budget, VOCAB))
        tree = build_ddtree_ranked(root, ranked_lp, ranked_ids, budget)
        logits = target_rows(tree, seed=11)
        n = tree.num_slots
        if sampled:
            result = verify_tree(tree, target_probs=logits.softmax(-1), coins=Coins(coins[0, :, :n], coins[1, :, :n]))
        else:
            result = verify_tree(tree, target_logits=logits)
        return [[x for x in row[1:] if x > 0] for row in result.accepted_nodes.tolist()], result.num_accepted

    wide_paths, wide_accepted = accepted_nodes(WIDE)
    assert [len(p) for p in wide_paths] == wide_accepted.tolist()
    assert all(p == sorted(p) for p in wide_paths)  # best first: node numbers increase along a path
    # drafts accepted often, deep and far down the numbering: narrow budgets cut the paths in many ways
    assert sum(map(len, wide_paths)) > batch // 2 and sum(len(p) >= 2 for p in wide_paths) >= 8
    assert sum(bool(p) and p[-1] > 4 for p in wide_paths) >= 8
    for budget in range(1, WIDE):
        paths, accepted = accepted_nodes(budget)
        assert accepted.tolist() == [nodes_within(p, budget) for p in wide_paths], budget
        assert paths == [p[: nodes_within(p, budget)] for p in wide_paths], budget


def test_nodes_within_counts_the_leading_nodes():
    assert nodes_within([1, 3, 9], 4) == 2
    assert nodes_within([1, 3, 9], 9) == 3
    assert nodes_within([2], 1) == 0
    assert nodes_within([], 8) == 0


def test_a_step_with_paths_measures_every_narrower_width_on_the_same_requests():
    paths = [[1, 2, 5], [2], [], [1, 3, 4, 8]]
    widths = (1, 2, 4, 8, 16)
    est = TreeAcceptance(widths, decay=1.0)
    est.observe(8, [len(p) for p in paths], paths)
    assert est.snapshot() == {
        1: pytest.approx(1 + (1 + 0 + 0 + 1) / 4),
        2: pytest.approx(1 + (2 + 1 + 0 + 1) / 4),
        4: pytest.approx(1 + (2 + 1 + 0 + 3) / 4),
        8: pytest.approx(1 + (3 + 1 + 0 + 4) / 4),
        16: None,  # wider than the step: not measured
    }
    # without paths only the width that ran is measured, as before
    plain = TreeAcceptance(widths, decay=1.0)
    plain.observe(8, [len(p) for p in paths])
    assert plain.snapshot() == {1: None, 2: None, 4: None, 8: pytest.approx(3.0), 16: None}


def test_the_policy_passes_a_tree_steps_paths_to_its_estimate():
    from sglang_kimi.speculators.policy import CostTable

    widths = (0, 1, 2, 4, 8)
    costs = CostTable()
    for w in widths:
        costs.set(1, w, 0.01 * (1 + w / 8))
    policy = WidthPolicy(widths, (1,), TreeAcceptance(widths), costs)
    policy.observe(1, 8, [2], 0.02, [[1, 6]])
    assert policy.acceptance.snapshot()[1] == pytest.approx(2.0) and policy.acceptance.snapshot()[4] == 2.0
    assert policy.acceptance.snapshot()[8] == pytest.approx(3.0)
