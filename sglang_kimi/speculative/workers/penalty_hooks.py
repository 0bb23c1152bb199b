"""Exact sampling penalties (frequency, presence, repetition, min_new_tokens) in SGLang's speculative verify.

SGLang 0.5.23 applies penalties to a verify step relaxed, and not from the right state: the EAGLE workers add the
penalties of the step's start to every node of the tree and, at each step, count only the step's last output token
(``cumulate_penalty_output_tokens`` takes ``req.output_ids[-1]``); the DFLASH workers apply none under the overlap
scheduler (its forward copy of the sampling info has no penalizer) and only the additive ones of the step's start
otherwise. Greedy outputs then differ from non-speculative decoding as soon as a request sets a penalty or
``min_new_tokens``, and sampled ones are not drawn from the target's distribution.

Here every verify of a batch in which a request has a penalty scores each node with the penalties of its own output
sequence (``speculators.penalties``): the request's committed outputs (``req.output_ids``) and the drafts on the
node's path. Three hooks make that hold:

- such a batch runs the scheduler's synchronous path (as SGLang runs grammar-constrained speculative batches), so
  ``req.output_ids`` holds the previous step's tokens when the verify runs (:func:`install_penalty_sync`);
- the verify's own penalty application is hidden (penalizer, accumulated penalties, logit bias) and replaced by the
  exact one followed by the logit bias, in the order of the non-speculative sampler: additive penalties, scaling,
  grammar mask, bias (the mask is -inf where it acts, so its place in that order changes nothing);
- DFLASH chains: SGLang's worker, around its verify adjustments and its accept (:func:`install_dflash_chain`);
  DFLASH trees: the plugin's worker calls :func:`verify_penalties` and :func:`apply_exact_penalties` itself; EAGLE:
  ``speculative/workers/eagle_sampling.py`` calls :func:`apply_to_eagle_verify`.

A fourth fixes the reference itself: SGLang's synchronous sampler applies its penalizers in the iteration order of
a set of classes, which differs between processes, so a request combining the repetition penalty with frequency or
presence penalties got other tokens after a restart. Every penalizer orchestrator keeps the additive penalizers
first and the scaling one last (:func:`install_penalty_order`), the order of SGLang's overlap sampler and of the
speculative verify above.

Batches without penalties take none of these paths. The non-speculative reference is SGLang's synchronous sampler
(``--disable-overlap-schedule``): its overlap scheduler counts each output token one step late
(``docs/verification.md``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from sglang_kimi.hooks import hook
from sglang_kimi.log import warn_once
from sglang_kimi.speculative.workers.custom_processors import (
    apply_processors,
    exact_step,
    has_processors,
    held_back,
    in_exact_step,
    req_has_processor,
)
from sglang_kimi.speculators.penalties import NO_STOP_TOKEN, PenaltyParams, apply_penalties, output_counts
from sglang_kimi.speculators.trees import DraftTree, build_chain


def has_penalties(sampling_params) -> bool:
    """Whether a request's sampling parameters make a penalizer act (SGLang's ``_is_required`` rules)."""
    return (
        getattr(sampling_params, "frequency_penalty", 0.0) != 0.0
        or getattr(sampling_params, "presence_penalty", 0.0) != 0.0
        or getattr(sampling_params, "repetition_penalty", 1.0) != 1.0
        or (getattr(sampling_params, "min_new_tokens", 0) or 0) > 0
    )


def _stop_tokens(req) -> list[int]:
    """What min_new_tokens holds back: SGLang's ``BatchedMinNewTokensPenalizer`` set for this request."""
    tokenizer = getattr(req, "tokenizer", None)
    tokens = set(req.sampling_params.stop_token_ids or ()) | set(getattr(req, "eos_token_ids", None) or ())
    if tokenizer is not None:
        tokens |= set(getattr(tokenizer, "additional_stop_token_ids", None) or ())
        tokens.add(getattr(tokenizer, "eos_token_id", None))
    return sorted(t for t in tokens if t is not None)


