"""Lossless verification of draft chains and trees: greedy, sampled (target-only) and stochastic chains.

Vocabulary (vLLM's rejection sampler): a step **drafts** tokens (a chain or a tree rooted at the last committed
token), the target **accepts** a root-to-node path of drafted tokens, then emits one **bonus** token sampled where
verification stopped; when a draft was rejected that bonus is also called the **recovered** token. Output tokens
per step = accepted + 1.

Rules (derived in ``docs/verification.md``), with p(.|v) the target distribution at node v after exactly the
processing of the non-speculative sampler (:func:`process_logits`):

- greedy: at node v, t = argmax p(.|v) (lowest id among equal maxima); descend to the first child (lowest index,
  SGLang's sibling order) whose token is t, else t is the bonus.
- sampled, deterministic proposals (chains, DDTree, EAGLE trees): at node v draw y ~ p(.|v); descend if a child
  carries y, else y is the bonus. Every emitted token is an exact sample of the target: lossless for any tree.
  Drawn by inverse CDF from explicit coins (:class:`Coins`), exactly as SGLang's
  ``tree_speculative_sampling_target_only`` with thresholds 1: with children c_1..c_m in sibling order and coin u,
  accept c_i iff ``p(c_i) > 0`` and ``sum_{j<i} p(c_j) <= u < sum_{j<=i} p(c_j)`` (float32 sums in sibling order;
  a child repeating an earlier sibling's token counts with probability 0); if none is accepted, the bonus is drawn
  from p with the rejected children zeroed, by inverse CDF with the node's final coin; at a leaf from p itself.
- stochastic chain (:func:`verify_chain_stochastic`, Leviathan et al.): accept x_i with probability
  min(1, p_i(x_i) / q_i(x_i)); at the first rejection the recovered token is drawn from norm(max(p_i - q_i, 0));
  if all L drafts are accepted the bonus is drawn from p_{L+1}.

:func:`verify_tree` is the one entry point for trees and chains. Greedy, everywhere: one argmax over every node's
row, then the torch walk here on token ids (:func:`walk_tree`: a few operators over [B, N], no per-node pass over
the vocabulary). Sampled: the Triton kernel (``kernels/tree_verify.py``) on a GPU, the torch walk elsewhere; both
take the same decisions from the same coins. Coins come from torch's
generator (:func:`random_coins`) or from each request's sampling seed (:func:`seeded_coins`), so a seeded request
draws the same coins whatever else shares its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .trees import NO_NODE, PAD_TOKEN_ID, SURVIVOR_SLACK, DraftTree, topk_lowest_index_ties

TOP_K_ALL = 0  # top_k <= TOP_K_ALL disables top-k filtering (SGLang spells it -1 / 1 << 30)


@dataclass
class VerifyResult:
    """Outcome of verifying B trees (or chains: node i of a chain is its i-th draft, node 0 the root).

    Per request the target **accepted** ``num_accepted`` drafted tokens, the nodes ``accepted_nodes[1:]`` on a
    root-to-node path, then emitted one **bonus** token, sampled at the last accepted node (a **recovered**
    token when a drafted child was rejected there; a plain sample of the next position after a leaf).
    ``output_tokens`` are the step's ``num_accepted + 1`` committed tokens.

    Example (a chain root r, drafts [a, b, c]; the target accepts a, rejects b, and samples the recovered x)::

        accepted_nodes = [[0, 1, -1, -1]]   num_accepted = [1]   bonus = [x]
        output_tokens  = [[a, x, -1, -1]]   # accepted drafts, then the bonus, then PAD_TOKEN_ID
    """

    accepted_nodes: torch.Tensor  # [B, D+1] int64: root (0) then the accepted nodes, NO_NODE after
    num_accepted: torch.Tensor  # [B] int64: accepted drafts, root excluded
    bonus: torch.Tensor  # [B] int64: the token sampled where verification stopped
    output_tokens: torch.Tensor  # [B, D+1] int64: accepted draft tokens then the bonus, PAD_TOKEN_ID after
    # [B, N] int64: the window's path-first order (``window.path_first_order`` of accepted_nodes), when the walk
    # that found the path has it; None otherwise (the kernel's result, one broadcast from another rank)
    window_order: torch.Tensor | None = None

    def output_lists(self) -> list[list[int]]:
        """Per request, the tokens this step emits (``num_accepted + 1`` of them)."""
        return [row[: n + 1] for row, n in zip(self.output_tokens.tolist(), self.num_accepted.tolist())]

    # SGLang's verify outputs (``eagle_utils``, ``tree_speculative_sampling_target_only``), for retrieve_index
    # ``b * N + i``: ``accept_index [B, D+1]`` the global rows of the root and the accepted nodes (-1 after),
    # ``accept_token_num [B]`` the accepted drafts, ``predicts [B*N]`` where ``predicts[accept_index[b, j]]`` is
    # the j-th emitted token of request b. The conversions both ways live here and nowhere else.

    @classmethod
    def from_sglang(
        cls, predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor, num_slots: int
    ) -> VerifyResult:
        batch, width = accept_index.shape
        base = torch.arange(batch, device=accept_index.device)[:, None] * num_slots  # [B, 1]
        index = accept_index.long()
        accepted = torch.where(index >= 0, index - base, NO_NODE)  # [B, D+1] local nodes
        num_accepted = accept_token_num.long()
        emitted = torch.arange(width, device=index.device)[None, :] <= num_accepted[:, None]
        output = torch.where(emitted, predicts.long()[index.clamp(min=0)], PAD_TOKEN_ID)  # [B, D+1]
        bonus = output.gather(1, num_accepted[:, None])[:, 0]
        return cls(accepted, num_accepted, bonus, output)

    def to_sglang(self, predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor) -> None:
        """Write this result into SGLang's buffers (``predicts`` [B*N], ``accept_index`` [B, D+1],
        ``accept_token_num`` [B]); entries of ``predicts`` off the path are left as they were."""
        batch, width = self.accepted_nodes.shape
        num_slots = predicts.shape[0] // batch
        base = torch.arange(batch, device=predicts.device)[:, None] * num_slots
        on_path = self.accepted_nodes != NO_NODE  # [B, D+1]
        index = torch.where(on_path, self.accepted_nodes + base, -1)
        accept_index.copy_(index.to(accept_index.dtype))
        accept_token_num.copy_(self.num_accepted.to(accept_token_num.dtype))
        predicts[index[on_path]] = self.output_tokens[on_path].to(predicts.dtype)


# A row with top-p and no top-k is ordered over its best NUCLEUS_FIRST_WIDTH tokens first, then NUCLEUS_WIDENING
# times as many until every such row's kept tokens lie among them (the whole row at worst): a language model's
# nucleus at top-p 0.95 is a few hundred tokens of a 163,840-token vocabulary, not its sort.
NUCLEUS_FIRST_WIDTH = 256
NUCLEUS_WIDENING = 8


def process_logits(
    logits: torch.Tensor,
    temperature: float | torch.Tensor,
    top_k: int | torch.Tensor = TOP_K_ALL,
    top_p: float | torch.Tensor = 1.0,
    min_p: float | torch.Tensor = 0.0,
    *,
    filtered: bool = True,
    max_top_k: int | None = None,
) -> torch.Tensor:
    """Target probabilities [..., V] (float32) as SGLang's non-speculative sampler would draw from them.

    logits [..., V]; temperature, top_k, top_p, min_p are scalars or tensors of shape ``logits.shape[:-1]``.
    Temperature <= 0 is greedy: a one-hot at the first argmax of the logits (SGLang turns temperature 0 into
    greedy). Otherwise p = softmax(logits / T); tokens sorted by p descending (ties: lower id first) are kept
    iff rank < top_k and the mass strictly before them is <= top_p, both measured on the unfiltered p (the
    "joint" order of SGLang's ``top_k_top_p_min_p_sampling_from_probs_torch`` and flashinfer's
    ``top_k_top_p_sampling_from_probs``); then min-p drops tokens below ``min_p`` times the most likely kept one
    (as the torch sampler does); the kept mass is renormalised. top_k <= 0 disables top-k.

    Example: p = [.5, .3, .2], top_k=2, top_p=.6: masses before = [0, .5, .8]: keep tokens 0, 1 -> [.625, .375, 0].

    No temporary of the rows' size survives beside the probabilities (:func:`_filter_in_place`): the order is
    needed only as far as a row may keep tokens, and the filtered probabilities are written over the unfiltered
    ones. ``filtered=False``: no row has a top-k, top-p or min-p (the softmax is the target, no order at all);
    ``max_top_k``: every row keeps at most that many tokens (each has a top-k of at most it), so the order over the
    best ``max_top_k`` of each row decides everything; otherwise the order widens from the best
    :data:`NUCLEUS_FIRST_WIDTH` tokens until it holds every row's kept tokens (:func:`_nucleus_order`).
    """
    logits = logits.float()
    batch_shape = logits.shape[:-1]
    temperature = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device).expand(batch_shape)
    greedy = temperature <= 0  # [...]
    probs = torch.softmax(logits / torch.where(greedy, 1.0, temperature)[..., None], dim=-1)  # [..., V]
    if filtered:
        _filter_in_place(probs, greedy, top_k, top_p, min_p, max_top_k)
    # greedy rows: a one-hot at the first argmax of the logits, written over their row (no [..., V] one-hot)
    first_max = logits.argmax(dim=-1, keepdim=True)  # [..., 1]
    probs.masked_fill_(greedy[..., None], 0.0)
    return probs.scatter_(-1, first_max, torch.where(greedy[..., None], 1.0, probs.gather(-1, first_max)))


def _filter_in_place(
    probs: torch.Tensor,
    greedy: torch.Tensor,
    top_k: int | torch.Tensor,
    top_p: float | torch.Tensor,
    min_p: float | torch.Tensor,
    max_top_k: int | None,
) -> None:
    """:func:`process_logits`' top-k, top-p and min-p filter on probs [..., V], renormalised, in place."""
    device, vocab, batch_shape = probs.device, probs.shape[-1], probs.shape[:-1]
    top_k = torch.as_tensor(top_k, dtype=torch.long, device=device).expand(batch_shape)
    top_p = torch.as_tensor(top_p, dtype=torch.float32, device=device).expand(batch_shape)
    min_p = torch.as_tensor(min_p, dtype=torch.float32, device=device).expand(batch_shape)
    # rows of a filtered batch that filter nothing themselves keep their softmax (and need no order)
    unfiltered = (top_k <= TOP_K_ALL) & (top_p >= 1.0) & (min_p <= 0.0)  # [...]
    if max_top_k is not None and 0 < max_top_k:
        sorted_probs, sorted_ids = topk_lowest_index_ties(probs, min(max_top_k, vocab))  # [..., K]
    else:
        sorted_probs, sorted_ids = _nucleus_order(probs, greedy | unfiltered, top_k, top_p, min_p)  # [..., K]
    width = sorted_probs.shape[-1]
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    rank = torch.arange(width, device=device)
    # top_p >= 1 filters nothing (the sampler skips the filter; cumsum rounding must not drop the tail)
    keep = (rank < torch.where(top_k <= TOP_K_ALL, vocab, top_k)[..., None]) & (
        (mass_before <= top_p[..., None]) | (top_p[..., None] >= 1.0)
    )
    keep &= sorted_probs >= sorted_probs[..., :1] * min_p[..., None]  # the top token is always kept
    kept = sorted_probs * keep
    kept = torch.where(unfiltered[..., None], sorted_probs, kept / kept.sum(dim=-1, keepdim=True))  # [..., K]
    probs.masked_fill_(~unfiltered[..., None], 0.0).scatter_(-1, sorted_ids, kept)


