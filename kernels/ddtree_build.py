"""Batched DDTree construction on the device: one Triton program per request.

The algorithm is ``speculators/ddtree.py`` (derivation in ``docs/ddtree.md``); its torch build
``build_ddtree_ranked`` is this kernel's twin: the same tree, node for node. From one block of draft logits, the tree
of the ``budget`` highest-scoring prefixes, where a prefix (t_1..t_d) scores ``sum_d log q_d(t_d)`` (float32,
accumulated parent score + log-prob). Input is what ``speculators.ddtree.rank_draft_logits`` makes, per depth the
K = min(budget, V) best tokens: ``topk_lp [B, L, K]`` (log-probs, descending; ties by lower vocab id) and
``topk_ids [B, L, K]``.

Best-first order (the pop order of a per-request heap): key (-score, depth, parent node, rank). Lazy
enumeration: the frontier starts with (depth 1, rank 0); popping entry (d, parent, r) creates node n and pushes
its next sibling (d, parent, r+1) and its first child (d+1, n, 0). Both have keys >= the popped key (log-probs are
<= 0 and ranked, float32 addition is monotone), so the pops come out in global key order and the first ``budget``
pops are the best prefixes, prefix-closed.

Worked example (L=2, K=2, budget=3; q1 = [.6, .3], q2 = [.7, .2] as probabilities)::

    frontier {(1,p0,r0) .6}           pop -> node 1 = q1 rank 0, push sibling (1,p0,r1) .3, child (2,p1,r0) .42
    frontier {.3, .42}                pop .42 -> node 2 (depth 2, parent 1), push (2,p1,r1) .12
    frontier {.3, .12}                pop .3  -> node 3 (depth 1, parent 0)
    parents = [-1, 0, 1, 0], depths = [0, 1, 2, 1]

Kernel: the frontier lives in registers as F = next_pow2(budget + 1) slots (score, parent score, depth, parent,
rank, valid); each pop is a lexicographic arg-min over the slots (max score, then min depth, min parent, min rank);
the sibling takes the popped slot, the child the first free slot. At most budget + 1 entries are ever live.
Per request: ``budget`` steps of O(F) vector work and 2-3 scalar loads; no host synchronisation.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

if triton is not None:

    @triton.jit
    def _ddtree_build_kernel(
        lp_ptr,  # [B, L, K] fp32 ranked log-probs
        ids_ptr,  # [B, L, K] int ranked token ids
        root_ptr,  # [B] int
        tokens_ptr,  # [B, N] int64 out
        parents_ptr,  # [B, N] int64 out
        depths_ptr,  # [B, N] int64 out
        length,  # L
        k,  # K
        num_pops,  # N - 1
        stride_lb,
        stride_ld,
        stride_ib,
        stride_id,
        F: tl.constexpr,  # frontier slots, >= num_pops + 1, power of 2
    ):
        b = tl.program_id(0).to(tl.int64)
        n_out = num_pops + 1
        slot = tl.arange(0, F)
        BIG = 1 << 30
        lp_row = lp_ptr + b * stride_lb
        ids_row = ids_ptr + b * stride_ib

        first = tl.load(lp_row)
        score = tl.where(slot == 0, first, -float("inf"))  # [F] score of the prefix the entry would create
        pscore = tl.zeros([F], tl.float32)  # score of its parent node (0 for the root)
        depth = tl.where(slot == 0, 1, 0)  # [F] int32
        parent = tl.zeros([F], tl.int32)
        rank = tl.zeros([F], tl.int32)
        valid = slot == 0

        tl.store(tokens_ptr + b * n_out, tl.load(root_ptr + b).to(tl.int64))
        tl.store(parents_ptr + b * n_out, tl.cast(-1, tl.int64))
        tl.store(depths_ptr + b * n_out, tl.cast(0, tl.int64))
        for node in range(1, num_pops + 1):
            # pop: max score, then min depth, min parent, min rank (the heap key (-score, depth, parent, rank))
            s_best = tl.max(tl.where(valid, score, -float("inf")), 0)
            cand = valid & (score == s_best)
            d_best = tl.min(tl.where(cand, depth, BIG), 0)
            cand = cand & (depth == d_best)
            p_best = tl.min(tl.where(cand, parent, BIG), 0)
            cand = cand & (parent == p_best)
            r_best = tl.min(tl.where(cand, rank, BIG), 0)
            cand = cand & (rank == r_best)
            popped = slot == tl.min(tl.where(cand, slot, BIG), 0)
            ps = tl.sum(tl.where(popped, pscore, 0.0), 0)

            token = tl.load(ids_row + (d_best - 1) * stride_id + r_best).to(tl.int64)
            tl.store(tokens_ptr + b * n_out + node, token)
            tl.store(parents_ptr + b * n_out + node, p_best.to(tl.int64))
            tl.store(depths_ptr + b * n_out + node, d_best.to(tl.int64))

            # next sibling takes the popped slot
            has_sib = r_best + 1 < k
            sib_lp = tl.load(lp_row + (d_best - 1) * stride_ld + r_best + 1, mask=has_sib, other=-float("inf"))
            score = tl.where(popped, ps + sib_lp, score)
            rank = tl.where(popped, r_best + 1, rank)
            valid = tl.where(popped, has_sib, valid)
            # first child takes the first free slot
            has_child = d_best < length
            child_lp = tl.load(lp_row + d_best * stride_ld, mask=has_child, other=-float("inf"))
            free = slot == tl.min(tl.where(valid, BIG, slot), 0)
            pushed = free & has_child
            score = tl.where(pushed, s_best + child_lp, score)
            pscore = tl.where(pushed, s_best, pscore)
            depth = tl.where(pushed, d_best + 1, depth)
            parent = tl.where(pushed, node, parent)
            rank = tl.where(pushed, 0, rank)
            valid = valid | pushed


def ddtree_build(
    root: torch.Tensor,  # [B] int
    topk_lp: torch.Tensor,  # [B, L, K] float32, ranked (speculators.ddtree.rank_draft_logits)
    topk_ids: torch.Tensor,  # [B, L, K] int
    budget: int,
    *,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,  # (tokens, parents, depths) [B, N] int64
):
    """Best-first DDTree for every request at once on the device; the same tree, node for node, as
    ``speculators.ddtree.build_ddtree_ranked``. Returns a ``speculators.trees.DraftTree``
    with ``N = 1 + min(budget, prefixes)`` slots (all real), written into ``out`` when given (static buffers, e.g.
    for CUDA graphs; N from ``speculators.ddtree.num_tree_nodes``)."""
    from sglang_kimi.kernels.interpret import launch
    from sglang_kimi.speculators.ddtree import num_tree_nodes
    from sglang_kimi.speculators.trees import DraftTree

    B, L, K = topk_lp.shape
    if budget < 1 or L < 1:
        raise ValueError(f"ddtree_build needs budget >= 1 and at least one draft position, got {budget}, {L}")
    if tuple(topk_ids.shape) != (B, L, K):
        raise ValueError("topk_lp and topk_ids must have the same shape [B, L, K]")
    n = num_tree_nodes(L, K, budget)
    device = topk_lp.device
    if out is None:
        out = tuple(torch.empty(B, n + 1, dtype=torch.long, device=device) for _ in range(3))
    tokens, parents, depths = out
    for t in out:
        if tuple(t.shape) != (B, n + 1) or t.dtype != torch.long or not t.is_contiguous():
            raise ValueError(f"out tensors must be contiguous int64 [{B}, {n + 1}]")
    if B > 0:
        lp = topk_lp.to(torch.float32)
        if lp.stride(-1) != 1:
            lp = lp.contiguous()
        ids = topk_ids if topk_ids.stride(-1) == 1 else topk_ids.contiguous()
        launch(
            _ddtree_build_kernel,
            (B,),
            lp,
            ids,
            root,
            tokens,
            parents,
            depths,
            L,
            K,
            n,
            lp.stride(0),
            lp.stride(1),
            ids.stride(0),
            ids.stride(1),
            F=triton.next_power_of_2(n + 1),
            num_warps=1 if n < 64 else 2,
        )
    return DraftTree(
        tokens=tokens,
        parents=parents,
        depths=depths,
        num_nodes=torch.full((B,), n + 1, dtype=torch.long, device=device),
        max_depth=min(L, budget),
    )
