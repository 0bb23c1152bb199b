"""Sampled verification follows the target distribution: chains, trees and stochastic chains, by chi-square on the
first two emitted tokens with enough trials that a 1% shift of probability fails, and the same tests reject
deliberately biased verifiers."""

from __future__ import annotations

import pytest
import torch
from support.spec_helpers import random_tree, single_thread  # noqa: F401
from support.stats import chi2_pvalue

from sglang_kimi.speculators.trees import PAD_TOKEN_ID, DraftTree, build_chain
from sglang_kimi.speculators.verify import (
    VerifyResult,
    sample_tokens,
    verify_chain_stochastic,
    verify_sampled,
)

# --------------------------------------------------------------------------------------------------------------
# Sampling: the first two emitted tokens follow the target.
#
# Target: an order-2 Markov chain over VOCAB tokens, p(. | previous token, current token) = TABLE[prev, cur].
# Each trial starts at context CONTEXT, runs one verify step, and, if that step emitted a single token, a second
# step rooted at that token; the first two emitted tokens are compared with p(x1) p(x2 | x1) by chi-square.
#
# Power: a Pearson chi-square test at level ALPHA rejects a shift of eps = 0.01 probability from outcome a to
# outcome b with noncentrality lambda = n eps^2 (1/p_a + 1/p_b) >= 4 n eps^2 (as p_a + p_b <= 1), whatever
# the distribution. With n = TRIALS = 200_000, lambda >= 80: first token (df = 5, critical value 20.5) power
# > 0.9999; first two tokens (df = 35, critical value 66.6) power 0.997 (noncentral chi-square, simulated).
# Every cell has p >= (0.1 / VOCAB)^2, so >= 55 expected counts. Seeds are fixed: the tests are deterministic.

VOCAB = 6
TRIALS = 200_000
ALPHA = 1e-3
CONTEXT = (2, 4)
CHAIN_LENGTH = 3
TREE_SLOTS = 8


def markov_table(seed: int) -> torch.Tensor:
    """[V, V, V]: 0.9 * Dirichlet(1) + 0.1 * uniform per context."""
    gen = torch.Generator().manual_seed(seed)
    dirichlet = -torch.rand((VOCAB, VOCAB, VOCAB), generator=gen).log()
    return 0.9 * dirichlet / dirichlet.sum(dim=-1, keepdim=True) + 0.1 / VOCAB


TABLE = markov_table(0)


