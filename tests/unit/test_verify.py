"""Verification: exact greedy cases, SGLang's sampler processing, determinism per seed, consistent results. The
distribution tests of sampled verification are ``tests/statistical/test_verify_law.py``."""

from __future__ import annotations

import pytest
import torch
from support.spec_helpers import random_tree, sglang_speculative, single_thread  # noqa: F401

from sglang_kimi.speculators.trees import NO_NODE, PAD_TOKEN_ID, DraftTree, build_chain
from sglang_kimi.speculators.verify import (
    process_logits,
    verify_chain_stochastic,
    verify_greedy,
    verify_sampled,
)

VOCAB = 6
TREE_SLOTS = 8


def one_hot_logits(predict: list[list[int]], vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(predict), vocab).float()


# --------------------------------------------------------------------------------------------------------------
# Greedy: exact cases


def test_greedy_chain_cases() -> None:
    chain = build_chain(torch.tensor([9, 9, 9]), torch.tensor([[1, 2, 3], [1, 2, 3], [4, 2, 3]]))
    # argmax at nodes 0..3 of each request
    result = verify_greedy(chain, one_hot_logits([[1, 2, 3, 7], [1, 5, 3, 7], [1, 2, 3, 7]], 10))
    assert result.num_accepted.tolist() == [3, 1, 0]
    assert result.bonus.tolist() == [7, 5, 1]
    assert result.accepted_nodes.tolist() == [[0, 1, 2, 3], [0, 1, -1, -1], [0, -1, -1, -1]]
    assert result.output_tokens.tolist() == [[1, 2, 3, 7], [1, 5, -1, -1], [1, -1, -1, -1]]
    assert result.output_lists() == [[1, 2, 3, 7], [1, 5], [1]]


def test_greedy_tree_picks_the_matching_sibling() -> None:
    # root -> {a=1 (node 1), b=2 (node 2)}, a -> c=3 (node 3): the verify_greedy docstring example
    tree = DraftTree.from_parents(torch.tensor([[0, 1, 2, 3]]), torch.tensor([[-1, 0, 0, 1]]))
    result = verify_greedy(tree, one_hot_logits([[2, 5, 6, 7]], 8))
    assert result.accepted_nodes.tolist() == [[0, 2, -1]]
    assert result.output_tokens.tolist() == [[2, 6, -1]]


def test_greedy_duplicate_siblings_take_the_first() -> None:
    # nodes 1 and 2 both carry token 4; only node 2 has a child (5). SGLang's sibling order picks node 1.
    tree = DraftTree.from_parents(torch.tensor([[0, 4, 4, 5]]), torch.tensor([[-1, 0, 0, 2]]))
    result = verify_greedy(tree, one_hot_logits([[4, 5, 5, 1]], 8))
    assert result.accepted_nodes.tolist() == [[0, 1, -1]]
    assert result.bonus.tolist() == [5]


def test_greedy_ignores_padding() -> None:
    tree = DraftTree.from_parents(torch.tensor([[0, 3, 4]]), torch.tensor([[-1, 0, 0]]), torch.tensor([2]))
    result = verify_greedy(tree, one_hot_logits([[7, 1, 1]], 8))  # the padding slot's parent is NO_PARENT
    assert result.num_accepted.tolist() == [0] and result.bonus.tolist() == [7]
    tree.tokens[0, 2] = 7  # even a padding slot holding the argmax is never a child
    tree.parents[0, 2] = 0
    assert verify_greedy(tree, one_hot_logits([[7, 1, 1]], 8)).num_accepted.tolist() == [0]


def test_greedy_argmax_ties_go_to_the_lowest_id() -> None:
    chain = build_chain(torch.tensor([0]), torch.tensor([[3]]))
    logits = torch.tensor([[[0.0, 1.0, 0.0, 1.0], [0.0] * 4]])  # tokens 1 and 3 tie at the root
    assert verify_greedy(chain, logits).output_tokens.tolist() == [[1, -1]]


def test_stochastic_chain_cases() -> None:
    gen = torch.Generator().manual_seed(0)
    draft = torch.tensor([[1, 2], [1, 2]])
    q = torch.nn.functional.one_hot(draft, 4).float()  # [B, L, V]
    p = torch.zeros(2, 3, 4)
    p[0] = torch.eye(4)[[1, 2, 3]]  # request 0: the target agrees with both drafts, then says 3
    p[1] = torch.eye(4)[[0, 2, 3]]  # request 1: the target rejects the first draft and says 0
    result = verify_chain_stochastic(draft, q, p, gen)
    assert result.output_tokens.tolist() == [[1, 2, 3], [0, -1, -1]]
    assert result.accepted_nodes.tolist() == [[0, 1, 2], [0, -1, -1]]


# --------------------------------------------------------------------------------------------------------------
# process_logits = SGLang's non-speculative sampler