@dataclass
class StepPenalties:
    """The penalties of one verify step: each request's parameters and committed outputs."""

    outputs: list[list[int]]  # each request's committed output tokens, the step's root last
    params: PenaltyParams
    bias: torch.Tensor | None = None  # [B, V] the logit bias held back from SGLang's adjustments, added after

    @classmethod
    def of(cls, reqs) -> StepPenalties | None:
        """From the batch's requests; None when none of them has a penalty."""
        if not any(has_penalties(req.sampling_params) for req in reqs):
            return None
        stops = [_stop_tokens(req) for req in reqs]
        width = max(1, max(len(s) for s in stops))
        params = PenaltyParams(
            frequency=torch.tensor([req.sampling_params.frequency_penalty for req in reqs], dtype=torch.float32),
            presence=torch.tensor([req.sampling_params.presence_penalty for req in reqs], dtype=torch.float32),
            repetition=torch.tensor([req.sampling_params.repetition_penalty for req in reqs], dtype=torch.float32),
            min_new_tokens=torch.tensor([req.sampling_params.min_new_tokens or 0 for req in reqs]),
            stop_tokens=torch.tensor([s + [NO_STOP_TOKEN] * (width - len(s)) for s in stops]),
        )
        return cls([list(req.output_ids) for req in reqs], params)

    def apply(self, logits: torch.Tensor, tree: DraftTree) -> None:
        """Each node's penalties on logits [B * N, V], in place; tree: the step's B trees of N slots."""
        roots = tree.tokens[:, 0].tolist()
        if any(not out or out[-1] != root for out, root in zip(self.outputs, roots)):
            # the committed outputs lag the device (the step ran without the synchronous path): not exact
            warn_once("stale", "sglang-kimi: a penalised verify ran before its previous step was committed")
        counts = output_counts(self.outputs, logits.shape[-1], logits.device)  # [B, V]
        lens = torch.tensor([len(out) for out in self.outputs], device=logits.device)
        apply_penalties(logits, tree, counts, lens, self.params)


_STEP: contextvars.ContextVar[StepPenalties | None] = contextvars.ContextVar("sglang_kimi_step_penalties", default=None)


def _step_of(batch) -> StepPenalties | None:
    """The penalties of a speculative decode step of ``batch`` (its mode is DECODE when the worker starts the step,
    TARGET_VERIFY once the verify is prepared); None otherwise."""
    mode = getattr(batch, "forward_mode", None)
    if mode is None or not (mode.is_decode() or mode.is_target_verify()) or not getattr(batch, "reqs", None):
        return None
    return StepPenalties.of(batch.reqs)


@contextlib.contextmanager
def verify_penalties(batch) -> Iterator[StepPenalties | None]:
    """For the length of one decode step of ``batch``: its :class:`StepPenalties` (None without penalties), which
    the hooks below read."""
    token = _STEP.set(_step_of(batch))
    try:
        yield _STEP.get()
    finally:
        _STEP.reset(token)


@contextlib.contextmanager
def _without_penalties(sampling_info) -> Iterator[torch.Tensor | None]:
    """Hide the sampling info's penalties and logit bias from SGLang's verify adjustments; yields the bias, which
    the caller adds after the exact penalties."""
    names = ("penalizer_orchestrator", "acc_additive_penalties", "acc_scaling_penalties", "logit_bias")
    saved = {name: getattr(sampling_info, name, None) for name in names}
    for name in names:
        setattr(sampling_info, name, None)
    try:
        yield saved["logit_bias"]
    finally:
        for name, value in saved.items():
            setattr(sampling_info, name, value)


def _add_bias(logits: torch.Tensor, bias: torch.Tensor | None, num_slots: int) -> None:
    if bias is not None:
        logits.add_(bias.to(logits.dtype).repeat_interleave(num_slots, dim=0))


# -- DFLASH: the verify adjustments (chains and trees), the chain's accept ----------------------------------------


def _dflash_adjustments(original, *args, next_token_logits, sampling_info, draft_token_num, **kwargs):
    """AROUND ``dflash_utils.apply_dflash_verify_logits_adjustments``: in a penalised step, everything but the
    penalties and the bias; the bias is kept for :func:`apply_exact_penalties`. Custom logit processors are held
    back in a DFLASH step: the step applies them last, per node (``speculative/workers/custom_processors.py``)."""
    step = _STEP.get() if sampling_info is not None else None
    with (
        _without_penalties(sampling_info) if step is not None else contextlib.nullcontext() as bias,
        held_back(sampling_info),
    ):
        if step is not None:
            step.bias = bias
        return original(
            *args,
            next_token_logits=next_token_logits,
            sampling_info=sampling_info,
            draft_token_num=draft_token_num,
            **kwargs,
        )


def apply_exact_penalties(logits: torch.Tensor, tree: DraftTree) -> None:
    """In a penalised step (inside :func:`verify_penalties`), after the verify adjustments: each node's exact
    penalties, then the logit bias they held back. logits [B * N, V]; a no-op outside such a step."""
    step = _STEP.get()
    if step is None:
        return
    step.apply(logits, tree)
    _add_bias(logits, step.bias, tree.num_slots)
    step.bias = None


