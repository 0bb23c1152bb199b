"""Draft trees: chains, EAGLE dynamic trees and DDTree best-first trees, batched in fixed-size tensors.

A :class:`DraftTree` holds B independent trees in ``[B, N]`` tensors. Node 0 is the **root**: the last committed
token (the previous step's bonus), whose target logits predict the first draft token. Every other node is a
drafted token; its parent has a smaller index, so a single left-to-right pass visits parents before children.
Slots at or beyond ``num_nodes[b]`` are **padding**: ``PAD_TOKEN_ID`` token, ``NO_PARENT`` parent, depth 0.

Worked example (B=1, N=5, one padding slot)::

    tokens    = [[r, a, b, c, -1]]      # r = root token; -1 = PAD_TOKEN_ID
    parents   = [[-1, 0, 0, 1, -1]]     # a and b are children of the root, c is a child of a
    depths    = [[0, 1, 1, 2, 0]]
    num_nodes = [4]
    ancestor_mask()[0] (row i sees column j)    positions(start=[7]) = [[7, 8, 8, 9, 7]]
        r a b c pad
      r 1 0 0 0 0                               retrieve_index()        = [[0, 1, 2, 3, 4]]
      a 1 1 0 0 0                               retrieve_next_token()   = [[1, 3, -1, -1, -1]]
      b 1 0 1 0 0                               retrieve_next_sibling() = [[-1, 2, -1, -1, -1]]
      c 1 1 0 1 0
    pad 0 0 0 0 1

Builders: :func:`build_chain` (DFlash blocks, EAGLE topk=1), :func:`draft_eagle_tree` / :func:`build_eagle_tree`
(EAGLE-2/3 dynamic tree exactly as SGLang's ``draft_forward`` + ``organize_draft_results`` +
``build_tree_kernel_efficient``); the DDTree build is :mod:`.ddtree`. :meth:`DraftTree.from_retrieve` reads SGLang's
retrieve arrays back into a tree (the one conversion from SGLang's layout).
Pure PyTorch and batched on the tensors' device: no Python loop over requests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

PAD_TOKEN_ID = -1  # token of a padding slot
NO_PARENT = -1  # parent of the root and of padding slots
NO_NODE = -1  # SGLang's "none" in retrieve_next_token / retrieve_next_sibling


@dataclass
class DraftTree:
    """B draft trees in fixed-size tensors; see the module docstring for a worked example.

    ``max_depth`` is a static upper bound on ``depths`` (a Python int, so accepted-path buffers can be sized
    without reading the device): a chain of L drafts has ``max_depth == L``.
    """

    tokens: torch.Tensor  # [B, N] int64; node 0 = root = last committed token
    parents: torch.Tensor  # [B, N] int64; NO_PARENT for the root and padding, else < own index
    depths: torch.Tensor  # [B, N] int64; root 0, padding 0
    num_nodes: torch.Tensor  # [B] int64; root included, so 1 <= num_nodes <= N
    max_depth: int

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_slots(self) -> int:
        return self.tokens.shape[1]

    def valid(self) -> torch.Tensor:
        """Real (non-padding) nodes. Returns bool [B, N]."""
        slots = torch.arange(self.num_slots, device=self.tokens.device)
        return slots[None, :] < self.num_nodes[:, None]

    @classmethod
    def from_parents(
        cls,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        num_nodes: torch.Tensor | None = None,
        max_depth: int | None = None,
    ) -> DraftTree:
        """Build a tree from tokens [B, N] and parents [B, N]; depths are derived.

        ``num_nodes [B]`` defaults to N (no padding). Padding slots are overwritten with the sentinels.
        ``max_depth`` (a static bound on the depths) defaults to the deepest node, read from the device.
        Raises ValueError unless the root has ``NO_PARENT`` and every other real node's parent is a smaller index.
        Example: ``parents = [[-1, 0, 0, 1]]`` gives ``depths = [[0, 1, 1, 2]]``.
        """
        batch, n = tokens.shape
        device = tokens.device
        if num_nodes is None:
            num_nodes = torch.full((batch,), n, dtype=torch.long, device=device)
        slots = torch.arange(n, device=device)
        valid = slots[None, :] < num_nodes[:, None]  # [B, N]
        tokens = torch.where(valid, tokens.long(), PAD_TOKEN_ID)
        parents = torch.where(valid, parents.long(), NO_PARENT)
        nonroot = valid & (slots[None, :] > 0)
        ok = (num_nodes >= 1).all() & (num_nodes <= n).all() & (parents[:, 0] == NO_PARENT).all()
        ok &= ((parents >= 0) & (parents < slots[None, :]) | ~nonroot).all()
        if not bool(ok):
            raise ValueError("parents must be NO_PARENT for the root and smaller than the node index elsewhere")
        depths = torch.zeros_like(parents)
        for i in range(1, n):  # parents precede children, so one left-to-right pass suffices
            parent_depth = depths.gather(1, parents[:, i : i + 1].clamp(min=0))[:, 0]
            depths[:, i] = torch.where(nonroot[:, i], parent_depth + 1, 0)
        if max_depth is None:
            max_depth = int(depths.max()) if n > 0 else 0
        return cls(tokens, parents, depths, num_nodes.long(), max_depth)

    @classmethod
    def from_retrieve(
        cls,
        tokens: torch.Tensor,
        next_token: torch.Tensor,
        next_sibling: torch.Tensor,
        max_depth: int,
        num_nodes: torch.Tensor | None = None,
    ) -> DraftTree:
        """The tree SGLang describes by its retrieve arrays (the one conversion from SGLang's layout; the inverse of
        :meth:`retrieve_next_token` / :meth:`retrieve_next_sibling`).

        tokens [B, N] (node 0 = root), next_token [B, N] (first child or ``NO_NODE``), next_sibling [B, N] (next
        sibling or ``NO_NODE``); every slot is a real node unless ``num_nodes`` [B] says fewer (padding last, linked
        from nowhere). A node's first child and next sibling have larger
        indices (SGLang's ``build_tree_kernel_efficient`` links them so), so one pass in index order finds every
        parent. ``max_depth``: SGLang's speculative steps (the accept-index width minus one).

        Example: next_token [[1, 3, -1, -1]], next_sibling [[-1, 2, -1, -1]] -> parents [[-1, 0, 0, 1]].
        """
        batch, n = tokens.shape
        device = tokens.device
        rows = torch.arange(batch, device=device)
        parents = torch.full((batch, n), NO_PARENT, dtype=torch.long, device=device)
        for i in range(n):
            child, sibling = next_token[:, i].long(), next_sibling[:, i].long()  # [B]
            has_child, has_sibling = child > i, sibling > i
            parents[rows[has_child], child[has_child]] = i
            parents[rows[has_sibling], sibling[has_sibling]] = parents[rows[has_sibling], i]
        return cls.from_parents(tokens, parents, num_nodes, max_depth=max_depth)

    def ancestor_mask(self) -> torch.Tensor:
        """bool [B, N, N]: row i sees column j iff j is i or an ancestor of i (the root is everyone's ancestor).

        Padding rows see only themselves (so a softmax over the row stays finite); no real row sees padding.
        The transitive closure of "is i or i's parent": with R = I + P (P[i, j] = 1 iff j is i's parent), entry
        (i, j) of R**m counts the ways to climb from i to j in m steps that each stay or go up one generation, so it is
        positive iff j is i or an ancestor at most m generations up; m = max_depth reaches every ancestor. One
        ``matrix_power`` (repeated squaring inside one operator, no loop over depths or nodes), in float64: the counts
        stay below 2**m, exact enough for their sign and finite for any m < 1024.
        """
        n = self.num_slots
        slots = torch.arange(n, device=self.tokens.device)
        step = (self.parents[:, :, None] == slots) | torch.eye(n, dtype=torch.bool, device=self.tokens.device)
        return torch.linalg.matrix_power(step.double(), max(self.max_depth, 1)) > 0  # [B, N, N]

    def node_paths(self) -> list[list[list[int]]]:
        """Host lists [B][N]: the drafts from the root's child down to each node, the node included; the root's
        path and padding's are empty. Example: tokens [[5, 7, 8, 9]], parents [[-1, 0, 0, 1]] ->
        [[[], [7], [8], [7, 9]]]."""
        tokens, parents, num_nodes = self.tokens.tolist(), self.parents.tolist(), self.num_nodes.tolist()
        out = []
        for row_tokens, row_parents, count in zip(tokens, parents, num_nodes):
            paths: list[list[int]] = [[] for _ in range(self.num_slots)]
            for node in range(1, count):  # a parent's index is below its child's: one pass in index order
                paths[node] = [*paths[row_parents[node]], row_tokens[node]]
            out.append(paths)
        return out

    def positions(self, start: torch.Tensor) -> torch.Tensor:
        """Position ids [B, N] int64 = start [B] (int32 or int64) + depth: the root sits at ``start``, padding too."""
        return start[:, None] + self.depths

    def retrieve_index(self) -> torch.Tensor:
        """SGLang's ``retrieve_index`` [B, N]: the flat row ``b * N + i`` of node i (padding included)."""
        n = self.num_slots
        slots = torch.arange(n, device=self.tokens.device)
        return torch.arange(self.batch_size, device=self.tokens.device)[:, None] * n + slots[None, :]

    def retrieve_next_token(self) -> torch.Tensor:
        """SGLang's ``retrieve_next_token`` [B, N]: the first (lowest-index) child, NO_NODE if none.

        SGLang's ``build_tree_kernel_efficient`` links children in ascending node order, so the first child is the
        lowest index; e.g. ``parents = [[-1, 0, 0, 1]]`` gives ``[[1, 3, -1, -1]]``.
        """
        n = self.num_slots
        slots = torch.arange(n, device=self.tokens.device)
        is_child = self.valid()[:, None, :] & (self.parents[:, None, :] == slots[None, :, None])  # [B, parent, child]
        first = is_child.int().argmax(dim=-1)  # argmax returns the first maximum
        return torch.where(is_child.any(dim=-1), first, NO_NODE)

    def retrieve_next_sibling(self) -> torch.Tensor:
        """SGLang's ``retrieve_next_sibling`` [B, N]: the next sibling in ascending index order, NO_NODE if none.

        E.g. ``parents = [[-1, 0, 0, 1]]`` gives ``[[-1, 2, -1, -1]]`` (node 1's next sibling is node 2).
        """
        n = self.num_slots
        slots = torch.arange(n, device=self.tokens.device)
        valid = self.valid()
        later = slots[None, :] > slots[:, None]  # [N, N]: column after row
        is_sibling = (
            valid[:, :, None]
            & valid[:, None, :]
            & (self.parents[:, :, None] == self.parents[:, None, :])
            & (self.parents[:, :, None] >= 0)
            & later[None]
        )  # [B, node, sibling]
        first = is_sibling.int().argmax(dim=-1)
        return torch.where(is_sibling.any(dim=-1), first, NO_NODE)


def build_chain(root: torch.Tensor, draft_tokens: torch.Tensor) -> DraftTree:
    """A chain: root [B] followed by draft_tokens [B, L]; N = L + 1, node i has parent i - 1 and depth i.

    Example: ``root = [5], draft_tokens = [[7, 9]]`` gives ``tokens = [[5, 7, 9]], parents = [[-1, 0, 1]]``.
    """
    batch, length = draft_tokens.shape
    slots = torch.arange(length + 1, device=root.device)
    return DraftTree(
        tokens=torch.cat([root[:, None].long(), draft_tokens.long()], dim=1),  # [B, L+1]
        parents=(slots - 1).expand(batch, -1).clone(),
        depths=slots.expand(batch, -1).clone(),
        num_nodes=torch.full((batch,), length + 1, dtype=torch.long, device=root.device),
        max_depth=length,
    )


# Rows up to this long are ranked by one stable sort; longer ones (a vocabulary, a wide beam) by one top-k. On one CPU
# core a stable sort of 56 rows of 4096 took 11.5 ms against 0.48 ms for a top-k; of 8 rows, the sort is the cheaper
# up to about 256 values and the top-k from about 512.
SORT_RANK_MAX = 256
# A long row's top-k keeps 2k + SURVIVOR_SLACK survivors, so that every value tied with the k-th best is among them
# (then the lowest indices among the ties are found on the survivors alone) unless more than k + SURVIVOR_SLACK
# values tie there. torch.topk's cost hardly depends on k at these sizes (a vocabulary of 163840: the same time for
# k = 8 and 48 on a CPU core).
SURVIVOR_SLACK = 16


def topk_lowest_index_ties(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of values [..., V] along the last dim, ordered by value descending then index ascending.

    Deterministic where ``torch.topk`` is not: among equal values the lowest indices win, also across the cut.
    Static shapes and no host synchronisation on a GPU (a CUDA graph holds it). -0.0 ranks as 0.0 and NaN above
    every number, as ``torch.topk`` ranks them.

    - short rows (<= SORT_RANK_MAX): one stable sort;
    - long rows: one ``torch.topk`` of ``w = 2k + SURVIVOR_SLACK`` survivors, then the survivors ordered by integer
      keys (:func:`_survivor_topk`): the working set is the survivors', whatever V. Exact whenever a survivor is
      below the k-th value (every value tied with it survived). On a CPU the rows where more values tie than
      survived are ranked again over the whole row (:func:`_keyed_topk`; the host reads that flag for free there, and
      a compiled graph takes the whole-row keys throughout), so the rule holds on every row. On a GPU such a row (more
      than k + SURVIVOR_SLACK values equal at the k-th best: a saturated drafter row) keeps the tied tokens
      ``torch.topk`` kept: the draft is still the k best values, only which of the equal ones may differ.

    Example: ``values = [0, 3, 1, 3], k = 2`` gives ``([3, 3], [1, 3])``; ``k = 3`` gives ``([3, 3, 1], [1, 3, 2])``.
    Returns (values [..., k], indices [..., k] int64).
    """
    num = values.shape[-1]
    k = min(k, num)
    if num <= SORT_RANK_MAX:
        top, idx = values.sort(dim=-1, descending=True, stable=True)
        return (top, idx) if k == num else (top[..., :k], idx[..., :k])
    wide = 2 * k + SURVIVOR_SLACK
    on_host = values.device.type == "cpu"
    if wide >= num or (on_host and torch.compiler.is_compiling()):
        return _keyed_topk(values, k)
    top, idx, complete = _survivor_topk(values, k, wide)
    if on_host and not bool(complete.all()):  # a CPU reads its own memory: no device to wait for
        rows, lead = values.reshape(-1, num), values.shape[:-1]
        redo = (~complete).reshape(-1).nonzero()[:, 0]  # [r]: rows with more ties at the cut than survived
        redo_top, redo_idx = _keyed_topk(rows[redo], k)  # [r, k]
        top = top.reshape(-1, k).index_copy(0, redo, redo_top).view(*lead, k)
        idx = idx.reshape(-1, k).index_copy(0, redo, redo_idx).view(*lead, k)
    return top, idx


def _survivor_topk(values: torch.Tensor, k: int, wide: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`topk_lowest_index_ties` from ``torch.topk``'s ``wide`` survivors of values [..., V] (k < wide < V).

    ``torch.topk`` keeps every value above its wide-th and some of those equal to it, in an order of its choosing;
    the survivors are then ranked by the keys of :func:`_keyed_topk` over [..., wide] only. Returns (values [..., k],
    indices [..., k], complete [...] bool): complete where the last survivor is below the k-th value (so every value
    tied with the k-th survived and the result is the rule's), or the k-th is NaN and the last survivor is not.
    Example (V = 6, k = 1, wide = 2): [1, 5, 5, 5, 0, 2]: survivors two of the three 5s -> incomplete.
    """
    num = values.shape[-1]
    top, idx = values.topk(wide, dim=-1)  # [..., wide]: value-descending, ties in torch's order
    key = torch.add(num - 1 - idx, _order_key(top), alpha=1 << 32)  # [..., wide] int64, unique per row
    pick = key.topk(k, dim=-1).indices  # [..., k]: value descending, then index ascending
    ranked = top.gather(-1, pick)  # [..., k]
    kth, last = ranked[..., -1], top[..., -1]  # [...]
    complete = (last < kth) | (kth.isnan() & ~last.isnan())
    return ranked, idx.gather(-1, pick), complete


def _keyed_topk(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`topk_lowest_index_ties` over the whole row: one ``topk`` over int64 keys
    ``order_key(value) * 2**32 + (V - 1 - index)``, unique per row, so the k largest keys are the order itself."""
    num = values.shape[-1]
    reversed_index = torch.arange(num - 1, -1, -1, device=values.device)  # [V]: lower index, larger key
    key = torch.add(reversed_index, _order_key(values), alpha=1 << 32)  # [..., V] int64
    idx = key.topk(k, dim=-1).indices  # [..., k], sorted
    return values.gather(-1, idx), idx


def _order_key(values: torch.Tensor) -> torch.Tensor:
    """int64 [..., V] ordered as the float32 values are, equal for equal values: sign * magnitude bits (a float's
    magnitude bits grow with its magnitude), so -0.0 and 0.0 both key 0, and every NaN keys one magnitude above
    +inf whatever its sign and payload. Integer arithmetic only (a CPU runs it several times faster than float
    comparisons and selects). Example: -1.0, -0.0, 0.0, 1.0, inf, nan -> -1065353216, 0, 0, 1065353216, 2139095040,
    2139095041."""
    bits = (values if values.dtype == torch.float32 else values.float()).view(torch.int32)
    magnitude = (bits & 0x7FFFFFFF).clamp(max=0x7F800001)  # every NaN's magnitude is above +inf's 0x7F800000
    sign = (bits >> 31) & ((magnitude - 0x7F800001) >> 31)  # -1 for a negative number, 0 else (NaN too)
    return ((magnitude ^ sign) - sign).long()  # two's complement: magnitude, or -magnitude where sign is -1


# EAGLE step function: (paths [B, k, s+1] root-to-frontier tokens, parent_slot [B, k]) -> probs [B, k, V].
EagleStepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def draft_eagle_tree(
    root: torch.Tensor,
    step_fn: EagleStepFn,
    *,
    num_steps: int,
    topk: int,
    num_draft_tokens: int,
    token_map: torch.Tensor | None = None,
) -> DraftTree:
    """EAGLE-2/3 dynamic tree with SGLang's ``--speculative-num-steps/-eagle-topk/-num-draft-tokens`` semantics.

    Mirrors ``EagleWorkerV2.draft_forward`` + ``select_top_k_tokens`` + ``organize_draft_results``:

    - call 0: ``step_fn(paths=[[root]] [B, 1, 1], parent_slot=0 [B, 1])`` gives the root's draft probabilities;
      its top-``topk`` tokens are the first frontier, scored by their probability.
    - call s = 1..num_steps-1: ``step_fn(paths [B, topk, s+1], parent_slot [B, topk])`` runs the drafter on the
      frontier (``parent_slot`` = each frontier node's slot in the previous call, what SGLang uses to gather the
      parent hidden states). Each frontier node's top-``topk`` children are scored by ``parent score * prob``;
      the best ``topk`` of these ``topk * topk`` candidates form the next frontier.
    - every candidate ever scored (``topk + (num_steps - 1) * topk**2``) competes in a final rerank: the best
      ``num_draft_tokens - 1`` by cumulative score become the tree, in candidate order (SGLang sorts the indices).

    ``token_map [V_draft]`` maps drafter ids to target ids (SGLang's ``hot_token_id``; EAGLE3 ``d2t + arange``).
    Ties (equal probabilities or scores) go to the lower index, where SGLang's ``torch.topk`` leaves them open.
    Returns a tree with ``N = num_draft_tokens`` real nodes and ``max_depth = num_steps``.

    Example (topk=2, num_steps=2, num_draft_tokens=4): root probs top-2 = (a .6, b .3) -> candidates 0, 1;
    a's children (c .5, d .4) and b's (e .9, f .1) score .30, .24, .27, .03 -> candidates 2..5;
    rerank keeps the 3 best: a .6, b .3, c .30 -> candidates [0, 1, 2] -> tokens [r, a, b, c], parents [-1, 0, 0, 1].
    """
    if num_steps < 1 or topk < 1:
        raise ValueError(f"num_steps and topk must be >= 1, got {num_steps}, {topk}")
    num_candidates = topk + (num_steps - 1) * topk * topk
    if not 2 <= num_draft_tokens <= num_candidates + 1:
        raise ValueError(
            f"num_draft_tokens must be in [2, {num_candidates + 1}] for topk={topk}, num_steps={num_steps}, "
            f"got {num_draft_tokens}"
        )
    batch = root.shape[0]
    device = root.device

    def map_tokens(ids: torch.Tensor) -> torch.Tensor:
        return ids if token_map is None else token_map[ids]

    paths = root[:, None, None].long()  # [B, 1, 1]
    probs = step_fn(paths, torch.zeros((batch, 1), dtype=torch.long, device=device))  # [B, 1, V]
    scores, ids = topk_lowest_index_ties(probs[:, 0], topk)  # [B, k]: frontier scores
    frontier_tokens = map_tokens(ids)
    candidate_scores = [scores]
    candidate_tokens = [frontier_tokens]
    # SGLang's parents_list: per step, the global candidate index of each frontier slot (step 0: -1 then 0..k-1).
    parents_list = [torch.arange(-1, topk, device=device).expand(batch, -1)]
    paths = torch.cat([paths.expand(batch, topk, 1), frontier_tokens[:, :, None]], dim=2)  # [B, k, 2]
    parent_slot = torch.zeros((batch, topk), dtype=torch.long, device=device)
    for step in range(1, num_steps):
        probs = step_fn(paths, parent_slot)  # [B, k, V]
        child_probs, child_ids = topk_lowest_index_ties(probs, topk)  # [B, k, k]
        expand = scores[:, :, None] * child_probs  # [B, k, k]: flat index = slot * k + rank
        child_tokens = map_tokens(child_ids).flatten(1)  # [B, k*k]
        candidate_scores.append(expand.flatten(1))
        candidate_tokens.append(child_tokens)
        scores, chosen = topk_lowest_index_ties(expand.flatten(1), topk)  # [B, k]
        parents_list.append(chosen + topk + (step - 1) * topk * topk)
        parent_slot = chosen // topk
        parent_paths = paths.gather(1, parent_slot[:, :, None].expand(-1, -1, paths.shape[2]))  # [B, k, s+1]
        paths = torch.cat([parent_paths, child_tokens.gather(1, chosen)[:, :, None]], dim=2)  # [B, k, s+2]

    all_scores = torch.cat(candidate_scores, dim=1)  # [B, num_candidates]
    all_tokens = torch.cat(candidate_tokens, dim=1)  # [B, num_candidates]
    best = topk_lowest_index_ties(all_scores, num_draft_tokens - 1)[1]
    top_scores_index = best.sort(dim=1).values  # [B, n-1]
    if len(parents_list) > 1:
        parent_list = torch.cat(parents_list[:-1], dim=1)  # [B, 1 + (num_steps-1)*k]; last frontier never expanded
    else:
        parent_list = torch.empty((batch, 0), dtype=torch.long, device=device)
    return build_eagle_tree(
        root, parent_list, top_scores_index, all_tokens.gather(1, top_scores_index), topk=topk, num_steps=num_steps
    )


def build_eagle_tree(
    root: torch.Tensor,
    parent_list: torch.Tensor,
    top_scores_index: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    topk: int,
    num_steps: int,
) -> DraftTree:
    """The tree SGLang's ``build_tree_kernel_efficient`` builds from ``organize_draft_results``' outputs.

    root [B]; parent_list [B, 1 + (num_steps-1)*topk] (empty when num_steps == 1); top_scores_index [B, n-1]
    (ascending candidate indices); draft_tokens [B, n-1]. Node i >= 1 is candidate ``top_scores_index[:, i-1]``.
    Candidate j's parent: ``j // topk == 0`` is the root, else candidate ``parent_list[:, j // topk]`` (found among
    the selected candidates). Candidate j's depth is its draft step + 1: 1 for ``j < topk``, else
    ``2 + (j - topk) // topk**2``. Raises ValueError if a selected candidate's parent was not selected.

    Example (topk=2): parent_list = [[-1, 0, 1]], top_scores_index = [[0, 1, 2]] (candidate 2 = first child of
    frontier slot 0 = candidate 0) gives parents [[-1, 0, 0, 1]], depths [[0, 1, 1, 2]].
    """
    batch, num_selected = top_scores_index.shape
    device = root.device
    parent_group = top_scores_index // topk  # [B, n-1]: 0 = child of the root
    if parent_list.shape[1] > 0:
        parent_candidate = parent_list.gather(1, parent_group.clamp(max=parent_list.shape[1] - 1))  # [B, n-1]
    else:
        parent_candidate = torch.full_like(parent_group, NO_PARENT)
    position = torch.searchsorted(top_scores_index.contiguous(), parent_candidate.contiguous())  # [B, n-1]
    found = (position < num_selected) & (
        top_scores_index.gather(1, position.clamp(max=num_selected - 1)) == parent_candidate
    )
    at_root = parent_group == 0
    if not bool((at_root | found).all()):
        raise ValueError("EAGLE tree is not prefix-closed: a selected candidate's parent was not selected")
    parents = torch.where(at_root, 0, position + 1)
    step = torch.where(
        top_scores_index < topk, 0, 1 + (top_scores_index - topk).clamp(min=0) // (topk * topk)
    )  # [B, n-1]
    column = torch.zeros((batch, 1), dtype=torch.long, device=device)
    return DraftTree(
        tokens=torch.cat([root[:, None].long(), draft_tokens.long()], dim=1),
        parents=torch.cat([column + NO_PARENT, parents], dim=1),
        depths=torch.cat([column, step + 1], dim=1),
        num_nodes=torch.full((batch,), num_selected + 1, dtype=torch.long, device=device),
        max_depth=num_steps,
    )
