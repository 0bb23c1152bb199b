"""The verify window: padding a tree to the window, the path-first permutation that commits the accepted path, and the
row gathers that follow it."""

import torch

from sglang_kimi.speculators.ddtree import build_ddtree
from sglang_kimi.speculators.trees import NO_PARENT, build_chain
from sglang_kimi.speculators.verify import verify_greedy
from sglang_kimi.speculators.window import gather_rows, pad_tree, path_first_order


def test_pad_tree_adds_slots_nobody_can_reach():
    tree = build_chain(torch.tensor([7, 8]), torch.tensor([[1, 2], [3, 4]]))
    padded = pad_tree(tree, 5)
    assert padded.tokens.tolist() == [[7, 1, 2, 7, 7], [8, 3, 4, 8, 8]]
    assert padded.parents[:, 3:].eq(NO_PARENT).all() and padded.depths[:, 3:].eq(0).all()
    assert torch.equal(padded.num_nodes, tree.num_nodes) and padded.max_depth == tree.max_depth
    mask = padded.ancestor_mask()  # padding sees only itself and nobody sees padding
    assert mask[:, 3:, :3].logical_not().all() and mask[:, :3, 3:].logical_not().all()
    assert pad_tree(tree, 3) is tree
    try:
        pad_tree(tree, 2)
    except ValueError as exc:
        assert "does not fit" in str(exc)
    else:
        raise AssertionError("a tree larger than the window was accepted")


def test_padding_is_never_accepted():
    tree = pad_tree(build_chain(torch.tensor([5]), torch.tensor([[6]])), 4)
    logits = torch.zeros(1, 4, 10)
    logits[0, :, 5] = 9.0  # the target always wants the root's token, which is the padding's token too
    result = verify_greedy(tree, logits)
    assert result.num_accepted.tolist() == [0] and result.bonus.tolist() == [5]


def test_path_first_order_puts_the_accepted_path_in_front():
    accepted = torch.tensor([[0, 3, 4, -1], [0, -1, -1, -1], [0, 1, 2, 5]])
    order = path_first_order(accepted, 6)
    assert order.tolist() == [[0, 3, 4, 1, 2, 5], [0, 1, 2, 3, 4, 5], [0, 1, 2, 5, 3, 4]]
    assert all(sorted(row) == list(range(6)) for row in order.tolist())


def test_committed_tokens_follow_the_permuted_window():
    """After verify, the permuted slots hold the path's nodes at consecutive positions: position prefix + j holds
    a node of depth j, and the out tokens are the path tokens then the bonus."""
    gen = torch.Generator().manual_seed(3)
    root = torch.tensor([1, 2, 3])
    tree = build_ddtree(root, torch.randn(3, 4, 12, generator=gen), budget=9)
    logits = torch.randn(3, tree.num_slots, 12, generator=gen)
    # make the target follow some drafted children so paths are longer than the root
    for b in range(3):
        logits[b, 0, tree.tokens[b, 1]] += 50
    result = verify_greedy(tree, logits)
    order = path_first_order(result.accepted_nodes, tree.num_slots)
    depths = tree.depths.gather(1, order)
    for b in range(3):
        k = int(result.num_accepted[b])
        assert k >= 1
        assert depths[b, : k + 1].tolist() == list(range(k + 1))
        path_tokens = tree.tokens[b].gather(0, order[b, 1 : k + 1]).tolist()
        assert path_tokens == result.output_tokens[b, :k].tolist()


def test_gather_rows_reorders_each_request():
    rows = torch.arange(12).view(6, 2)  # [B*N, C]: B = 2, N = 3
    order = torch.tensor([[0, 2, 1], [2, 0, 1]])
    assert gather_rows(rows, order).tolist() == [[0, 1], [4, 5], [2, 3], [10, 11], [6, 7], [8, 9]]
