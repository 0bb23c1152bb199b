"""Sampled tree verification with top-p and no top-k at Kimi-K2.6's vocabulary (163,840 tokens), as chat clients send
it: the target's probabilities from ``process_logits`` (its widening order, no sort of the vocabulary) and the
sampled walk over them emit (last accepted node, bonus) with the law of the top-p filter computed here in float64 over
a full sort, by chi-square over 200k verifications; the same test fails for a filter that keeps 1% less mass.

Each node's row: its children's tokens with fixed masses, a head of HEAD tokens (random ids, weights in [1, 2)) and a
flat tail of 3% over the rest of the vocabulary, so that top-p 0.95 cuts inside the head, past the first width the
order tries (its kept tokens are more than ``NUCLEUS_FIRST_WIDTH``). Tokens outside every row's support are never
drawn, so the walk runs over the union of the supports (ids mapped to their places in it): the same decisions from the
same coins as over the whole vocabulary, at a fraction of the memory. Power as in ``test_verify_law.py``: a shift of
0.01 probability between two cells gives a noncentrality >= 4 n eps^2 = 80 at n = 200k."""

from __future__ import annotations

import torch
from support.spec_helpers import repeated_tree
from support.stats import chi2_pvalue

from sglang_kimi.speculators.trees import DraftTree
from sglang_kimi.speculators.verify import NUCLEUS_FIRST_WIDTH, process_logits, random_coins, walk_tree

VOCAB = 163_840
HEAD = 600
TAIL_MASS = 0.03
TOP_P = 0.95
SAMPLES = 200_000
CHUNK = 10_000
# root (0) -> a (1), b (2); a -> c (3): each node's children and their masses in its row
CHILDREN = {0: {1: 0.3, 2: 0.2}, 1: {3: 0.4}, 2: {}, 3: {}}
PARENTS = [-1, 0, 0, 1]


def _case():
    """The tree (tokens [1, 4]) and each node's logits [4, V] float32."""
    gen = torch.Generator().manual_seed(5)
    ids = torch.randperm(VOCAB, generator=gen)
    tokens = torch.tensor([[int(ids[0]), int(ids[1]), int(ids[2]), int(ids[3])]])
    rows = []
    for node, children in CHILDREN.items():
        p = torch.full((VOCAB,), 0.0, dtype=torch.float64)
        child_ids = [int(tokens[0, c]) for c in children]
        others = torch.randperm(VOCAB, generator=gen)
        others = others[~torch.isin(others, torch.tensor(child_ids or [-1]))]
        head, tail = others[:HEAD], others[HEAD:]
        weights = torch.rand(HEAD, generator=gen, dtype=torch.float64) + 1.0
        p[head] = weights / weights.sum() * (1.0 - TAIL_MASS - sum(children.values()))
        p[tail] = TAIL_MASS / len(tail)
        for c, mass in children.items():
            p[int(tokens[0, c])] = mass
        rows.append(p.log().float())
    return DraftTree.from_parents(tokens, torch.tensor([PARENTS])), torch.stack(rows)


def _top_p_law(tree: DraftTree, logits: torch.Tensor, top_p: float) -> dict[tuple[int, int], float]:
    """P(last accepted node, bonus) of one verification: the filter in float64 over a full stable sort of each
    row's softmax; a child's token is drawn with its parent's filtered probability and descends."""
    probs = torch.softmax(logits.double(), dim=-1)
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True, stable=True)
    kept = sorted_probs * ((sorted_probs.cumsum(dim=-1) - sorted_probs) <= top_p)
    filtered = torch.zeros_like(probs).scatter_(-1, sorted_ids, kept / kept.sum(dim=-1, keepdim=True))
    law: dict[tuple[int, int], float] = {}

    def visit(node: int, mass: float) -> None:
        children = {int(tree.tokens[0, c]): c for c in CHILDREN[node]}
        support = filtered[node].nonzero()[:, 0].tolist()
        for y in support:
            if y in children:
                visit(children[y], mass * float(filtered[node, y]))
            else:
                law[(node, y)] = mass * float(filtered[node, y])

    visit(0, 1.0)
    return law


def _sampled_counts(tree: DraftTree, logits: torch.Tensor, top_p: float, seed: int) -> dict[tuple[int, int], int]:
    """(last accepted node, bonus) counts of SAMPLES sampled verifications over ``process_logits``' probabilities."""
    probs = process_logits(logits, 1.0, 0, top_p)  # [4, V]: top-p without top-k, the widening order
    support = torch.nonzero((probs > 0).any(dim=0))[:, 0]  # ids some row may draw
    assert bool(torch.isin(tree.tokens[:, 1:], support).all())  # every drafted token may be drawn
    place = torch.zeros((VOCAB,), dtype=torch.long)  # the root's token is never drawn here: any place
    place[support] = torch.arange(len(support))
    local_tree = DraftTree.from_parents(place[tree.tokens], tree.parents)
    local_probs = probs[:, support][None].expand(CHUNK, -1, -1)  # [CHUNK, 4, S]: one tree's rows, repeated
    gen = torch.Generator().manual_seed(seed)
    counts: dict[tuple[int, int], int] = {}
    for _ in range(SAMPLES // CHUNK):
        coins = random_coins(CHUNK, 4, generator=gen)
        result = walk_tree(repeated_tree(local_tree, CHUNK), target_probs=local_probs, coins=coins)
        last = result.accepted_nodes.gather(1, result.num_accepted[:, None])[:, 0]
        keys, n = torch.unique(last * VOCAB + support[result.bonus], return_counts=True)
        for key, c in zip(keys.tolist(), n.tolist()):
            cell = (key // VOCAB, key % VOCAB)
            counts[cell] = counts.get(cell, 0) + c
    return counts


def test_top_p_without_top_k_follows_the_filtered_target_at_kimis_vocabulary():
    tree, logits = _case()
    probs = process_logits(logits, 1.0, 0, TOP_P)
    assert ((probs > 0).sum(dim=-1) > NUCLEUS_FIRST_WIDTH).all()  # the order had to widen
    assert ((probs > 0).sum(dim=-1) < HEAD).all()  # and top-p cut inside the head
    law = _top_p_law(tree, logits, TOP_P)
    assert abs(sum(law.values()) - 1.0) < 1e-9
    assert chi2_pvalue(_sampled_counts(tree, logits, TOP_P, seed=1), law) > 1e-3


def test_the_top_p_law_test_detects_a_filter_one_percent_short():
    tree, logits = _case()
    law = _top_p_law(tree, logits, TOP_P)
    assert chi2_pvalue(_sampled_counts(tree, logits, TOP_P - 0.01, seed=2), law) < 1e-6
