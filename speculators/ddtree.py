"""DDTree: the best-first draft tree over one DFlash block, batched over requests.

One DFlash pass gives per-position draft logits ``[B, L, V]`` (position d drafts the d-th token after the root).
A prefix ``(t_1..t_d)`` scores ``sum_d log q_d(t_d)``, the log-probability of the prefix under the product of the
per-position marginals; the tree is the ``budget`` best prefixes (prefix-closed, since a prefix outscores its
extensions). Derivation, tie rules and why the per-depth beam is exact: ``docs/ddtree.md``.

Three steps, each a pure function on tensors (no SGLang, no host synchronisation):

1. :func:`rank_draft_logits`: each position's best K = min(budget, V) tokens, ranked (log-prob descending, then vocab
   id ascending), as log-probs: a top-k of the *raw* logits minus the position's log-sum-exp (no full-vocabulary
   ``log_softmax`` is materialised).
2. Under tensor parallelism the LM head's vocabulary is sharded: :func:`shard_candidates` ranks one shard,
   :func:`merge_shard_candidates` merges every shard's candidates and log-sum-exps into step 1's result, so no rank
   gathers the full vocabulary.
3. :func:`build_ddtree_ranked`: the tree from the ranked candidates (the Triton kernel ``kernels/ddtree_build.py``
   builds the same tree node for node on a GPU). :func:`build_ddtree` is steps 1 and 3.
"""

from __future__ import annotations

import torch

from .trees import NO_PARENT, DraftTree, topk_lowest_index_ties

# On a CPU, rows are ranked a dozen at a time: the log-sum-exp's passes over a [rows, V] block then stay in cache
# (a whole batch of Kimi rows, 64 x 7 x 163840 floats, does not), and one block holds a request's 7 positions (one
# core, V = 163840: 7 rows in blocks of 3 took 1.2x the time of one block). One call per batch on a GPU.
CPU_RANK_BLOCK_ELEMENTS = 1 << 21


def rank_draft_logits(
    draft_logits: torch.Tensor, k: int, *, overwrite: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's best ``k`` tokens as full-vocabulary log-probs.

    draft_logits [..., V] -> (ranked_lp [..., k] float32, ranked_ids [..., k] int64), ranked by logit descending
    then vocab id ascending. ``log_softmax`` is monotone in the logit, so this is the top-k of the log-probs:
    ``ranked_lp = top_logit - logsumexp(row)``. The cost is one ``torch.topk`` and one log-sum-exp: the top-k's
    survivors are ordered on their own (:func:`.trees.topk_lowest_index_ties`), and the log-sum-exp takes the row's
    maximum from the top-k. ``overwrite``: the float32 logits are the caller's scratch (its own copy of a matmul's
    output), and the log-sum-exp's exponentials are taken in place, so nothing of the rows' size is allocated.
    Example: logits [2, 0, 2], k=2 -> ids [0, 2], lp [2, 2] - log(2e^2 + 1).
    """
    logits, in_place = _float32_scratch(draft_logits, overwrite)
    vocab = logits.shape[-1]
    k = min(k, vocab)
    rows = logits if logits.dim() == 2 else logits.reshape(-1, vocab)  # [n, V]
    block = max(1, CPU_RANK_BLOCK_ELEMENTS // vocab) if rows.device.type == "cpu" else max(1, rows.shape[0])
    if rows.shape[0] <= block:  # one block: the batch at once, with no split and no concatenation
        ranked_lp, ranked_ids = _rank_rows(rows, k, in_place)
    else:
        blocks = [_rank_rows(part, k, in_place) for part in rows.split(block)]  # per block ([rows, k], [rows, k])
        ranked_lp, ranked_ids = torch.cat([lp for lp, _ in blocks]), torch.cat([ids for _, ids in blocks])
    if logits.dim() == 2:
        return ranked_lp, ranked_ids
    shape = (*logits.shape[:-1], k)
    return ranked_lp.view(shape), ranked_ids.view(shape)


def _float32_scratch(logits: torch.Tensor, overwrite: bool) -> tuple[torch.Tensor, bool]:
    """The logits in float32, and whether they may be overwritten: the caller said so, or they are a copy made here."""
    if logits.dtype == torch.float32:
        return logits, overwrite
    return logits.float(), True


def _rank_rows(rows: torch.Tensor, k: int, in_place: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rank_draft_logits` of rows [n, V] float32: (ranked_lp [n, k], ranked_ids [n, k]). ``in_place``: the
    rows are scratch (overwritten by their exponentials)."""
    top, ids = topk_lowest_index_ties(rows, k)  # [n, k]
    return top - logsumexp_from_max(rows, top[:, :1], in_place), ids


