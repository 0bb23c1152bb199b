"""The sampled tree walk (``speculators.verify.walk_tree``, in SGLang's layout as the kernel takes it) emits tokens with
the exact law of the target over a fixed tree: chi-square of (last accepted node, bonus) over 200k verifications,
a two-sample test against ``verify_sampled``, and the same test failing on a sampler 1% off."""

from __future__ import annotations

import torch
from support.spec_helpers import repeated_tree
from support.stats import chi2_pvalue, homogeneity_pvalue
from support.verify_layout import twin

from sglang_kimi.speculators.trees import DraftTree
from sglang_kimi.speculators.verify import verify_sampled


def retrieve(tree: DraftTree):
    return tree.tokens, tree.retrieve_index(), tree.retrieve_next_token(), tree.retrieve_next_sibling()


def as_verify_result(out, tree: DraftTree):
    """SGLang-format outputs -> (accepted local nodes [B, D+1], num_accepted [B], bonus [B], output tokens)."""
    B, N = tree.tokens.shape
    idx = out.accept_index.long()
    local = torch.where(idx >= 0, idx - torch.arange(B)[:, None] * N, -1)
    num = out.accept_token_num.long()
    rows = idx.clamp(min=0)
    tokens = torch.where(idx >= 0, out.predicts.long()[rows], -1)
    bonus = tokens[torch.arange(B), num]
    return local, num, bonus, tokens


# ----------------------------------------------------------------------------------------------------------------
# sampled: the twin's law is the target's (and verify_sampled's)


def _exact_law(tree: DraftTree, probs: torch.Tensor) -> dict[tuple[int, int], float]:
    """P(last accepted node w, bonus y) for request 0: product of p along the path times p_w(y), y not a child
    of w (at the depth limit every y)."""
    law = {}
    valid = tree.valid()[0]
    p = probs[0].double()
    p = p / p.sum(-1, keepdim=True)  # float32 rows sum to 1 only within rounding

    def visit(node, mass, depth):
        children = [c for c in range(tree.num_slots) if valid[c] and int(tree.parents[0, c]) == node]
        child_tokens = {int(tree.tokens[0, c]) for c in children} if depth < tree.max_depth else set()
        for y in range(p.shape[1]):
            if y not in child_tokens and p[node, y] > 0:
                law[(node, y)] = law.get((node, y), 0.0) + mass * float(p[node, y])
        if depth < tree.max_depth:
            seen = set()
            for c in children:
                t = int(tree.tokens[0, c])
                if t not in seen:  # the first child with a token takes it
                    seen.add(t)
                    visit(c, mass * float(p[node, t]), depth + 1)

    visit(0, 1.0, 0)
    return law


def _counts(last_node: torch.Tensor, bonus: torch.Tensor, vocab: int) -> dict[tuple[int, int], int]:
    keys, counts = torch.unique(last_node * vocab + bonus, return_counts=True)
    return {(int(k) // vocab, int(k) % vocab): int(c) for k, c in zip(keys, counts)}


def _sample_ref(tree1: DraftTree, probs1: torch.Tensor, n: int, gen: torch.Generator):
    """n independent verifications of one tree with the vectorised twin (the tree repeated n times)."""
    tree = repeated_tree(tree1, n)
    N = tree.num_slots
    probs = probs1.expand(n, -1, -1)
    out = twin(
        *retrieve(tree),
        num_spec_tokens=tree.max_depth + 1,
        target_probs=probs,
        uniform_samples=torch.rand(n, N, generator=gen),
        uniform_samples_for_final_sampling=torch.rand(n, generator=gen),
    )
    local, num, bonus, _ = as_verify_result(out, tree)
    return local[torch.arange(n), num], bonus, tree, probs


SAMPLES = 200_000  # a 1% shift of probability mass between two outcomes gives a chi-square excess of ~200


def _law_case():
    gen = torch.Generator().manual_seed(7)
    # root -> {1, 2, 3}; 1 -> {4, 5}; 4 -> {6}; 2 -> {7}; vocab 6; node 6 at depth 3
    parents = torch.tensor([[-1, 0, 0, 0, 1, 1, 4, 2]])
    tokens = torch.tensor([[0, 1, 2, 3, 0, 4, 5, 2]])
    tree = DraftTree.from_parents(tokens, parents)
    probs = torch.softmax(torch.randn(1, 8, 6, generator=gen) * 1.5, dim=-1)
    return tree, probs


def test_sampled_ref_is_distributed_as_the_target_and_verify_sampled():
    tree, probs = _law_case()
    law = _exact_law(tree, probs)
    assert abs(sum(law.values()) - 1.0) < 1e-9
    gen = torch.Generator().manual_seed(11)
    last, bonus, big_tree, big_probs = _sample_ref(tree, probs, SAMPLES, gen)
    ref_counts = _counts(last, bonus, probs.shape[-1])
    assert chi2_pvalue(ref_counts, law) > 1e-4

    spec = verify_sampled(big_tree, big_probs, gen)
    last_s = spec.accepted_nodes[torch.arange(SAMPLES), spec.num_accepted]
    spec_counts = _counts(last_s, spec.bonus, probs.shape[-1])
    assert chi2_pvalue(spec_counts, law) > 1e-4

    # two-sample homogeneity: the twin and verify_sampled draw from the same law
    assert homogeneity_pvalue(ref_counts, spec_counts) > 1e-4


def test_the_law_test_detects_a_one_percent_bias():
    """The same test fails for a sampler that is 1% off: draw from a target with 0.01 of the root's mass moved
    from a non-child token to child 1, compare with the unbiased law."""
    tree, probs = _law_case()
    law = _exact_law(tree, probs)
    biased = probs.clone()
    biased[0, 0, 5] -= 0.01  # token 5 is not a child of the root
    biased[0, 0, 1] += 0.01
    assert biased[0, 0, 5] > 0
    last, bonus, _, _ = _sample_ref(tree, biased, SAMPLES, torch.Generator().manual_seed(12))
    assert chi2_pvalue(_counts(last, bonus, probs.shape[-1]), law) < 1e-6
