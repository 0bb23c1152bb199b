"""Sampling penalties at every node of a draft tree, as non-speculative decoding applies them token by token.

Non-speculative decoding samples output token n after counting the outputs t_0 .. t_{n-1}: frequency and presence
penalties subtract ``frequency * count(t) + presence * [count(t) > 0]`` from the logit of every token t, the
min-new-tokens rule holds the stop tokens back (logit -inf) while ``n < min_new_tokens``, and the repetition penalty
then scales the logit of every token already output (``logit * r`` below zero, ``logit / r`` above): additive
penalties first, scaling second, as SGLang's sampler applies its accumulated penalties.

A verify step scores every node of a tree in one forward. With L committed outputs t_0 .. t_{L-1} (the root is
t_{L-1}), node v of depth d carries the drafts t_L .. t_{L+d-1} on its path and predicts output token n = L + d:
its counts are the committed outputs' plus the d drafted tokens on the path from the root down to v (v included,
the root excluded: it is committed), and min_new_tokens compares L + d. Applying the step-start counts to every
node, as SGLang's speculative workers do, is not lossless: a draft that repeats a token drafted above it is scored
without the penalty that token has earned, and ``min_new_tokens`` stops holding stop tokens back at a different
position. See ``docs/verification.md``.

Pure PyTorch, batched on the logits' device, and sparse: only the logits of tokens a node has seen (and of the stop
tokens it holds back) change, so the work and memory scale with the committed outputs times the tree's slots, not
with the vocabulary.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from .trees import DraftTree

NO_STOP_TOKEN = -1  # padding of PenaltyParams.stop_tokens


@dataclass
class PenaltyParams:
    """Each request's penalties; a request without any has frequency 0, presence 0, repetition 1, min_new_tokens 0."""

    frequency: torch.Tensor  # [B] float32
    presence: torch.Tensor  # [B] float32
    repetition: torch.Tensor  # [B] float32; 1 = none
    min_new_tokens: torch.Tensor  # [B] int64
    stop_tokens: torch.Tensor  # [B, S] int64: what min_new_tokens holds back; NO_STOP_TOKEN padding


def output_counts(outputs: list[list[int]], vocab_size: int, device: torch.device | str) -> torch.Tensor:
    """How often each token occurs among each request's committed outputs: float32 [B, V]."""
    counts = torch.zeros((len(outputs), vocab_size), dtype=torch.float32, device=device)
    lengths = [len(tokens) for tokens in outputs]
    if sum(lengths):
        tokens = torch.tensor(list(itertools.chain.from_iterable(outputs)), dtype=torch.long, device=device)
        rows = torch.repeat_interleave(torch.arange(len(outputs), device=device), torch.tensor(lengths, device=device))
        counts.index_put_((rows, tokens), torch.ones_like(tokens, dtype=counts.dtype), accumulate=True)
    return counts


def node_counts(tree: DraftTree, committed_counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tokens each node's prediction has seen and how often: the committed outputs plus the drafted tokens on
    the path from the root down to the node. committed_counts [B, V] -> sparse ``(rows, tokens, counts)`` [E]:
    every (row b * N + v, token) with a count above 0, each once (a dense [B * N, V] would be gigabytes at Kimi's
    vocabulary and a large batch).

    Example (root r committed once, drafts a = child of r, b = child of a): row r {r: 1}, row a {r: 1, a: 1},
    row b {r: 1, a: 1, b: 1}."""
    batch, n = tree.tokens.shape
    vocab = committed_counts.shape[1]
    device = tree.tokens.device
    slots = torch.arange(n, device=device)
    # the committed outputs, seen by every node of their request
    b, token = committed_counts.nonzero(as_tuple=True)  # [E]
    base_rows = (b[:, None] * n + slots[None, :]).reshape(-1)  # [E * N]
    base_tokens = token[:, None].expand(-1, n).reshape(-1)
    base_counts = committed_counts[b, token][:, None].expand(-1, n).reshape(-1)
    # [B, N, N]: column u is on row v's path (an ancestor of v or v itself, not the root, not padding)
    on_path = tree.ancestor_mask() & ((slots > 0)[None, None, :] & tree.valid()[:, None, :])
    pb, pv, pu = on_path.nonzero(as_tuple=True)
    rows = torch.cat([base_rows, pb * n + pv])
    tokens = torch.cat([base_tokens, tree.tokens[pb, pu]])
    counts = torch.cat([base_counts, torch.ones(pb.shape[0], dtype=committed_counts.dtype, device=device)])
    keys, where = torch.unique(rows * vocab + tokens, return_inverse=True)  # one entry per (row, token)
    summed = torch.zeros(keys.shape[0], dtype=counts.dtype, device=device).index_add_(0, where, counts)
    return keys // vocab, keys % vocab, summed


def apply_penalties(
    logits: torch.Tensor,
    tree: DraftTree,
    committed_counts: torch.Tensor,
    committed_lens: torch.Tensor,
    params: PenaltyParams,
) -> None:
    """Apply each node's penalties to ``logits`` [B * N, V] in place (row b * N + v scores node v of request b).

    committed_counts [B, V]: :func:`output_counts` of the committed outputs; committed_lens [B]: how many there are
    (the root is the last of them). Only the seen tokens' logits and the held-back stop tokens change."""
    n = tree.num_slots
    device = logits.device
    rows, tokens, counts = node_counts(tree, committed_counts.to(device))  # [E]
    request = rows // n
    frequency, presence = params.frequency.to(device).float(), params.presence.to(device).float()
    repetition = params.repetition.to(device).float()
    values = logits[rows, tokens].float() - (counts * frequency[request] + presence[request])  # additive
    scale = repetition[request]
    logits[rows, tokens] = torch.where(values < 0, values * scale, values / scale).to(logits.dtype)  # scaling

    # min_new_tokens: node v predicts output number committed_len + depth(v); stop tokens wait until it is reached
    produced = committed_lens.to(device)[:, None] + tree.depths  # [B, N]
    holding = (produced < params.min_new_tokens.to(device)[:, None]).reshape(-1)  # [B * N]
    stops = params.stop_tokens.to(device).repeat_interleave(n, dim=0)  # [B * N, S]
    row, slot = (holding[:, None] & (stops != NO_STOP_TOKEN)).nonzero(as_tuple=True)
    logits[row, stops[row, slot]] = float("-inf")  # -inf whatever the scaling: the order does not matter here
