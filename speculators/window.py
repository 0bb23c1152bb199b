"""A tree's verify window: padding it to the window's slots, and committing the accepted path.

A tree verify runs the target once over every node of every request's tree, node i of request b in the i-th slot of
the request's verify window, at position ``prefix_lens[b] + depth[b, i]``. After verification the accepted path
moves to the front of the window (:func:`path_first_order`), so the committed tokens sit in consecutive slots at
consecutive positions exactly as after a chain verify, and every consumer downstream (KV bookkeeping, log-probs, the
drafter's context features) sees a chain. Pure functions on tensors; ``sglang_kimi/speculative/workers/dflash_tree.py``
applies
them to SGLang's ``req_to_token`` and verify outputs.
"""

from __future__ import annotations

import torch

from .trees import NO_PARENT, DraftTree


def pad_tree(tree: DraftTree, num_slots: int) -> DraftTree:
    """The tree with padding slots up to ``num_slots`` (a DDTree has fewer nodes than its budget only when the block
    has fewer prefixes). A padding node's token is the root's (a valid id for the verify forward); its parent is
    ``NO_PARENT`` and its depth 0, so it is nobody's child and sees only itself: it is never accepted.

    Example: tokens [[r, a]] padded to 4 slots -> tokens [[r, a, r, r]], parents [[-1, 0, -1, -1]], num_nodes [2].
    """
    batch, slots = tree.tokens.shape
    if slots == num_slots:
        return tree
    if slots > num_slots:
        raise ValueError(f"a tree of {slots} slots does not fit a verify window of {num_slots}")
    extra = num_slots - slots

    def pad(x: torch.Tensor, fill) -> torch.Tensor:
        fill = fill if isinstance(fill, torch.Tensor) else x.new_full((batch, extra), fill)
        return torch.cat([x, fill], dim=1)

    return DraftTree(
        tokens=pad(tree.tokens, tree.tokens[:, :1].expand(batch, extra)),
        parents=pad(tree.parents, NO_PARENT),
        depths=pad(tree.depths, 0),
        num_nodes=tree.num_nodes,
        max_depth=tree.max_depth,
    )


def path_first_order(accepted_nodes: torch.Tensor, num_slots: int) -> torch.Tensor:
    """The permutation of each request's N window slots that puts the accepted path first.

    accepted_nodes [B, D+1] int64: root (0), then the accepted nodes, then ``NO_NODE``. Returns order [B, N]: the
    path's nodes in path order, then every other node in node order; ``slots.gather(1, order)`` moves the path to the
    front.

    Example: N = 5, path [0, 3, 4]: order [0, 3, 4, 1, 2].
    """
    batch, width = accepted_nodes.shape
    device = accepted_nodes.device
    # key[b, i]: where node i goes: its place on the path, else after the path in node order; NO_NODE % (N + 1) = N,
    # the column that absorbs the path's padding
    after_path = torch.arange(width, num_slots + 1 + width, device=device).expand(batch, -1)  # [B, N+1]
    places = torch.arange(width, device=device).expand(batch, -1)  # [B, D+1]
    key = after_path.scatter(1, accepted_nodes % (num_slots + 1), places)
    return key[:, :num_slots].argsort(dim=1)


def gather_rows(rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """rows [B*N, C] -> rows reordered per request by order [B, N] (row j of request b = its node ``order[b, j]``).

    Example: B = 1, N = 3, order [[0, 2, 1]]: rows [x, y, z] -> [x, z, y].
    """
    batch, n = order.shape
    index = (order + torch.arange(batch, device=order.device)[:, None] * n).reshape(-1)  # [B*N]
    return rows.index_select(0, index)