def logsumexp_from_max(rows: torch.Tensor, row_max: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """``torch.logsumexp(rows, -1, keepdim=True)`` of rows [n, V] given each row's maximum [n, 1] (a top-k's first
    value): the same ``max + log(sum(exp(x - max)))`` without the pass that finds the maximum, an infinite maximum
    shifted by 0 as torch does (a row of -inf gives -inf, one holding +inf gives +inf, NaN stays NaN). ``in_place``:
    the exponentials overwrite ``rows``."""
    shift = torch.where(row_max.isinf(), 0.0, row_max)  # [n, 1]
    exps = rows.sub_(shift).exp_() if in_place else (rows - shift).exp_()  # [n, V]
    return exps.sum(dim=-1, keepdim=True).log_() + shift


def shard_candidates(
    logits: torch.Tensor, k: int, vocab_start: int, *, overwrite: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One vocabulary shard's candidates for :func:`merge_shard_candidates`.

    logits [n, V_shard] (this shard's raw logits, global ids ``vocab_start ..``) -> (values [n, k] raw logits,
    ids [n, k] global int64, lse [n, 1]). A shard smaller than ``k`` offers all it has, padded with -inf values
    (never chosen while a real candidate remains: every shard together holds V >= k tokens). ``overwrite``: as in
    :func:`rank_draft_logits`.
    """
    logits, in_place = _float32_scratch(logits, overwrite)
    local_k = min(k, logits.shape[-1])
    values, ids = topk_lowest_index_ties(logits, local_k)  # [n, local_k]
    lse = logsumexp_from_max(logits, values[:, :1], in_place)  # [n, 1]
    if local_k < k:
        pad = k - local_k
        values = torch.cat([values, values.new_full((values.shape[0], pad), float("-inf"))], dim=1)
        ids = torch.cat([ids, ids.new_full((ids.shape[0], pad), vocab_start)], dim=1)
    return values, ids + vocab_start, lse


def merge_shard_candidates(
    values: torch.Tensor, ids: torch.Tensor, lse: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every shard's :func:`shard_candidates`, concatenated in shard order (increasing id ranges, as an all-gather
    over tensor-parallel ranks lays them out), merged into :func:`rank_draft_logits` of the whole vocabulary.

    values [n, S*k], ids [n, S*k], lse [n, S] -> (ranked_lp [n, k], ranked_ids [n, k]). Among equal values the lower
    position is the lower id (within a shard candidates are ordered by value then id; shards hold increasing ids),
    so the positional tie rule is the id tie rule. The global log-sum-exp is the log-sum-exp of the shards'.
    Example (S=2, k=2): shard 0 (ids 0..2) offers (3.0: 1, 1.0: 0), shard 1 (ids 3..5) (3.0: 4, 2.0: 3) -> ids [1, 4].
    """
    best, pos = topk_lowest_index_ties(values, k)  # [n, k]
    return best - torch.logsumexp(lse, dim=-1, keepdim=True), ids.gather(1, pos)


# float32 holds every integer below 2**24 exactly: a shard's candidate ids travel in its values' tensor
PACKED_ID_LIMIT = 1 << 24


def pack_shard_candidates(values: torch.Tensor, ids: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """:func:`shard_candidates`' (values [n, k], ids [n, k] < PACKED_ID_LIMIT, lse [n, 1]) as one float32 tensor
    [n, 2k + 1] (values, ids, lse), so that the tensor-parallel ranks exchange their candidates in one all-gather."""
    return torch.cat([values.float(), ids.to(torch.float32), lse.float()], dim=-1)


def merge_packed_candidates(gathered: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`merge_shard_candidates` of every rank's :func:`pack_shard_candidates`, all-gathered in rank order:
    gathered [S, n, 2k + 1] -> (ranked_lp [n, k], ranked_ids [n, k] int64)."""
    shards, n, _ = gathered.shape
    by_row = gathered.transpose(0, 1)  # [n, S, 2k+1]
    values = by_row[..., :k].reshape(n, shards * k)  # shards in rank order, as merge_shard_candidates takes them
    ids = by_row[..., k : 2 * k].reshape(n, shards * k).long()
    return merge_shard_candidates(values, ids, by_row[..., 2 * k], k)


def num_tree_nodes(length: int, k: int, budget: int) -> int:
    """Non-root nodes the tree gets: ``budget``, or fewer when there are fewer prefixes of depth <= min(L, budget)
    (e.g. L=2, K=2, budget=10: 2 + 4 = 6)."""
    total, width = 0, 1
    for _ in range(min(length, budget)):
        width = min(budget, width * k)
        total += width
        if total >= budget:
            return budget
    return min(total, budget)


def build_ddtree(root: torch.Tensor, draft_logits: torch.Tensor, budget: int) -> DraftTree:
    """DDTree: the ``budget`` best prefixes of one block of per-position draft logits, as a tree.

    root [B]; draft_logits [B, L, V]: logits of draft positions 1..L (one DFlash pass). A prefix
    (t_1..t_d) scores ``sum_d log_softmax(draft_logits[:, d-1])[t_d]`` (product of per-position marginals).
    ``budget`` counts non-root nodes: the tree has ``N = 1 + min(budget, number of prefixes)`` slots, all real.

    Order (fully deterministic): per position, tokens are ranked by log-prob descending, then vocab id ascending
    (rank r = the r-th best token). Prefixes are ordered by score descending, then depth ascending, then the
    parent's place in this same order, then the rank of the last token. A prefix scores at least as much as its
    extensions and sits at a smaller depth, so it comes first: the best ``budget`` prefixes are prefix-closed,
    and node i of the tree is the i-th best prefix: the pop order of a best-first heap per request whose entries
    are keyed (-score, depth, parent node, rank) (``reference/heap.py``; derivation in ``docs/ddtree.md``).

    Vectorised over the batch with O(L) tensor ops: the best ``budget`` prefixes of depth d are extensions of the
    best ``budget`` prefixes of depth d-1 (each better depth-(d-1) prefix has a better rank-0 extension), so a
    per-depth beam of width ``budget`` holds every selected node; one more top-``budget`` merges the depths.

    Example: L=2, V=3, budget=3, per-position probabilities q1 = [.6, .3, .1], q2 = [.7, .2, .1] (tokens 0..2).
    Prefixes by score: (0) .6, (0,0) .42, (1) .3, (1,0) .21, (0,1) .12, ... The best three give
    tokens [[r, 0, 0, 1]], parents [[-1, 0, 1, 0]], depths [[0, 1, 2, 1]].
    """
    batch, length, vocab = draft_logits.shape
    if budget < 1 or length < 1:
        raise ValueError(f"build_ddtree needs budget >= 1 and at least one draft position, got {budget}, {length}")
    ranked_lp, ranked_ids = rank_draft_logits(draft_logits, min(budget, vocab))  # [B, L, K]: r-th best token
    return build_ddtree_ranked(root, ranked_lp, ranked_ids, budget)


def build_ddtree_ranked(
    root: torch.Tensor, ranked_lp: torch.Tensor, ranked_ids: torch.Tensor, budget: int
) -> DraftTree:
    """:func:`build_ddtree` from each position's best K tokens, already ranked.

    root [B]; ranked_lp [B, L, K] float32 log-probs over the full vocabulary and ranked_ids [B, L, K], rank r = the
    r-th best token (log-prob descending, then vocab id ascending), K = min(budget, V): :func:`rank_draft_logits`, or
    :func:`shard_candidates` + :func:`merge_shard_candidates` under tensor parallelism. Only these K per position
    can enter a tree of ``budget`` nodes.

    The beams' entries, depth-major, are the candidates; entry e of beam d extends entry ``pick // K`` of beam
    d - 1 by its position's rank ``pick % K`` token. Everything after the beam loop is one tensor over all entries
    (the root first), so the number of tensor ops grows with the depth only, not with the batch or the budget.
    """
    batch, length, k = ranked_lp.shape
    if budget < 1 or length < 1:
        raise ValueError(f"build_ddtree needs budget >= 1 and at least one draft position, got {budget}, {length}")
    depth = min(length, budget)
    device = ranked_lp.device

    # Beam of depth d: its best prefixes, ordered (score desc, parent's beam position, rank): ties to lower index.
    step_lp = ranked_lp.unsqueeze(2).unbind(1)  # per position [B, 1, K]
    beams = [ranked_lp[:, 0]]  # per depth [B, W_d]: prefix scores
    picks = []  # per depth >= 2 [B, W_d]: parent's beam position * K + rank
    for d in range(1, depth):
        extend = (beams[-1].unsqueeze(2) + step_lp[d]).flatten(1)  # [B, W * K], flat = parent_pos * K + rank
        top_scores, top_pick = topk_lowest_index_ties(extend, min(budget, extend.shape[1]))  # [B, W_d]
        beams.append(top_scores)
        picks.append(top_pick)

    # Merge depths: depth-major concatenation, ties to lower index = (score desc, depth asc, beam position asc).
    widths = [b.shape[1] for b in beams]
    num = min(budget, sum(widths))
    ranked = torch.cat(beams, dim=1).sort(dim=1, descending=True, stable=True)[1]  # [B, M]: entries best first

    parent_base, token_base, column_depth, first_picks = _column_facts(widths, k, device)  # [1 + M] .. [1 + K]
    zero = torch.zeros((batch, 1), dtype=torch.long, device=device)
    pick = torch.cat([first_picks.expand(batch, -1), *picks], dim=1)  # [B, 1 + M]: the root's, then the entries'
    root = root if root.dtype == torch.long else root.long()
    ids = torch.cat([root[:, None], ranked_ids.flatten(1)], dim=1)  # [B, 1 + L * K]: the root, then the ranks
    # lookup [B, 2 + M]: slot 0 NO_PARENT, slot 1 the root's node 0, slot 2 + e entry e's node (its place + 1)
    lookup = torch.cat([zero + NO_PARENT, zero, ranked.argsort(dim=1) + 1], dim=1)
    order = torch.cat([zero, ranked[:, :num] + 1], dim=1)  # [B, 1 + n]: node i = column order[:, i]
    tokens = ids.gather(1, (pick % k + token_base).gather(1, order))
    parents = lookup.gather(1, (pick // k + parent_base).gather(1, order))  # prefix closure: parents are selected
    depths = column_depth.expand(batch, -1).gather(1, order)
    num_nodes = torch.full((batch,), num + 1, dtype=torch.long, device=device)
    return DraftTree(tokens, parents, depths, num_nodes, max_depth=depth)


_COLUMN_FACTS: dict[tuple, tuple[torch.Tensor, ...]] = {}


def _column_facts(widths: list[int], k: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The constants of :func:`build_ddtree_ranked`'s columns (0 the root, 1 + e entry e, beams depth-major), made
    once per (beam widths, K, device) and kept: a step reads them without a host-to-device copy (a CUDA graph
    capture, which SGLang precedes with warm-up runs, finds them made).

    Returns, per column [1 + M]: the parent's slot in the node lookup beyond its beam position (the root 0 =
    NO_PARENT, depth 1: 1 = the root, beam d: 2 + the start of beam d - 1), its token's column in the ids' row
    beyond its rank (the root 0, position d: 1 + d * K), its depth; and the first 1 + K picks (the root's 0, then
    depth 1's ranks 0..K-1 below the root).
    """
    key = (tuple(widths), k, str(device))
    cached = not torch.compiler.is_compiling()  # a compiled graph holds its own constants
    facts = _COLUMN_FACTS.get(key) if cached else None
    if facts is None:
        starts = [sum(widths[:d]) for d in range(len(widths))]
        per_beam = [(1, 1, 1)] + [(2 + starts[d - 1], 1 + d * k, d + 1) for d in range(1, len(widths))]
        columns = [(0, 0, 0)] + [fact for fact, width in zip(per_beam, widths) for _ in range(width)]
        rows = [list(row) for row in zip(*columns)] + [[0, *range(k)]]
        facts = tuple(torch.tensor(row, dtype=torch.long, device=device) for row in rows)
        if cached:
            _COLUMN_FACTS[key] = facts
    return facts