def node_contexts(tree: DraftTree, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(token before each node, node's token) [B, N]; padding gets (prev, 0), its row is never read."""
    tokens = tree.tokens.clamp(min=0)
    before = torch.where(tree.parents >= 0, tokens.gather(1, tree.parents.clamp(min=0)), prev[:, None])
    return before, tokens


def draft_tokens(shape: DraftTree, prev: torch.Tensor, root: torch.Tensor, gen: torch.Generator) -> DraftTree:
    """Tokens for a tree shape, parent first: even trials draft the target's argmax (deep accepts), odd ones
    draft uniformly."""
    tokens = shape.tokens.clamp(min=0)
    tokens[:, 0] = root
    like_target = torch.arange(tokens.shape[0]) % 2 == 0
    for i in range(1, tokens.shape[1]):
        parent = shape.parents[:, i : i + 1].clamp(min=0)  # [n, 1]; padding slots draw junk, dropped below
        grandparent = shape.parents.gather(1, parent)
        before = torch.where(grandparent >= 0, tokens.gather(1, grandparent.clamp(min=0)), prev[:, None])[:, 0]
        argmax = TABLE[before, tokens.gather(1, parent)[:, 0]].argmax(dim=-1)
        tokens[:, i] = torch.where(like_target, argmax, torch.randint(0, VOCAB, argmax.shape, generator=gen))
    tokens = torch.where(shape.valid(), tokens, PAD_TOKEN_ID)
    return DraftTree(tokens, shape.parents, shape.depths, shape.num_nodes, shape.max_depth)


def tiled(tree: DraftTree, n: int) -> DraftTree:
    """n trials cycling through the shapes of a smaller batch of trees."""
    index = torch.arange(n) % tree.batch_size
    return DraftTree(tree.tokens[index], tree.parents[index], tree.depths[index], tree.num_nodes[index], tree.max_depth)


TREE_SHAPES = tiled(random_tree(torch.Generator().manual_seed(0), 4096, TREE_SLOTS, VOCAB), TRIALS)
CHAIN_SHAPE = tiled(
    build_chain(torch.zeros(1, dtype=torch.long), torch.zeros((1, CHAIN_LENGTH), dtype=torch.long)), TRIALS
)


def propose(kind: str, prev: torch.Tensor, root: torch.Tensor, gen: torch.Generator):
    """A batch of drafts rooted at root [n]: (tree, q or None)."""
    if kind in ("tree", "chain"):
        return draft_tokens(TREE_SHAPES if kind == "tree" else CHAIN_SHAPE, prev, root, gen), None
    # stochastic chain: x_i ~ q_i = half the target's law, half noise
    tokens, q = [prev, root], []
    for _ in range(CHAIN_LENGTH):
        noise = -torch.rand((root.shape[0], VOCAB), generator=gen).log()
        q.append(0.5 * TABLE[tokens[-2], tokens[-1]] + 0.5 * noise / noise.sum(dim=-1, keepdim=True))
        tokens.append(sample_tokens(q[-1], gen))
    return build_chain(root, torch.stack(tokens[2:], dim=1)), torch.stack(q, dim=1)


def verify_step(kind: str, verifier, prev: torch.Tensor, root: torch.Tensor, gen: torch.Generator) -> VerifyResult:
    tree, q = propose(kind, prev, root, gen)
    before, tokens = node_contexts(tree, prev)
    target_probs = TABLE[before, tokens]  # [n, N, V]
    if q is None:
        return verifier(tree, target_probs, gen)
    return verifier(tree.tokens[:, 1:], q, target_probs, gen)


def first_two_pvalues(kind: str, verifier, seed: int = 0) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(seed)
    prev = torch.full((TRIALS,), CONTEXT[0])
    root = torch.full((TRIALS,), CONTEXT[1])
    first = verify_step(kind, verifier, prev, root, gen)
    x1 = first.output_tokens[:, 0]
    second = verify_step(kind, verifier, root, x1, gen)
    x2 = torch.where(first.num_accepted >= 1, first.output_tokens[:, 1], second.output_tokens[:, 0])
    p1 = TABLE[CONTEXT]  # [V]
    joint = p1[:, None] * TABLE[CONTEXT[1]]  # [V, V]: p(x1) p(x2 | x1)
    first_p = chi2_pvalue(torch.bincount(x1, minlength=VOCAB), p1)
    joint_p = chi2_pvalue(torch.bincount(x1 * VOCAB + x2, minlength=VOCAB * VOCAB), joint)
    assert (first.num_accepted >= 2).float().mean() > 0.05  # paths go deep often enough to matter
    return first_p, joint_p


CORRECT = {"chain": verify_sampled, "tree": verify_sampled, "stochastic_chain": verify_chain_stochastic}


@pytest.mark.parametrize("kind", list(CORRECT))
def test_emitted_tokens_follow_the_target(kind: str) -> None:
    first_p, joint_p = first_two_pvalues(kind, CORRECT[kind])
    assert first_p > ALPHA and joint_p > ALPHA, (first_p, joint_p)


def fresh_bonus(tree: DraftTree, target_probs: torch.Tensor, gen: torch.Generator) -> VerifyResult:
    """BIASED: the bonus is redrawn from p(.|v) instead of the draw that missed the children (no renormalisation
    over the rejected children), so children's tokens are emitted too often."""
    result = verify_sampled(tree, target_probs, gen)
    stop = result.accepted_nodes.gather(1, result.num_accepted[:, None])[:, 0]
    bonus = sample_tokens(target_probs[torch.arange(stop.shape[0]), stop], gen)
    result.output_tokens.scatter_(1, result.num_accepted[:, None], bonus[:, None])
    return result


def recover_from_target(draft, q, target_probs, gen) -> VerifyResult:
    """BIASED: a rejected draft is replaced by a draw from p instead of norm(max(p - q, 0))."""
    result = verify_chain_stochastic(draft, q, target_probs, gen)
    rows = torch.arange(draft.shape[0])
    redraw = sample_tokens(target_probs[rows, result.num_accepted], gen)
    rejected = result.num_accepted < draft.shape[1]
    bonus = torch.where(rejected, redraw, result.bonus)
    result.output_tokens.scatter_(1, result.num_accepted[:, None], bonus[:, None])
    return result


def shift_one_percent(tree: DraftTree, target_probs: torch.Tensor, gen: torch.Generator) -> VerifyResult:
    """BIASED by the smallest amount the tests promise to catch: 0.01 of probability moves from the most likely
    first token a to the second most likely b (the hardest pair to detect)."""
    result = verify_sampled(tree, target_probs, gen)
    root_probs = target_probs[:, 0]  # [n, V]
    a, b = root_probs.topk(2, dim=-1).indices.unbind(-1)
    p_a = root_probs.gather(1, a[:, None])[:, 0]
    move = (result.output_tokens[:, 0] == a) & (torch.rand(a.shape, generator=gen) * p_a < 0.01)
    result.output_tokens[:, 0] = torch.where(move, b, result.output_tokens[:, 0])
    return result


@pytest.mark.parametrize(
    "kind,biased", [("tree", fresh_bonus), ("stochastic_chain", recover_from_target), ("tree", shift_one_percent)]
)
def test_biased_verifiers_are_rejected(kind: str, biased) -> None:
    first_p, joint_p = first_two_pvalues(kind, biased)
    assert min(first_p, joint_p) < ALPHA, (first_p, joint_p)
