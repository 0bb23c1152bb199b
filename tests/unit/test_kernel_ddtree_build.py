"""Batched DDTree build: the Triton kernel (CPU, Triton's interpreter) builds the same tree, node for node, as its torch
twin ``speculators.ddtree.build_ddtree_ranked`` and the reference heap.

See ``kernels/interpret.py`` for why TRITON_INTERPRET is set around the first Triton import.
"""

from __future__ import annotations

import os

import pytest
import torch
from support.child_process import rerun_in_fresh_process

from sglang_kimi.kernels.interpret import interpreter_active, interpreter_imports

_ENV_BEFORE = os.environ.get("TRITON_INTERPRET")
with interpreter_imports():
    from sglang_kimi.kernels import ddtree_build as dd
IN_PROCESS = interpreter_active()

from sglang_kimi.speculators.ddtree import build_ddtree, build_ddtree_ranked, num_tree_nodes, rank_draft_logits  # noqa: E402
from sglang_kimi.speculators.reference.heap import ddtree_heap  # noqa: E402

FIELDS = ("tokens", "parents", "depths", "num_nodes")
POISON = -99


def assert_same_tree(a, b):
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert a.max_depth == b.max_depth


def logits_for(kind: str, shape, gen):
    if kind == "normal":
        return torch.randn(shape, generator=gen) * 2
    if kind == "ties":  # integer logits: many exactly equal scores; order falls to depth, parent, rank, vocab id
        return torch.randint(0, 3, shape, generator=gen).float()
    if kind == "masked":  # -inf logits (a grammar mask): zero-probability tokens, -inf scores
        x = torch.randn(shape, generator=gen)
        x[torch.rand(shape, generator=gen) < 0.5] = float("-inf")
        x[..., 0] = 0.0  # keep every row normalisable
        return x
    raise ValueError(kind)


@pytest.mark.parametrize(
    "batch,length,vocab,budget,kind",
    [
        (3, 4, 20, 10, "normal"),
        (2, 7, 40, 64, "normal"),  # Kimi's block: depth 7, budget 64
        (3, 3, 5, 12, "ties"),
        (2, 5, 8, 16, "masked"),
        (4, 2, 2, 10, "normal"),  # fewer prefixes (2 + 4) than the budget
        (2, 1, 9, 4, "normal"),  # one draft position
        (2, 6, 30, 1, "normal"),  # budget 1: the best single token
    ],
)
def test_kernel_and_heap_equal_build_ddtree(batch, length, vocab, budget, kind):
    gen = torch.Generator().manual_seed(batch * 1000 + length * 100 + vocab + budget)
    logits = logits_for(kind, (batch, length, vocab), gen)
    root = torch.randint(vocab, (batch,), generator=gen)
    expected = build_ddtree(root, logits, budget)
    lp, ids = rank_draft_logits(logits, budget)
    assert_same_tree(build_ddtree_ranked(root, lp, ids, budget), expected)
    assert_same_tree(ddtree_heap(root, logits, budget), expected)
    n = num_tree_nodes(length, lp.shape[-1], budget) + 1
    out = tuple(torch.full((batch, n), POISON, dtype=torch.long) for _ in range(3))  # every slot must be written
    got = dd.ddtree_build(root, lp, ids, budget, out=out)
    assert got.tokens.data_ptr() == out[0].data_ptr()
    assert_same_tree(got, expected)


def test_worked_example():
    # the docstring example: q1 = [.6, .3, .1], q2 = [.7, .2, .1], budget 3
    logits = torch.log(torch.tensor([[[0.6, 0.3, 0.1], [0.7, 0.2, 0.1]]]))
    lp, ids = rank_draft_logits(logits, 3)
    tree = dd.ddtree_build(torch.tensor([9]), lp, ids, 3)
    assert tree.tokens.tolist() == [[9, 0, 0, 1]]
    assert tree.parents.tolist() == [[-1, 0, 1, 0]]
    assert tree.depths.tolist() == [[0, 1, 2, 1]]


def test_bad_arguments():
    lp = torch.zeros(1, 2, 2)
    with pytest.raises(ValueError):
        dd.ddtree_build(torch.zeros(1, dtype=torch.long), lp, torch.zeros(1, 2, 3, dtype=torch.long), 2)
    with pytest.raises(ValueError):
        dd.ddtree_build(torch.zeros(1, dtype=torch.long), lp, torch.zeros(1, 2, 2, dtype=torch.long), 0)


def test_env_restored_after_import():
    assert os.environ.get("TRITON_INTERPRET") == _ENV_BEFORE


if not IN_PROCESS:  # Triton was imported here before without the interpreter: run this module in a fresh process
    rerun_in_fresh_process(globals(), interpret=True)
