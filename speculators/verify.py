"""Lossless verification of draft chains and trees: greedy, sampled (target-only) and stochastic chains.

Vocabulary (vLLM's rejection sampler): a step **drafts** tokens (a chain or a tree rooted at the last committed
token), the target **accepts** a root-to-node path of drafted tokens, then emits one **bonus** token sampled where
verification stopped; when a draft was rejected that bonus is also called the **recovered** token. Output tokens
per step = accepted + 1.

Rules (``reference/algorithms.md`` section 4), with p(.|v) the target distribution at node v after exactly the
processing of the non-speculative sampler (:func:`process_logits`):

- greedy (:func:`verify_greedy`): at node v, t = argmax p(.|v); descend to the first child (lowest index, SGLang's
  sibling order) whose token is t, else t is the bonus.
- sampled, deterministic proposals (:func:`verify_sampled`): at node v draw y ~ p(.|v); descend to the first child
  whose token is y, else y is the bonus. Every emitted token is an exact sample of the target: lossless for any
  tree (same law as SGLang's ``tree_speculative_sampling_target_only`` with thresholds 1).
- stochastic chain (:func:`verify_chain_stochastic`, Leviathan et al.): accept x_i with probability
  min(1, p_i(x_i) / q_i(x_i)); at the first rejection the recovered token is drawn from norm(max(p_i - q_i, 0));
  if all L drafts are accepted the bonus is drawn from p_{L+1}.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .trees import NO_NODE, PAD_TOKEN_ID, DraftTree

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

    def output_lists(self) -> list[list[int]]:
        """Per request, the tokens this step emits (``num_accepted + 1`` of them)."""
        return [row[: n + 1] for row, n in zip(self.output_tokens.tolist(), self.num_accepted.tolist())]


def process_logits(
    logits: torch.Tensor,
    temperature: float | torch.Tensor,
    top_k: int | torch.Tensor = TOP_K_ALL,
    top_p: float | torch.Tensor = 1.0,
    min_p: float | torch.Tensor = 0.0,
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
    """
    logits = logits.float()
    vocab = logits.shape[-1]
    batch_shape = logits.shape[:-1]
    temperature = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device).expand(batch_shape)
    top_k = torch.as_tensor(top_k, dtype=torch.long, device=logits.device).expand(batch_shape)
    top_p = torch.as_tensor(top_p, dtype=torch.float32, device=logits.device).expand(batch_shape)
    greedy = temperature <= 0  # [...]
    probs = torch.softmax(logits / torch.where(greedy, 1.0, temperature)[..., None], dim=-1)  # [..., V]
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True, stable=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    rank = torch.arange(vocab, device=logits.device)
    min_p = torch.as_tensor(min_p, dtype=torch.float32, device=logits.device).expand(batch_shape)
    # top_p >= 1 filters nothing (the sampler skips the filter; cumsum rounding must not drop the tail)
    keep = (rank < torch.where(top_k <= TOP_K_ALL, vocab, top_k)[..., None]) & (
        (mass_before <= top_p[..., None]) | (top_p[..., None] >= 1.0)
    )
    keep &= sorted_probs >= sorted_probs[..., :1] * min_p[..., None]  # the top token is always kept
    kept = sorted_probs * keep
    kept = kept / kept.sum(dim=-1, keepdim=True)
    probs = torch.zeros_like(probs).scatter_(-1, sorted_ids, kept)
    one_hot = torch.nn.functional.one_hot(logits.argmax(dim=-1), vocab).float()
    return torch.where(greedy[..., None], one_hot, probs)


def sample_tokens(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of probs [B, V] (rows need not be normalised). Returns int64 [B]."""
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def _walk(tree: DraftTree, draw: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> VerifyResult:
    """Descend from the root while the token drawn at the current node is one of its children.

    ``draw(rows [R], node [R]) -> token [R]`` gives the target's token at node ``node[r]`` of request ``rows[r]``;
    it is called once per depth for the requests still descending.
    """
    batch, _ = tree.tokens.shape
    device = tree.tokens.device
    valid = tree.valid()
    rows = torch.arange(batch, device=device)  # [R] requests still descending
    node = torch.zeros(batch, dtype=torch.long, device=device)  # [B] current node
    num_accepted = torch.zeros(batch, dtype=torch.long, device=device)
    accepted = torch.full((batch, tree.max_depth + 1), NO_NODE, dtype=torch.long, device=device)
    accepted[:, 0] = 0
    output = torch.full((batch, tree.max_depth + 1), PAD_TOKEN_ID, dtype=torch.long, device=device)
    token = draw(rows, node)  # [B] token drawn at each request's current node
    for depth in range(1, tree.max_depth + 1):
        match = valid[rows] & (tree.parents[rows] == node[rows, None]) & (tree.tokens[rows] == token[rows, None])
        hit = match.any(dim=1)  # [R]
        rows, child = rows[hit], match[hit].int().argmax(dim=1)  # first matching child = SGLang's sibling order
        if rows.numel() == 0:
            break
        node[rows] = child
        accepted[rows, depth] = child
        output[rows, depth - 1] = token[rows]
        num_accepted[rows] += 1
        token[rows] = draw(rows, child)
    output.scatter_(1, num_accepted[:, None], token[:, None])
    return VerifyResult(accepted, num_accepted, token, output)


def verify_greedy(tree: DraftTree, target_logits: torch.Tensor) -> VerifyResult:
    """Greedy verification: follow the target's argmax through the tree.

    target_logits [B, N, V]: row i is the target's next-token logits at node i (rows of padding are ignored).
    Ties in the argmax go to the lowest token id.
    Example: tree r -> {a (1), b (2)}, a -> c (3); argmax per node = [b, ., y, .]: accept node 2, bonus y.
    """
    predict = target_logits.argmax(dim=-1)  # [B, N]
    return _walk(tree, lambda rows, node: predict[rows, node])


def verify_sampled(tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator) -> VerifyResult:
    """Target-only sampled verification of deterministic proposals (chains, DDTree, EAGLE trees).

    target_probs [B, N, V]: processed target probabilities at each node (:func:`process_logits`).
    At node v draw y ~ p(.|v); descend if y is a child's token, else y is the bonus. On a chain this is "accept x
    with probability p(x), else draw the recovered token from p with x removed".
    """
    return _walk(tree, lambda rows, node: sample_tokens(target_probs[rows, node], generator))


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
