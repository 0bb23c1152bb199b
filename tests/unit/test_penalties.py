"""Penalties at every node of a draft tree (``speculators/penalties.py``) equal those of non-speculative decoding,
computed token by token by an independent oracle over the node's full output sequence: committed outputs, then the
drafts on the path from the root down to the node."""

from __future__ import annotations

import pytest
import torch
from support.spec_helpers import random_tree

from sglang_kimi.speculators.penalties import (
    NO_STOP_TOKEN,
    PenaltyParams,
    apply_penalties,
    node_counts,
    output_counts,
)
from sglang_kimi.speculators.trees import DraftTree, build_chain

VOCAB = 12


def oracle_logits(logits: torch.Tensor, outputs: list[int], frequency, presence, repetition, min_new, stops):
    """The non-speculative sampler's logits for the output token that follows ``outputs``: one vocabulary row,
    float64, penalties counted one output token at a time."""
    row = logits.double().clone()
    for token in range(VOCAB):
        count = sum(1 for t in outputs if t == token)
        row[token] -= frequency * count + (presence if count else 0.0)
    if len(outputs) < min_new:
        for token in stops:
            row[token] = float("-inf")
    for token in set(outputs):
        row[token] = row[token] * repetition if row[token] < 0 else row[token] / repetition
    return row


def path_tokens(tree: DraftTree, b: int, v: int) -> list[int]:
    """The drafts from the root's child down to node v (root excluded), in order."""
    path = []
    while v > 0:
        path.append(int(tree.tokens[b, v]))
        v = int(tree.parents[b, v])
    return path[::-1]


def params(batch: int, gen: torch.Generator) -> PenaltyParams:
    stops = torch.randint(0, VOCAB, (batch, 3), generator=gen)
    stops[:, 2] = NO_STOP_TOKEN  # padding is ignored
    return PenaltyParams(
        frequency=torch.rand(batch, generator=gen) * 2,
        presence=torch.rand(batch, generator=gen) * 2 - 1,
        repetition=torch.rand(batch, generator=gen) + 0.5,
        min_new_tokens=torch.randint(0, 8, (batch,), generator=gen),
        stop_tokens=stops,
    )


@pytest.mark.parametrize("seed", range(20))
def test_every_node_gets_the_penalties_of_its_own_output_sequence(seed):
    gen = torch.Generator().manual_seed(seed)
    batch, slots = 3, 7
    tree = random_tree(gen, batch, slots, VOCAB)
    outputs = [torch.randint(0, VOCAB, (int(n),), generator=gen).tolist() for n in torch.randint(1, 6, (batch,))]
    tree.tokens[:, 0] = torch.tensor([o[-1] for o in outputs])  # the root is the last committed output
    p = params(batch, gen)
    logits = torch.randn((batch * slots, VOCAB), generator=gen) * 3  # [B * N, V]
    raw = logits.clone()
    apply_penalties(logits, tree, output_counts(outputs, VOCAB, "cpu"), torch.tensor([len(o) for o in outputs]), p)

    for b in range(batch):
        for v in range(int(tree.num_nodes[b])):
            expected = oracle_logits(
                raw[b * slots + v],
                outputs[b] + path_tokens(tree, b, v),
                float(p.frequency[b]),
                float(p.presence[b]),
                float(p.repetition[b]),
                int(p.min_new_tokens[b]),
                [int(t) for t in p.stop_tokens[b] if t != NO_STOP_TOKEN],
            )
            got = logits[b * slots + v].double()
            assert torch.equal(torch.isinf(got), torch.isinf(expected)), (b, v)
            finite = torch.isfinite(expected)
            torch.testing.assert_close(got[finite], expected[finite], rtol=1e-5, atol=1e-5)  # float32 vs float64


def dense_node_counts(tree: DraftTree, committed_counts: torch.Tensor) -> torch.Tensor:
    """node_counts' sparse (row, token, count) entries as [B * N, V]; each (row, token) at most once."""
    rows, tokens, counts = node_counts(tree, committed_counts)
    assert len(set(zip(rows.tolist(), tokens.tolist()))) == rows.shape[0] and bool((counts > 0).all())
    dense = torch.zeros((tree.tokens.numel(), committed_counts.shape[1]))
    dense[rows, tokens] = counts
    return dense


def test_a_draft_repeating_the_token_above_it_counts_it():
    """Root r (committed, once), then a chain a, a: node 1 (after one a) and node 2 (after a, a)."""
    chain = build_chain(torch.tensor([5]), torch.tensor([[3, 3]]))
    counts = dense_node_counts(chain, output_counts([[5]], VOCAB, "cpu"))  # [3, V]
    assert counts[:, 5].tolist() == [1, 1, 1]  # the committed root, seen by every node
    assert counts[:, 3].tolist() == [0, 1, 2]
    assert counts.sum().item() == 6


def test_padding_slots_count_nothing():
    tree = DraftTree.from_parents(torch.tensor([[5, 3, 4, 0]]), torch.tensor([[-1, 0, 1, -1]]), torch.tensor([3]))
    counts = dense_node_counts(tree, torch.zeros((1, VOCAB)))
    assert counts.sum(dim=1).tolist() == [0, 1, 2, 0]


def test_committed_counts_of_several_requests():
    counts = output_counts([[1, 1, 4], [], [2]], VOCAB, "cpu")
    assert counts[0, 1] == 2 and counts[0, 4] == 1 and counts[1].sum() == 0 and counts[2, 2] == 1
    assert counts.sum() == 4


def test_min_new_tokens_releases_stop_tokens_at_the_right_depth():
    """Two committed outputs, min_new_tokens 4: output numbers 2 and 3 hold the stop token back, 4 does not. A chain
    of three drafts puts the root at output number 2 and the nodes at 3, 4, 5."""
    chain = build_chain(torch.tensor([1]), torch.tensor([[2, 2, 2]]))
    no = torch.zeros(1)
    p = PenaltyParams(no, no, torch.ones(1), torch.tensor([4]), torch.tensor([[7]]))
    logits = torch.zeros((4, VOCAB))
    apply_penalties(logits, chain, output_counts([[0, 1]], VOCAB, "cpu"), torch.tensor([2]), p)
    assert torch.isinf(logits[:, 7]).tolist() == [True, True, False, False]


def test_step_start_penalties_would_fail_this_oracle():
    """The relaxed rule (the committed counts at every node) is what the oracle must tell apart."""
    chain = build_chain(torch.tensor([1]), torch.tensor([[2, 2]]))
    one = torch.ones(1)
    p = PenaltyParams(one, torch.zeros(1), one, torch.zeros(1, dtype=torch.long), torch.full((1, 1), NO_STOP_TOKEN))
    raw = torch.zeros((3, VOCAB))
    relaxed = raw - output_counts([[1]], VOCAB, "cpu")  # every node: the step-start counts
    exact = raw.clone()
    apply_penalties(exact, chain, output_counts([[1]], VOCAB, "cpu"), torch.tensor([1]), p)
    assert exact[2, 2] == -2 and relaxed[2, 2] == 0
    expected = oracle_logits(raw[2], [1, 2, 2], 1.0, 0.0, 1.0, 0, [])
    assert float(expected[2]) == -2 and not torch.equal(relaxed[2].double(), expected)
