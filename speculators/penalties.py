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

Pure PyTorch, batched on the logits' device; the counts are dense ``[B * N, V]`` (only built when a request of the
batch has a penalty).
"""

from __future__ import annotations

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
    rows = [b for b, tokens in enumerate(outputs) for _ in tokens]
    if rows:
        columns = torch.tensor([t for tokens in outputs for t in tokens], dtype=torch.long, device=device)
        counts.index_put_((torch.tensor(rows, device=device), columns), torch.ones_like(columns, dtype=counts.dtype),
                          accumulate=True)  # fmt: skip
    return counts


def node_counts(tree: DraftTree, committed_counts: torch.Tensor) -> torch.Tensor:
    """The counts each node's prediction sees: the committed outputs' plus the drafted tokens on the path from the
    root down to the node. committed_counts [B, V] -> [B * N, V] (row b * N + v).

    Example (root r, drafts a = child of r, b = child of a): node a counts {a}, node b counts {a, b}, r nothing."""
    batch, n = tree.tokens.shape
    device = tree.tokens.device
    slots = torch.arange(n, device=device)
    # [B, N, N]: column u is on row v's path (an ancestor of v or v itself, not the root, not padding)
    on_path = tree.ancestor_mask() & ((slots > 0)[None, None, :] & tree.valid()[:, None, :])
    b, v, u = on_path.nonzero(as_tuple=True)
    counts = committed_counts.repeat_interleave(n, dim=0)  # [B * N, V]
    counts.index_put_((b * n + v, tree.tokens[b, u]), torch.ones_like(b, dtype=counts.dtype), accumulate=True)
    return counts


def apply_penalties(
    logits: torch.Tensor,
    tree: DraftTree,
    committed_counts: torch.Tensor,
    committed_lens: torch.Tensor,
    params: PenaltyParams,
) -> None:
    """Apply each node's penalties to ``logits`` [B * N, V] in place (row b * N + v scores node v of request b).

    committed_counts [B, V]: :func:`output_counts` of the committed outputs; committed_lens [B]: how many there are
    (the root is the last of them)."""
    batch, n = tree.tokens.shape
    counts = node_counts(tree, committed_counts.to(logits.device))  # [B * N, V]
    seen = counts > 0
    per_row = lambda x: x.to(logits.device).repeat_interleave(n)[:, None]  # noqa: E731  [B] -> [B * N, 1]
    additive = counts * per_row(params.frequency.float()) + seen * per_row(params.presence.float())
    logits.sub_(additive.to(logits.dtype))

    # min_new_tokens: node v predicts output number committed_len + depth(v); stop tokens wait until it is reached
    produced = committed_lens.to(logits.device)[:, None] + tree.depths  # [B, N]
    holding = (produced < params.min_new_tokens.to(logits.device)[:, None]).reshape(-1)  # [B * N]
    stops = params.stop_tokens.to(logits.device).repeat_interleave(n, dim=0)  # [B * N, S]
    row, slot = (holding[:, None] & (stops != NO_STOP_TOKEN)).nonzero(as_tuple=True)
    logits[row, stops[row, slot]] = float("-inf")

    scale = torch.where(seen, per_row(params.repetition.float()), 1.0).to(logits.dtype)
    logits.copy_(torch.where(logits < 0, logits * scale, logits / scale))
