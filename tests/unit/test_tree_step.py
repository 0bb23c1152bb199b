"""The DDTree step's two sides (``speculators/tree_step.py``; the verify side as one function:
``support.verify_layout.verify_side``) hold no host synchronisation and no data-dependent shape: each compiles with
``torch.compile(fullgraph=True, dynamic=False)`` and exports with ``torch.export(strict=True)`` at several batch
sizes and widths, and the compiled and exported functions give the eager results. A function that reads the device
on the host fails both checks (the checks can fail)."""

import pytest
import torch
from support.verify_layout import verify_side

from sglang_kimi.speculators.reference.heap import ddtree_heap
from sglang_kimi.speculators.tree_step import draft_side
from sglang_kimi.speculators.trees import SORT_RANK_MAX, DraftTree
from sglang_kimi.speculators.verify import random_coins

HIDDEN, DEPTH = 16, 7  # a block of 8: the root and 7 draft positions


def _draft_inputs(batch: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, DEPTH, HIDDEN, generator=g)
    lm_head = torch.randn(vocab, HIDDEN, generator=g).bfloat16().float()  # bf16 values: ties in the logits happen
    root = torch.randint(0, vocab, (batch,), generator=g)
    prefix = torch.randint(3, 40, (batch,), generator=g)
    return hidden, lm_head, root, prefix


class Draft(torch.nn.Module):
    def __init__(self, width: int, tree: bool):
        super().__init__()
        self.width, self.tree = width, tree

    def forward(self, hidden, lm_head, root, prefix):
        drafted, positions, mask, nonfinite = draft_side(
            hidden, lm_head, root, prefix, width=self.width, tree=self.tree
        )
        return drafted.tokens, drafted.parents, drafted.depths, drafted.num_nodes, positions, mask, nonfinite


class Verify(torch.nn.Module):
    def __init__(self, max_depth: int, sampled: bool):
        super().__init__()
        self.max_depth, self.sampled = max_depth, sampled

    def forward(self, tokens, parents, depths, num_nodes, slots, rows, prefix, target, uniform, final):
        from sglang_kimi.speculators.verify import Coins

        tree = DraftTree(tokens, parents, depths, num_nodes, self.max_depth)
        if self.sampled:
            return verify_side(tree, slots, rows, prefix, target_probs=target, coins=Coins(uniform, final)).as_tuple()
        return verify_side(tree, slots, rows, prefix, target_logits=target).as_tuple()


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y)


def _compiled_and_exported(module: torch.nn.Module, args: tuple):
    eager = module(*args)
    compiled = torch.compile(module, fullgraph=True, dynamic=False, backend="eager")(*args)
    exported = torch.export.export(module, args, strict=True).module()(*args)
    _same(eager, compiled)
    _same(eager, exported)
    return eager


@pytest.mark.parametrize("batch, width, tree, vocab", [
    (1, 1, True, 64), (3, 4, True, 64), (8, 8, True, SORT_RANK_MAX + 904), (4, 16, True, 64),
    (2, 7, False, 64), (5, 3, False, SORT_RANK_MAX + 904),
])  # fmt: skip
def test_draft_side_compiles_whole_and_exports(batch, width, tree, vocab):
    torch._dynamo.reset()
    args = _draft_inputs(batch, vocab, seed=batch * 100 + width)
    tokens, parents, depths, num_nodes, positions, mask, _ = _compiled_and_exported(Draft(width, tree), args)
    assert tokens.shape == (batch, width + 1) and mask.shape == (batch, width + 1, width + 1)
    assert torch.equal(positions, args[3][:, None] + depths)
    if tree:  # the same tree as the reference heap, node for node
        hidden, lm_head, root, _ = args
        ref = ddtree_heap(root, hidden[:, : min(width, DEPTH)] @ lm_head.T, width)
        n = ref.num_slots
        assert torch.equal(tokens[:, :n], ref.tokens) and torch.equal(parents[:, :n], ref.parents)


def _tree_and_target(batch: int, width: int, vocab: int, seed: int):
    hidden, lm_head, root, prefix = _draft_inputs(batch, vocab, seed)
    drafted, _, _, _ = draft_side(hidden, lm_head, root, prefix, width=width, tree=True)
    g = torch.Generator().manual_seed(seed + 1)
    logits = torch.randn(batch, width + 1, vocab, generator=g)
    # make the drafts likely to be accepted: raise each node's first child's token at the node
    first_child = drafted.retrieve_next_token().clamp(min=0)
    logits.scatter_add_(2, drafted.tokens.gather(1, first_child)[:, :, None], torch.full((batch, width + 1, 1), 9.0))
    slots = torch.randperm(batch * (width + 1), generator=g).view(batch, width + 1)
    rows = slots + 1000
    return drafted, slots, rows, prefix, logits


@pytest.mark.parametrize("batch, width", [(1, 1), (3, 4), (8, 8), (2, 16)])
@pytest.mark.parametrize("sampled", [False, True])
def test_verify_side_compiles_whole_and_exports(batch, width, sampled):
    torch._dynamo.reset()
    drafted, slots, rows, prefix, logits = _tree_and_target(batch, width, 64, seed=batch + width)
    coins = random_coins(batch, width + 1, generator=torch.Generator().manual_seed(7))
    target = torch.softmax(logits, dim=-1) if sampled else logits
    args = (drafted.tokens, drafted.parents, drafted.depths, drafted.num_nodes, slots, rows, prefix, target,
            coins.uniform, coins.final)  # fmt: skip
    out_tokens, commit_lens, bonus, order, committed, columns, draft_rows, new_lens = _compiled_and_exported(
        Verify(drafted.max_depth, sampled), args
    )
    assert torch.equal(new_lens, prefix + commit_lens)
    assert torch.equal(committed, slots.gather(1, order)) and torch.equal(draft_rows, rows.gather(1, order))
    for b in range(batch):
        n = int(commit_lens[b])
        path = order[b, :n].tolist()
        assert path[0] == 0 and [int(drafted.depths[b, i]) for i in path] == list(range(n))  # root-to-node path
        assert out_tokens[b, : n - 1].tolist() == drafted.tokens[b, path[1:]].tolist()  # the accepted drafts
        assert int(out_tokens[b, n - 1]) == int(bonus[b])
    if not sampled:
        assert int(commit_lens.max()) > 1  # the raised first children were accepted somewhere


def test_a_host_read_fails_both_checks():
    """The checks can fail: a step that branches on a device value is refused by both."""

    class Syncing(torch.nn.Module):
        def forward(self, x):
            return x + 1 if bool((x > 0).any()) else x - 1

    x = torch.randn(4)
    torch._dynamo.reset()
    with pytest.raises(Exception):
        torch.compile(Syncing(), fullgraph=True, dynamic=False, backend="eager")(x)
    with pytest.raises(Exception):
        torch.export.export(Syncing(), (x,), strict=True)