def test_process_logits_matches_sglang_sampler() -> None:
    sglang_filter = sglang_speculative()["top_k_top_p_min_p_sampling_from_probs_torch"]
    gen = torch.Generator().manual_seed(0)
    rows, vocab = 64, 40
    logits = torch.randn((rows, vocab), generator=gen) * 2
    temperature = torch.rand(rows, generator=gen) * 1.5 + 0.2
    top_k = torch.randint(0, 12, (rows,), generator=gen)  # 0 = disabled
    top_p = torch.rand(rows, generator=gen) * 0.9 + 0.1
    top_p[::4] = 1.0
    min_p = torch.rand(rows, generator=gen) * 0.5
    min_p[::3] = 0.0
    ours = process_logits(logits, temperature, top_k, top_p, min_p)
    probs = torch.softmax(logits / temperature[:, None], dim=-1)
    sglang_top_k = torch.where(top_k <= 0, 1 << 30, top_k)  # SGLang's TOP_K_ALL
    _, kept, kept_ids, _ = sglang_filter(
        probs, sglang_top_k, top_p, min_p, True, None, None, return_filtered_probs=True
    )
    expected = torch.zeros_like(probs).scatter_(-1, kept_ids.long(), kept)
    expected = expected / expected.sum(dim=-1, keepdim=True)
    assert torch.equal(ours > 0, expected > 0)
    # float32 renormalisation over up to 40 kept probabilities, summed in another order: <= 40 * 6e-8 relative
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)
    assert (ours > 0).sum(dim=-1).min() >= 1 and ((ours > 0).sum(dim=-1) < vocab).any()


def test_process_logits_cases() -> None:
    probs = torch.tensor([0.5, 0.3, 0.2])
    torch.testing.assert_close(process_logits(probs.log(), 1.0, 2, 0.6), torch.tensor([0.625, 0.375, 0.0]))
    torch.testing.assert_close(process_logits(probs.log(), 1.0, 0, 0.4), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(process_logits(probs.log(), 1.0), probs)
    greedy = process_logits(torch.tensor([[1.0, 3.0, 3.0], [0.0, 0.0, 2.0]]), torch.tensor([0.0, 1.0]))
    assert greedy[0].tolist() == [0.0, 1.0, 0.0]  # temperature 0: one-hot at the first argmax
    torch.testing.assert_close(greedy[1], torch.softmax(torch.tensor([0.0, 0.0, 2.0]), dim=0))


@pytest.mark.parametrize("vocab", [300, 4096])
def test_the_partial_selection_gives_the_full_sorts_distribution(vocab: int) -> None:
    """Every row with a top-k of at most ``max_top_k``: the best ``max_top_k`` of each row (a top-k, no sort of the
    vocabulary) give what the full stable sort gives, top-p and min-p included, ties at the cut broken the same way
    (lower id kept: bf16-like logits on a coarse grid tie often). Without filters the softmax is returned unsorted."""
    gen = torch.Generator().manual_seed(vocab)
    rows = 96
    logits = (torch.randn((rows, vocab), generator=gen) * 8).round() / 4  # many ties
    temperature = torch.rand(rows, generator=gen) + 0.3
    temperature[::7] = 0.0  # greedy rows
    top_k = torch.randint(1, 40, (rows,), generator=gen)
    top_p = torch.rand(rows, generator=gen) * 0.9 + 0.1
    top_p[::3] = 1.0
    min_p = torch.rand(rows, generator=gen) * 0.3
    min_p[::2] = 0.0
    full = process_logits(logits, temperature, top_k, top_p, min_p)
    for bound in (int(top_k.max()), int(top_k.max()) + 5):
        partial = process_logits(logits, temperature, top_k, top_p, min_p, max_top_k=bound)
        assert torch.equal(partial > 0, full > 0)
        # the same kept values, renormalised by a float32 sum over K values instead of V (zeros included): an ulp
        torch.testing.assert_close(partial, full, rtol=4e-7, atol=0)
    unfiltered = process_logits(logits, temperature, filtered=False)
    # the full path divides by the float32 sum of V probabilities, which misses 1 by a few 1e-6 at V = 4096
    torch.testing.assert_close(unfiltered, process_logits(logits, temperature), rtol=1e-5, atol=0)
    assert torch.equal(unfiltered[::7], process_logits(logits[::7], 0.0))  # greedy rows stay one-hot


def _filtered_by_full_sort(probs: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """process_logits' top-p and min-p rule over a stable sort of the whole row (ties: lower id first)."""
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True, stable=True)
    keep = ((sorted_probs.cumsum(dim=-1) - sorted_probs) <= top_p[:, None]) | (top_p[:, None] >= 1.0)
    keep &= sorted_probs >= sorted_probs[:, :1] * min_p[:, None]
    kept = sorted_probs * keep
    return torch.zeros_like(probs).scatter_(-1, sorted_ids, kept / kept.sum(dim=-1, keepdim=True))


def test_top_p_without_top_k_at_kimis_vocabulary() -> None:
    """Top-p with no top-k at 163,840 tokens through the widening order (``_nucleus_order``): the full stable sort's
    result, and SGLang's own torch filter's kept counts (its sort is unstable, so which of the tokens tied at the
    cut it keeps is arbitrary). Peaked rows decided within the first width, flatter rows that widen (one to the
    whole row), bf16-like ties at the cut, min-p, a row of the batch that filters nothing, a greedy row."""
    sglang_filter = sglang_speculative()["top_k_top_p_min_p_sampling_from_probs_torch"]
    gen = torch.Generator().manual_seed(3)
    vocab, rows = 163_840, 8
    scale = torch.tensor([6.0, 5.0, 4.0, 3.0, 1.0, 4.0, 5.0, 3.0])[:, None]  # 1.0: a nucleus of most of the row
    logits = (torch.randn((rows, vocab), generator=gen) * scale * 8).round() / 8  # ties on a coarse grid
    temperature = torch.tensor([1.0, 0.7, 1.0, 1.3, 1.0, 1.0, 0.0, 1.0])  # row 6 greedy
    top_p = torch.tensor([0.95, 0.9, 0.95, 0.8, 0.95, 1.0, 0.95, 0.5])  # row 5 filters nothing
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.01])
    ours = process_logits(logits, temperature, 0, top_p, min_p)
    probs = torch.softmax(logits / torch.where(temperature > 0, temperature, 1.0)[:, None], dim=-1)
    expected = _filtered_by_full_sort(probs, top_p, min_p)
    expected[6] = torch.nn.functional.one_hot(logits[6].argmax(), vocab).float()
    assert torch.equal(ours > 0, expected > 0)
    # the same kept values renormalised by float32 sums over the first K instead of the whole sorted row (and row
    # 5 not renormalised: a float32 sum of 163,840 probabilities misses 1 by about 1e-5)
    torch.testing.assert_close(ours, expected, rtol=3e-5, atol=1e-9)
    _, sglang_kept, _, _ = sglang_filter(
        probs, torch.full((rows,), 1 << 30), top_p, min_p, True, None, None, return_filtered_probs=True
    )
    sglang_counts = (sglang_kept > 0).sum(dim=-1)
    filtering = torch.tensor([True, True, True, True, True, False, False, True])  # row 5: SGLang skips top-p 1
    assert torch.equal((ours > 0).sum(dim=-1)[filtering], sglang_counts[filtering])
    kept_counts = (ours > 0).sum(dim=-1)
    assert kept_counts[0] < 256 and kept_counts[4] > vocab // 2 and kept_counts[5] == vocab  # the cases above