def _dflash_forward(original, worker, batch, *args, **kwargs):
    """AROUND ``DFlashWorkerV2.forward_batch_generation``: the step's penalties and custom logit processors for the
    hooks below."""
    with verify_penalties(batch), exact_step():
        return original(worker, batch, *args, **kwargs)


def _dflash_can_skip_verify_logits(original, worker, batch, sampling_info, *args, **kwargs):
    """A penalised step needs the verify logits (SGLang would take the argmax of the unpenalised ones)."""
    if _STEP.get() is not None:
        return False
    return original(worker, batch, sampling_info, *args, **kwargs)


def _dflash_accept_block(original, worker, *args, candidates, next_token_logits, **kwargs):
    """AROUND ``DFlashWorkerV2._accept_block``: the chain's exact penalties, then its custom logit processors, before
    acceptance. candidates [bs, B]: the root (the last committed token) then the block's drafts; next_token_logits
    [bs * B, V]."""
    sampling_info = kwargs.get("sampling_info")
    penalised, processed = _STEP.get() is not None, in_exact_step() and has_processors(sampling_info)
    if (penalised or processed) and next_token_logits is not None:
        chain = build_chain(candidates[:, 0].long(), candidates[:, 1:].long())
        apply_exact_penalties(next_token_logits, chain)
        apply_processors(next_token_logits, sampling_info, chain)
    return original(worker, *args, candidates=candidates, next_token_logits=next_token_logits, **kwargs)


def install_dflash_chain(adjustments: str, forward_batch_generation: str, accept_block: str):
    """The DFLASH verify (SGLang's chain worker and the plugin's tree worker share the adjustments)."""
    from sglang_kimi.version import sglang_at_least

    hook(adjustments, _dflash_adjustments, "AROUND")
    hook(forward_batch_generation, _dflash_forward, "AROUND")
    hook(accept_block, _dflash_accept_block, "AROUND")
    if sglang_at_least((0, 5, 23))[0]:  # the argmax of deferred verify logits arrived in 0.5.23 (on the same class)
        worker = accept_block.rpartition(".")[0]
        hook(f"{worker}._can_skip_verify_logits", _dflash_can_skip_verify_logits, "AROUND")


# -- EAGLE ----------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def apply_to_eagle_verify(batch, logits: torch.Tensor, tree_of) -> Iterator[DraftTree | None]:
    """Inside ``eagle_sample``: in a penalised batch, each node's exact penalties and the logit bias on logits
    [bs * N, V] now, with the sampling info's own penalties and bias hidden from the rest of ``eagle_sample``.
    ``tree_of()`` gives the step's trees (only built when needed). Yields them, or None in a batch without
    penalties."""
    step = _step_of(batch)
    if step is None:
        yield None
        return
    tree = tree_of()
    step.apply(logits, tree)
    with _without_penalties(batch.sampling_info) as bias:
        _add_bias(logits, bias, tree.num_slots)
        yield tree


@contextlib.contextmanager
def bias_applied(sampling_info, logits: torch.Tensor, num_slots: int) -> Iterator[None]:
    """The logit bias added to logits [B * N, V] now, and hidden with the penalties from the rest of the verify: for
    an EAGLE verify that applies something after the bias (custom logit processors). Inside
    :func:`apply_to_eagle_verify` the bias is already applied and hidden, and this adds nothing."""
    with _without_penalties(sampling_info) as bias:
        _add_bias(logits, bias, num_slots)
        yield


# -- the synchronous path -------------------------------------------------------------------------------------------


def _needs_sync(original, batch, *args, **kwargs) -> bool:
    """AROUND ``ScheduleBatch.grammar_needs_sync``: also a speculative batch in which a request has a penalty or a
    custom logit processor (both read the committed outputs in the verify)."""
    if original(batch, *args, **kwargs):
        return True
    return not batch.spec_algorithm.is_none() and any(
        has_penalties(req.sampling_params) or req_has_processor(req) for req in batch.reqs
    )


def install_penalty_sync(target: str):
    hook(target, _needs_sync, "AROUND")


def _additive_then_scaling(result, orchestrator, *args, **kwargs):
    """AFTER ``BatchedPenalizerOrchestrator.__init__``: its penalizers in a fixed order, additive ones first (by
    name), then the multiplicative ones; ``apply`` runs them in this order."""
    ordered = sorted(orchestrator.penalizers.items(), key=lambda item: (item[1].is_multiplicative, item[0].__name__))
    orchestrator.penalizers = dict(ordered)


def install_penalty_order(target: str):
    hook(target, _additive_then_scaling, "AFTER")