def _nucleus_order(
    probs: torch.Tensor, settled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The best K tokens of every row of probs [..., V] in the full sort's order (:func:`topk_lowest_index_ties`), for
    the narrowest K, from :data:`NUCLEUS_FIRST_WIDTH` up by :data:`NUCLEUS_WIDENING`, that holds every row's kept
    tokens. A row is decided within its best K when its top-k is at most K, its best K hold more than its top-p (the
    next token's mass before is then above top-p), its K-th best is below its min-p cut, or it is greedy or filters
    nothing (``settled``). An undecided row needs at least K + (top_p - mass of its best K) / (its K-th probability)
    tokens, so the next width is at least that (the whole row when it passes half of it: a flat row goes there from
    the first width). One host read of the device per width tried (a CPU reads its own memory; on a GPU a step with
    such a request waits for the device once, where a full sort would run instead). Returns (probabilities,
    ids) [..., K]."""
    vocab = probs.shape[-1]
    width = NUCLEUS_FIRST_WIDTH
    while 2 * width + SURVIVOR_SLACK < vocab:
        best, ids = topk_lowest_index_ties(probs, width)  # [..., K]
        mass = best.sum(dim=-1)
        decided = (
            settled
            | ((top_k > TOP_K_ALL) & (top_k <= width))
            | ((top_p < 1.0) & (mass > top_p))
            | (best[..., -1] < best[..., 0] * min_p)
        )
        # what an undecided row still needs: more than (top_p - mass) / (K-th probability) tokens to pass its top-p
        # (each at most the K-th probability), and no more than its top-k; -1 for a decided row
        short = (top_p - mass).clamp(min=0) / best[..., -1].clamp(min=torch.finfo(best.dtype).tiny)
        short = torch.where(top_k > TOP_K_ALL, torch.minimum(short, (top_k - width).float()), short)
        needed = float(torch.where(decided, -1.0, short).amax()) if decided.numel() else -1.0  # the host read
        if needed < 0:
            return best, ids
        target = width + max(needed, 1.0)
        while width < target and 2 * width + SURVIVOR_SLACK < vocab:
            width *= NUCLEUS_WIDENING
    return probs.sort(dim=-1, descending=True, stable=True)  # the whole row: one stable sort


@dataclass
class Coins:
    """Uniform coins in [0, 1) for sampled verification of B trees of N slots.

    ``uniform[b, i]`` chooses among node i's children; ``final[b, i]`` draws the bonus when the walk stops at node i.
    """

    uniform: torch.Tensor  # [B, N] float32
    final: torch.Tensor  # [B, N] float32


# The largest float32 below 1: coins are half-open, so a coin never walks past the last CDF bucket.
MAX_COIN = 1.0 - 2.0**-24


def random_coins(batch: int, num_nodes: int, device=None, generator: torch.Generator | None = None) -> Coins:
    """Coins from torch's generator (the global one when ``generator`` is None)."""
    draw = torch.rand((2, batch, num_nodes), generator=generator, device=device, dtype=torch.float32)
    return Coins(draw[0].clamp_(max=MAX_COIN), draw[1].clamp_(max=MAX_COIN))


_MASK64 = (1 << 64) - 1


def _as_int64(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN, _MIX1, _MIX2 = (_as_int64(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch shifts signed integers arithmetically)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 bit patterns (multiplication wraps modulo 2^64)."""
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    return x ^ _shift_right(x, 31)


def seeded_coins(seeds: torch.Tensor, offsets: torch.Tensor, num_nodes: int) -> Coins:
    """Coins that depend only on each request's seed and offset: seeds [B] int64 (the request's sampling seed),
    offsets [B] int64 (its committed length: a fresh coin stream every step). Coin (b, column c) is the top 24 bits of
    a 64-bit hash of (seed, offset, c): exactly representable in float32, uniform on {0, 2^-24, ..., 1 - 2^-24}."""
    device = seeds.device
    columns = torch.arange(2 * num_nodes, device=device, dtype=torch.int64)  # [2N]: uniform, then final
    key = _mix64(seeds.long()[:, None] * _GOLDEN + offsets.long()[:, None]) + columns[None, :] * _GOLDEN  # [B, 2N]
    coins = _shift_right(_mix64(key), 40).to(torch.float32) * 2.0**-24  # [B, 2N] in [0, 1)
    return Coins(coins[:, :num_nodes].contiguous(), coins[:, num_nodes:].contiguous())


def sample_tokens(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of probs [B, V] (rows need not be normalised). Returns int64 [B]."""
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def verify_tree(
    tree: DraftTree,
    *,
    target_logits: torch.Tensor | None = None,
    target_probs: torch.Tensor | None = None,
    coins: Coins | None = None,
    ancestor: torch.Tensor | None = None,
) -> VerifyResult:
    """Verify B trees (chains are trees) against the target: greedy from ``target_logits`` [B, N, V], or sampled
    from ``target_probs`` [B, N, V] (:func:`process_logits`) with ``coins``. Row i of the target is its
    distribution at node i (rows of padding slots are ignored). Greedy: one argmax over all B * N rows, then
    :func:`walk_tree` on the ids, on every device (a kernel walking the logits would scan the vocabulary at each
    visited node, one node after another). Sampled: on a CUDA/ROCm device the Triton kernel, elsewhere the torch
    walk: the same decisions from the same coins. ``ancestor`` [B, N, N]: the tree's ancestor mask when the caller
    built it already (the walk reads it; the kernel does not).

    Example: tree r -> {a (1), b (2)}, a -> c (3); greedy argmax per node = [b, ., y, .]: accept node 2, bonus y.
    """
    if (target_logits is None) == (target_probs is None):
        raise ValueError("pass exactly one of target_logits (greedy) and target_probs (sampled)")
    target = target_logits if target_probs is None else target_probs
    if target.dim() != 3 or tuple(target.shape[:2]) != tuple(tree.tokens.shape):
        raise ValueError(f"target rows must be [{tree.batch_size}, {tree.num_slots}, V], got {list(target.shape)}")
    if target_probs is not None and coins is None:
        raise ValueError("sampled verification needs coins (random_coins or seeded_coins)")
    if tree.tokens.is_cuda and target_probs is not None:
        from ..kernels.tree_verify import verify_tree_on_device  # the kernel's layout and launch

        out = verify_tree_on_device(tree, target_probs=target_probs, coins=coins)
        return VerifyResult.from_sglang(out.predicts, out.accept_index, out.accept_token_num, tree.num_slots)
    return walk_tree(tree, target_logits=target_logits, target_probs=target_probs, coins=coins, ancestor=ancestor)


def verify_greedy(tree: DraftTree, target_logits: torch.Tensor) -> VerifyResult:
    """Greedy :func:`verify_tree`: follow the target's argmax through the tree."""
    return verify_tree(tree, target_logits=target_logits)


def verify_sampled(
    tree: DraftTree, target_probs: torch.Tensor, coins: Coins | torch.Generator | None = None
) -> VerifyResult:
    """Sampled :func:`verify_tree` with ``coins``, or coins drawn from a generator (the global one when None)."""
    if not isinstance(coins, Coins):
        coins = random_coins(tree.batch_size, tree.num_slots, tree.tokens.device, coins)
    return verify_tree(tree, target_probs=target_probs, coins=coins)


def walk_tree(
    tree: DraftTree,
    *,
    target_logits: torch.Tensor | None = None,
    target_probs: torch.Tensor | None = None,
    coins: Coins | None = None,
    ancestor: torch.Tensor | None = None,
) -> VerifyResult:
    """The torch twin of the Triton kernel behind :func:`verify_tree`: the same decisions from the same coins, with
    static shapes and no host synchronisation (no loop over depths, no data-dependent shape). ``ancestor``: the
    tree's :meth:`~.trees.DraftTree.ancestor_mask` when the caller has it (else it is computed).

    A node's choice depends only on its own row and coin, so every node chooses at once: greedy, its first child
    carrying the row's argmax; sampled, its first child c (sibling order) with p(c) > 0 and coin < the running sum
    of its children's p up to c. A node is accepted iff it and each of its ancestors was its parent's choice; the
    walk stops at the deepest accepted node, whose bonus is its argmax, or a draw from its row with the children it
    rejected zeroed (inverse CDF with the node's final coin).
    Example: tree r -> {a (1), b (2)}, a -> c (3); argmax per node [b, c, y, z]: the root chooses node 2, node 2
    chooses nothing: accepted [0, 2], bonus y.
    """
    batch, n = tree.tokens.shape
    device = tree.tokens.device
    slots = torch.arange(n, device=device)
    is_node = (tree.parents >= 0) & (slots < tree.num_nodes[:, None])  # [B, N]: a real node below the root
    # each node's parent, and for the root and padding column n, whose choice below is the root itself
    parent_column = torch.where(is_node, tree.parents, n)  # [B, N]
    sampled = target_probs is not None
    if sampled:
        tokens = tree.tokens.clamp(min=0)  # [B, N]: gathers stay in range
        probs = target_probs.float()  # [B, N, V]
        vocab = probs.shape[-1]
        is_child = is_node[:, None, :] & (tree.parents[:, None, :] == slots[None, :, None])  # [B, node, child]
        same_parent = tree.parents[:, :, None] == tree.parents[:, None, :]  # [B, c, j]
        repeat = (same_parent & (tokens[:, :, None] == tokens[:, None, :]) & (slots[None, :] < slots[:, None])).any(-1)
        p = probs.gather(2, tokens[:, None, :].expand(batch, n, n))  # [B, node, child]: p(child's token | node)
        p = torch.where(is_child & ~repeat[:, None, :], p, 0.0)  # a repeated token counts once, as the kernel
        cum = p.cumsum(dim=-1)  # float32 in sibling (index) order: the kernel's running sum
        hit = is_child & (p > 0) & (coins.uniform[:, :, None] < cum)
        chosen = torch.where(hit.any(dim=-1), hit.int().argmax(dim=-1), n)  # [B, N]: each node's choice, n: none
        chosen = torch.cat([chosen, torch.zeros_like(chosen[:, :1])], dim=1)  # [B, N+1]: column n chooses the root
    else:
        argmax = target_logits.argmax(dim=-1)  # [B, N]: one argmax over all rows, the first maximum as the kernel
        carries = is_node & (tree.tokens == argmax.gather(1, tree.parents.clamp(min=0)))  # [B, N]: parent's argmax
        # each parent's first (lowest-index) child carrying its argmax, n for none; column n collects the rest,
        # the root (slot 0) among them, so it "chooses" the root
        chosen = torch.full((batch, n + 1), n, dtype=torch.long, device=device)
        chosen.scatter_reduce_(1, torch.where(carries, tree.parents, n), slots.expand(batch, n), "amin")
    picked = chosen.gather(1, parent_column) == slots  # [B, N]: the root, or its parent's choice
    picked &= tree.depths <= tree.max_depth  # the walk's depth limit (the kernel's num_spec_tokens)
    ancestor = tree.ancestor_mask() if ancestor is None else ancestor  # [B, N, N]
    on_path = (ancestor <= picked[:, None, :]).all(dim=-1)  # [B, N]: it and each of its ancestors picked
    num_accepted = on_path.sum(dim=-1, keepdim=True) - 1  # [B, 1]
    # [B, N]: the path by depth, then the rest in node order (the window's path-first order)
    order = torch.where(on_path, tree.depths, n + slots).argsort(dim=-1)
    stop = order.gather(1, num_accepted)  # [B, 1]: the deepest accepted node
    if sampled:
        row = probs.gather(1, stop[:, :, None].expand(batch, 1, vocab))[:, 0]  # [B, V]
        zeroed = (is_child & (p > 0)).gather(1, stop[:, :, None].expand(batch, 1, n))[:, 0]  # [B, N]: rejected
        rejected = torch.zeros((batch, vocab + 1), device=device).scatter_(1, torch.where(zeroed, tokens, vocab), 1.0)
        residual = row.masked_fill(rejected[:, :vocab] > 0, 0.0)  # [B, V]
        u = coins.final.gather(1, stop)[:, 0] * residual.sum(dim=-1)  # [B]
        cdf = residual.cumsum(dim=-1)
        ids = torch.arange(vocab, device=device)
        first = torch.where((cdf > u[:, None]) & (residual > 0), ids, vocab).min(dim=-1).values
        last_positive = torch.where(residual > 0, ids, -1).max(dim=-1).values  # rounding left u past the total
        last_rejected = torch.where(zeroed, slots, -1).max(dim=-1).values  # [B]: the last rejected child
        last_rejected = torch.where(last_rejected >= 0, tokens.gather(1, last_rejected.clamp(min=0)[:, None])[:, 0], -1)
        bonus = torch.where(first < vocab, first, last_positive)
        bonus = torch.where(bonus >= 0, bonus, last_rejected)  # all of p on rejected children (rounding), as the kernel
        # what each node emits: its chosen child's token, and at the stop the bonus
        emits = tokens.gather(1, chosen[:, :n].clamp(max=n - 1)).scatter(1, stop, bonus[:, None])  # [B, N]
    else:
        emits = argmax  # [B, N]: a node on the path passed its argmax on, and the stop's is the bonus
        bonus = argmax.gather(1, stop)[:, 0]
    width = tree.max_depth + 1
    columns = torch.arange(width, device=device)
    path = order[:, :width] if width <= n else torch.cat([order, order.new_full((batch, width - n), NO_NODE)], 1)
    emitted = columns <= num_accepted  # [B, D+1]: the path's nodes, root to stop
    accepted = torch.where(emitted, path, NO_NODE)  # [B, D+1]
    output = torch.where(emitted, emits.gather(1, path.clamp(min=0)), PAD_TOKEN_ID)  # accepted drafts, then the bonus
    return VerifyResult(accepted, num_accepted[:, 0], bonus, output, window_order=order)


def verify_chain_stochastic(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> VerifyResult:
    """Speculative sampling of a chain drawn from a stochastic drafter (Leviathan et al. 2211.17192).

    draft_tokens [B, L] with x_i ~ q_i; draft_probs [B, L, V] = q_i; target_probs [B, L+1, V] = p_1..p_{L+1}
    (p_i at chain node i-1; node 0 is the root). Accept x_i iff u_i * q_i(x_i) < p_i(x_i) (i.e. with probability
    min(1, p/q)), u_i ~ U[0, 1); at the first rejection i the recovered token is drawn from norm(max(p_i - q_i, 0));
    if all L are accepted the bonus is drawn from p_{L+1}.
    Example: L=2, accepted x_1, rejected x_2 -> num_accepted 1, output [x_1, y] with y ~ norm(max(p_2 - q_2, 0)).
    """
    batch, length = draft_tokens.shape
    device = draft_tokens.device
    p_draft = target_probs[:, :length].gather(2, draft_tokens[:, :, None])[:, :, 0]  # [B, L]
    q_draft = draft_probs.gather(2, draft_tokens[:, :, None])[:, :, 0]  # [B, L]
    coins = torch.rand((batch, length), generator=generator, device=device, dtype=torch.float64)
    accept = coins * q_draft.double() < p_draft.double()  # [B, L]
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)  # [B]: accepted prefix length
    rows = torch.arange(batch, device=device)
    padded_q = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], dim=1)  # [B, L+1, V]: q_{L+1} = 0
    p_stop = target_probs[rows, num_accepted]  # [B, V]
    residual = (p_stop - padded_q[rows, num_accepted]).clamp(min=0)  # equals p_{L+1} when all were accepted
    # max(p - q, 0) has positive mass whenever a rejection can happen (sum p = sum q = 1 and p(x) < q(x))
    bonus = sample_tokens(residual, generator)
    slots = torch.arange(length + 1, device=device)
    accepted = torch.where(slots[None, :] <= num_accepted[:, None], slots[None, :], NO_NODE)  # [B, L+1]
    output = torch.cat([draft_tokens.long(), torch.full_like(draft_tokens[:, :1], PAD_TOKEN_ID)], dim=1)
    output = torch.where(slots[None, :] < num_accepted[:, None], output, PAD_TOKEN_ID)
    output.scatter_(1, num_accepted[:, None], bonus[:, None])
    return VerifyResult(accepted, num_accepted, bonus, output)
