"""A DDTree step on each side of the target forward, as static-shape functions.

- :func:`draft_side`: the drafter's hidden states at the block's draft positions -> the target's LM head -> each
  position's best K tokens (:mod:`.ddtree`'s ranking) -> the DDTree of ``width`` nodes, or the chain of argmax drafts
  -> padded to the verify window of N = width + 1 slots, with each node's position and the tree's ancestor mask.
- the verify side: the target's rows at the N nodes (logits for greedy, probabilities and coins for sampling)
  -> tree verification (:func:`.verify.verify_tree`) -> :func:`commit_layout`: the committed tokens (accepted drafts,
  then the bonus), the path-first order of the window (:func:`.window.path_first_order`), and the slots, columns and
  draft-KV rows the commit writes.

Every output's shape is fixed by (batch, width, block), nothing reads the device on the host, and no shape depends
on data: a CUDA graph per (batch bucket, width) can hold each side, and SGLang's overlap scheduler can run the host
a step ahead. ``tests/unit/test_tree_step.py`` proves it on CPU with ``torch.compile(fullgraph=True,
dynamic=False)`` and ``torch.export(strict=True)`` at several batch sizes and widths (the verify side as one
function: ``verify_side`` in ``tests/support/verify_layout.py``). Under tensor parallelism the ranking is
:func:`rank_draft_hidden_sharded` (each rank's :func:`.ddtree.shard_candidates`, packed into one all-gather, merged),
inside :func:`draft_side` too, so the draft side with its one collective is one graph as well.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from .ddtree import (
    PACKED_ID_LIMIT,
    build_ddtree_ranked,
    merge_packed_candidates,
    pack_shard_candidates,
    rank_draft_logits,
    shard_candidates,
)
from .trees import DraftTree, build_chain
from .verify import VerifyResult
from .window import pad_tree, path_first_order

OUT_TOKEN_PAD = 0  # past a request's commit: SGLang reads only its first commit_len tokens; 0 keeps gathers in range


# (packed candidates [n, C] of this rank) -> [S, n, C], every rank's in rank order: the tensor-parallel all-gather
Gather = Callable[[torch.Tensor], torch.Tensor]


def draft_side(
    draft_hidden: torch.Tensor,
    lm_head: torch.Tensor,
    root: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    width: int,
    tree: bool,
    use_kernel: bool = False,
    vocab_start: int = 0,
    gather: Gather | None = None,
) -> tuple[DraftTree, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One request batch's draft, from the drafter's hidden states to the verify window.

    draft_hidden [B, D, H]: the block's draft positions 1..D (D >= 1 used: min(width, D)); lm_head [V, H]: the
    target's LM head, or under tensor parallelism this rank's shard of it (ids from ``vocab_start``) with ``gather``
    the ranks' all-gather (:func:`rank_draft_hidden_sharded`); root [B]: the last committed token; prefix_lens [B]:
    the committed lengths. ``tree``: a DDTree of ``width`` nodes, else the chain of the block's argmax drafts.
    ``use_kernel``: the Triton DDTree build (GPU). Returns (the tree padded to N = width + 1 slots, positions [B, N],
    ancestor mask [B, N, N] bool, nonfinite [B, D', K] bool: the drafts whose log-prob was NaN or +inf, ranked last).
    """
    hidden, k = draft_hidden[:, :width], width if tree else 1
    if gather is None:
        ranked_lp, ranked_ids = rank_draft_hidden(hidden, lm_head, k)
    else:
        ranked_lp, ranked_ids = rank_draft_hidden_sharded(hidden, lm_head, k, vocab_start, gather)
    return tree_from_ranked(root, ranked_lp, ranked_ids, prefix_lens, width=width, tree=tree, use_kernel=use_kernel)


