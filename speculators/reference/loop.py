"""A plain reference decode loop over any HF-style target: the oracle for every lossless test.

``generate(target, prompt, n)`` decodes autoregressively; ``generate(..., proposer=P)`` decodes speculatively:
each step P drafts a tree rooted at the last committed token, the target scores the whole tree in one forward
(full recompute: committed tokens + tree under an ancestor mask, tree node i at position ``root + depth``), and
:mod:`..verify` accepts a path and emits the bonus. Greedy output must equal autoregressive output token for token;
sampled output must follow the same law.

Target protocol (:class:`Target`): ``target(input_ids [1, T], position_ids [1, T], attention_mask bool [1, T, T])
-> TargetOutput(logits [1, T, V], hidden_states [1, T, C] or None)``, where ``attention_mask[0, i, j]`` says
query i sees key j and ``hidden_states`` concatenates the captured layers (drafter "target layer id" l = output
of decoder layer l = HF ``hidden_states[l + 1]``). ``tests/support/targets.py`` adapts a
transformers causal LM and builds random pure-torch targets for the tests.

Proposer protocol (:class:`Proposer`, transformers' candidate generator in two methods): ``propose(context)``
returns a :class:`Proposal` (a batch-1 DraftTree rooted at ``context.tokens[-1]``, plus q for a stochastic chain);
``update(result)`` receives the step's :class:`~sglang_kimi.speculators.verify.VerifyResult`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..ddtree import build_ddtree
from ..trees import DraftTree, build_chain, draft_eagle_tree
from ..verify import (
    TOP_K_ALL,
    VerifyResult,
    process_logits,
    sample_tokens,
    verify_chain_stochastic,
    verify_greedy,
    verify_sampled,
)


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [1, T, V]
    hidden_states: torch.Tensor | None = None  # [1, T, C]: captured layers, concatenated


class Target(Protocol):
    def __call__(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> TargetOutput: ...


@dataclass
class DraftContext:
    """What a proposer sees: the committed tokens and the target features of all but the newest."""

    tokens: torch.Tensor  # [T] committed token ids (prompt included); tokens[-1] is the root of the next tree
    hidden_states: torch.Tensor | None  # [T-1, C] target features of tokens[:-1], None if the target has none


@dataclass
class Proposal:
    tree: DraftTree  # batch 1, rooted at the last committed token
    draft_probs: torch.Tensor | None = None  # [1, L, V] q of a stochastic chain; None = deterministic proposals


class Proposer(Protocol):
    def propose(self, context: DraftContext) -> Proposal: ...

    def update(self, result: VerifyResult) -> None: ...


# (context, L) -> draft logits [L, V] for the L positions after the root (a DFlash block)
BlockDrafter = Callable[[DraftContext, int], torch.Tensor]
# (context, paths [k, s+1] root-to-node token paths) -> draft probabilities [k, V] of each path's next token
StepDrafter = Callable[[DraftContext, torch.Tensor], torch.Tensor]


@dataclass(kw_only=True)
class AcceptanceLog:
    """``update()`` shared by the proposers below: accepted drafts per verify step, in order."""

    accepted: list[int] = field(default_factory=list, init=False)

    def update(self, result: VerifyResult) -> None:
        self.accepted.append(int(result.num_accepted[0]))


@dataclass(kw_only=True)
class ChainProposer(AcceptanceLog):
    """A chain of ``num_draft_tokens`` from a block drafter: argmax per position, or, with ``sample=True``,
    x_i ~ softmax(logits_i) returned with q for :func:`~.verify.verify_chain_stochastic`."""

    drafter: BlockDrafter
    num_draft_tokens: int
    sample: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.seed)

    def propose(self, context: DraftContext) -> Proposal:
        logits = self.drafter(context, self.num_draft_tokens)  # [L, V]
        root = context.tokens[-1:]
        if not self.sample:
            return Proposal(build_chain(root, logits.argmax(dim=-1)[None]))
        q = torch.softmax(logits.float(), dim=-1)  # [L, V]
        draft = torch.multinomial(q.cpu(), 1, generator=self.generator)[:, 0].to(q.device)  # [L]
        return Proposal(build_chain(root, draft[None]), draft_probs=q[None])


@dataclass(kw_only=True)
class DDTreeProposer(AcceptanceLog):
    """DDTree over a block drafter: ``budget`` best prefixes of ``num_positions`` per-position distributions."""

    drafter: BlockDrafter
    num_positions: int
    budget: int

    def propose(self, context: DraftContext) -> Proposal:
        logits = self.drafter(context, self.num_positions)  # [L, V]
        return Proposal(build_ddtree(context.tokens[-1:], logits[None], self.budget))


@dataclass(kw_only=True)
class EagleProposer(AcceptanceLog):
    """EAGLE dynamic tree over a per-step drafter (SGLang's num_steps / topk / num_draft_tokens)."""

    drafter: StepDrafter
    num_steps: int
    topk: int
    num_draft_tokens: int

    def propose(self, context: DraftContext) -> Proposal:
        def step_fn(paths: torch.Tensor, parent_slot: torch.Tensor) -> torch.Tensor:
            return self.drafter(context, paths[0])[None]  # [1, k, V]; full recompute needs no parent slots

        tree = draft_eagle_tree(
            context.tokens[-1:],
            step_fn,
            num_steps=self.num_steps,
            topk=self.topk,
            num_draft_tokens=self.num_draft_tokens,
        )
        return Proposal(tree)


@dataclass
class GenerateOutput:
    tokens: list[int]  # the max_new_tokens generated tokens (prompt excluded)
    num_target_forwards: int  # target calls, prefill included
    accept_histogram: list[int]  # accept_histogram[k] = decode steps that accepted k drafts (AR: all at k=0)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per decode forward (accepted + bonus)."""
        steps = sum(self.accept_histogram)
        return sum((k + 1) * n for k, n in enumerate(self.accept_histogram)) / max(steps, 1)


def causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """bool [1, T, T]: query i sees keys 0..i."""
    return torch.ones((length, length), dtype=torch.bool, device=device).tril()[None]


def tree_verify_inputs(tokens: torch.Tensor, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target inputs scoring a batch-1 tree rooted at tokens[-1] in one forward (full recompute).

    tokens [T] committed; the tree's root row is row T-1 and node i is row T-1+i at position T-1+depth(i).
    Rows before the root are causal; tree rows see the whole prefix plus their tree ancestors.
    Example: T=3, tree r -> {a, b}: input [t0, t1, r, a, b], positions [0, 1, 2, 3, 3], row a sees t0 t1 r a.
    Returns input_ids [1, T-1+n], position_ids [1, T-1+n], attention_mask bool [1, T-1+n, T-1+n].
    """
    prefix = tokens.shape[0] - 1  # tokens before the root
    n = int(tree.num_nodes[0])
    total = prefix + n
    input_ids = torch.cat([tokens[:-1], tree.tokens[0, :n]])[None]
    position_ids = torch.cat([torch.arange(prefix, device=tokens.device), prefix + tree.depths[0, :n]])[None]
    mask = causal_mask(total, tokens.device).clone()
    mask[0, prefix:, prefix:] = tree.ancestor_mask()[0, :n, :n]
    return input_ids, position_ids, mask


def generate(
    target: Target,
    prompt_ids: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    *,
    proposer: Proposer | None = None,
    temperature: float = 0.0,
    top_k: int = TOP_K_ALL,
    top_p: float = 1.0,
    seed: int = 0,
) -> GenerateOutput:
    """Decode ``max_new_tokens`` tokens after ``prompt_ids``; speculatively if a proposer is given.

    temperature 0 is greedy (argmax, ties to the lowest id); otherwise tokens are drawn from
    :func:`~.verify.process_logits` (temperature, top-k, top-p) with a generator seeded by ``seed``.
    """
    tokens = torch.as_tensor(prompt_ids, dtype=torch.long).flatten()  # [T]
    prompt_len = tokens.shape[0]
    device = tokens.device
    generator = torch.Generator(device=device).manual_seed(seed)

    def pick(logits: torch.Tensor) -> torch.Tensor:  # [V] -> [1]
        if temperature <= 0:
            return logits.argmax(dim=-1, keepdim=True)
        return sample_tokens(process_logits(logits[None], temperature, top_k, top_p), generator)

    out = target(tokens[None], torch.arange(tokens.shape[0], device=device)[None], causal_mask(tokens.shape[0], device))
    hidden = None if out.hidden_states is None else out.hidden_states[0]  # [T, C] for tokens[:-1] after the append
    tokens = torch.cat([tokens, pick(out.logits[0, -1])])
    num_forwards = 1
    histogram = [0]
    while tokens.shape[0] - prompt_len < max_new_tokens:
        if proposer is None:
            length = tokens.shape[0]
            out = target(tokens[None], torch.arange(length, device=device)[None], causal_mask(length, device))
            tokens = torch.cat([tokens, pick(out.logits[0, -1])])
            num_forwards += 1
            histogram[0] += 1
            continue
        proposal = proposer.propose(DraftContext(tokens, hidden))
        tree = proposal.tree
        if int(tree.tokens[0, 0]) != int(tokens[-1]):
            raise ValueError("a proposal's root must be the last committed token")
        input_ids, position_ids, mask = tree_verify_inputs(tokens, tree)
        out = target(input_ids, position_ids, mask)
        num_forwards += 1
        root_row = tokens.shape[0] - 1
        logits = torch.zeros(
            (1, tree.num_slots, out.logits.shape[-1]), dtype=out.logits.dtype, device=device
        )  # [1, N, V]: rows beyond num_nodes stay padding
        logits[0, : input_ids.shape[1] - root_row] = out.logits[0, root_row:]
        if temperature <= 0:
            result = verify_greedy(tree, logits)
        elif proposal.draft_probs is not None:
            probs = process_logits(logits, temperature, top_k, top_p)
            result = verify_chain_stochastic(tree.tokens[:, 1:], proposal.draft_probs, probs, generator)
        else:
            result = verify_sampled(tree, process_logits(logits, temperature, top_k, top_p), generator)
        proposer.update(result)
        accepted = int(result.num_accepted[0])
        if out.hidden_states is not None:  # the root and the accepted nodes are committed; the bonus is not scored
            rows = root_row + result.accepted_nodes[0, : accepted + 1]
            hidden = torch.cat([hidden, out.hidden_states[0, rows]])
        tokens = torch.cat([tokens, result.output_tokens[0, : accepted + 1]])
        histogram += [0] * (accepted + 1 - len(histogram))
        histogram[accepted] += 1
    new_tokens = tokens[prompt_len : prompt_len + max_new_tokens]
    return GenerateOutput(new_tokens.tolist(), num_forwards, histogram)