# --------------------------------------------------------------------------------------------------------------


def test_sampled_verification_is_deterministic_per_seed() -> None:
    tree = random_tree(torch.Generator().manual_seed(0), 256, TREE_SLOTS, VOCAB)
    probs = torch.softmax(torch.randn((256, TREE_SLOTS, VOCAB), generator=torch.Generator().manual_seed(1)), -1)

    def run(seed: int) -> torch.Tensor:
        return verify_sampled(tree, probs, torch.Generator().manual_seed(seed)).output_tokens

    assert torch.equal(run(3), run(3))
    assert not torch.equal(run(3), run(4))
    draft = tree.tokens[:, 1:4].clamp(min=0)
    q = probs[:, :3].flip(-1)

    def run_chain(seed: int) -> torch.Tensor:
        return verify_chain_stochastic(draft, q, probs[:, :4], torch.Generator().manual_seed(seed)).output_tokens

    assert torch.equal(run_chain(3), run_chain(3))
    assert not torch.equal(run_chain(3), run_chain(4))


def test_results_are_consistent() -> None:
    """accepted_nodes walk parent to child through matching tokens; output = their tokens then the bonus."""
    gen = torch.Generator().manual_seed(5)
    tree = random_tree(gen, 512, TREE_SLOTS, 3)
    probs = torch.softmax(torch.randn((512, TREE_SLOTS, 3), generator=gen), -1)
    result = verify_sampled(tree, probs, gen)
    for b in range(512):
        n = int(result.num_accepted[b])
        path = result.accepted_nodes[b].tolist()
        assert path[0] == 0 and all(x == NO_NODE for x in path[n + 1 :])
        assert all(int(tree.parents[b, path[i]]) == path[i - 1] for i in range(1, n + 1))
        emitted = [int(tree.tokens[b, path[i]]) for i in range(1, n + 1)] + [int(result.bonus[b])]
        assert result.output_lists()[b] == emitted
        assert all(x == PAD_TOKEN_ID for x in result.output_tokens[b, n + 1 :].tolist())


def test_the_walks_window_order_is_the_path_first_order() -> None:
    """The torch walk hands the commit its window order; it must be ``path_first_order`` of the accepted nodes, for
    greedy and sampled walks over random trees (padding, duplicate siblings, every path length)."""
    from sglang_kimi.speculators.window import path_first_order

    gen = torch.Generator().manual_seed(9)
    tree = random_tree(gen, 512, TREE_SLOTS, 3)
    logits = torch.randn((512, TREE_SLOTS, 3), generator=gen)
    for result in (verify_greedy(tree, logits), verify_sampled(tree, logits.softmax(-1), gen)):
        assert result.window_order is not None
        assert torch.equal(result.window_order, path_first_order(result.accepted_nodes, TREE_SLOTS))
        assert set(result.num_accepted.tolist()) == set(range(int(result.num_accepted.max()) + 1))