def rank_draft_hidden(draft_hidden: torch.Tensor, lm_head: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each draft position's best ``k`` tokens under the LM head: draft_hidden [..., H], lm_head [V, H] ->
    (log-probs [..., k] float32 over the whole vocabulary, ids [..., k]), ranked by log-prob then id."""
    lead = draft_hidden.shape[:-1]
    # one 2-D matmul over contiguous rows: over a strided 3-D view (the block's draft positions) a CPU runs a
    # batched matmul many times slower
    rows = draft_hidden.reshape(-1, draft_hidden.shape[-1])  # [n, H]
    rows = rows if rows.dtype == lm_head.dtype else rows.to(lm_head.dtype)
    logits = torch.nn.functional.linear(rows, lm_head)  # [n, V]: a fresh tensor, so the ranking may overwrite it
    ranked_lp, ranked_ids = rank_draft_logits(logits, k, overwrite=True)  # [n, k]
    return ranked_lp.view(*lead, -1), ranked_ids.view(*lead, -1)


def rank_draft_hidden_sharded(
    draft_hidden: torch.Tensor, lm_head_shard: torch.Tensor, k: int, vocab_start: int, gather: Gather
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rank_draft_hidden` under tensor parallelism: this rank ranks its shard of the LM head
    (lm_head_shard [V_shard, H], global ids ``vocab_start ..``), the ranks' candidates and log-sum-exps travel packed
    in one all-gather (``gather``), and every rank merges them into the same ranking of the whole vocabulary."""
    if vocab_start + lm_head_shard.shape[0] > PACKED_ID_LIMIT:
        raise ValueError(f"token ids up to {vocab_start + lm_head_shard.shape[0]} do not travel exactly in float32")
    lead = draft_hidden.shape[:-1]
    rows = draft_hidden.reshape(-1, draft_hidden.shape[-1])  # [n, H]
    rows = rows if rows.dtype == lm_head_shard.dtype else rows.to(lm_head_shard.dtype)
    logits = torch.nn.functional.linear(rows, lm_head_shard)  # [n, V_shard]: fresh, the ranking may overwrite it
    values, ids, lse = shard_candidates(logits, k, vocab_start, overwrite=True)  # [n, k], [n, k], [n, 1]
    ranked_lp, ranked_ids = merge_packed_candidates(gather(pack_shard_candidates(values, ids, lse)), k)  # [n, k]
    return ranked_lp.view(*lead, -1), ranked_ids.view(*lead, -1)


def tree_from_ranked(
    root: torch.Tensor,
    ranked_lp: torch.Tensor,
    ranked_ids: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    width: int,
    tree: bool,
    use_kernel: bool = False,
) -> tuple[DraftTree, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`draft_side` from each position's ranked candidates (ranked_lp, ranked_ids [B, D', K])."""
    finite = ranked_lp < float("inf")  # False for NaN and +inf: a corrupted drafter, which costs acceptance only
    ranked_lp = torch.where(finite, ranked_lp, float("-inf"))
    nonfinite = ~finite
    if not tree:
        return (*chain_window(root, ranked_ids[:, :width, 0], prefix_lens, width + 1), nonfinite)
    if use_kernel:
        from ..kernels.ddtree_build import ddtree_build

        drafted = ddtree_build(root, ranked_lp, ranked_ids, width)
    else:
        drafted = build_ddtree_ranked(root, ranked_lp, ranked_ids, width)
    drafted = pad_tree(drafted, width + 1)
    return drafted, drafted.positions(prefix_lens), drafted.ancestor_mask(), nonfinite


def chain_window(
    root: torch.Tensor, drafts: torch.Tensor, prefix_lens: torch.Tensor, window: int
) -> tuple[DraftTree, torch.Tensor, torch.Tensor]:
    """The chain root [B] -> drafts [B, D] padded to a verify window of N = ``window`` >= D + 1 slots: (tree,
    positions [B, N], ancestor mask [B, N, N] bool)."""
    drafted = pad_tree(build_chain(root, drafts), window)
    return drafted, drafted.positions(prefix_lens), drafted.ancestor_mask()


@dataclass
class CommitLayout:
    """What a verified window commits, as a chain of ``accepted + 1`` tokens (:func:`commit_layout`).

    Example: N = 3, path [0, 2], bonus y: out_tokens [t2, y, 0], commit_lens [2], order [0, 2, 1].
    """

    out_tokens: torch.Tensor  # [B, N] int64: the accepted drafts, then the bonus, then OUT_TOKEN_PAD
    commit_lens: torch.Tensor  # [B] int32: accepted + 1
    bonus: torch.Tensor  # [B] int64: the token sampled where verification stopped
    order: torch.Tensor  # [B, N] int64: the path-first permutation of the window
    committed_slots: torch.Tensor  # [B, N]: verify_slots in that order, for req_to_token's columns
    columns: torch.Tensor  # [B, N] int64: prefix + 0..N-1
    draft_rows: torch.Tensor  # [B, N]: the drafter's KV rows in that order
    new_seq_lens: torch.Tensor  # [B]: prefix + commit_lens

    def as_tuple(self) -> tuple[torch.Tensor, ...]:
        """The fields in order (a compiled or exported graph returns tensors)."""
        return tuple(getattr(self, f.name) for f in fields(self))


def commit_layout(
    result: VerifyResult, verify_slots: torch.Tensor, draft_rows: torch.Tensor, prefix_lens: torch.Tensor
) -> CommitLayout:
    """What a verified window commits, as a chain of ``accepted + 1`` tokens (:class:`CommitLayout`).

    result: the verification of B trees of N slots; verify_slots [B, N]: the KV slots the verify wrote (node i in
    column i); draft_rows [B, N]: the drafter's KV rows of the same columns; prefix_lens [B].
    """
    batch, n = verify_slots.shape
    commit_lens = (result.num_accepted + 1).to(torch.int32)  # [B]
    order = result.window_order if result.window_order is not None else path_first_order(result.accepted_nodes, n)
    emitted = result.output_tokens if result.output_tokens.shape[1] <= n else result.output_tokens[:, :n]
    out_tokens = emitted.clamp(min=OUT_TOKEN_PAD)  # [B, min(D+1, N)]: tokens are >= 0, PAD_TOKEN_ID is not
    if out_tokens.shape[1] < n:
        out_tokens = torch.nn.functional.pad(out_tokens, (0, n - out_tokens.shape[1]), value=OUT_TOKEN_PAD)
    columns = prefix_lens[:, None] + torch.arange(n, device=prefix_lens.device)  # [B, N] int64: int32 lens promote
    new_seq_lens = prefix_lens + commit_lens  # [B], prefix_lens' dtype (int64 or int32: int32 commit_lens promote)
    return CommitLayout(
        out_tokens=out_tokens,
        commit_lens=commit_lens,
        bonus=result.bonus,
        order=order,
        committed_slots=verify_slots.gather(1, order),
        columns=columns,
        draft_rows=draft_rows.gather(1, order),
        new_seq_lens=new_seq_lens,
    )
