"""Custom logit processors in SGLang's speculative verify, applied as a non-speculative step applies them.

A custom logit processor (``custom_logit_processor`` on a server started with ``--enable-custom-logit-processor``)
gets each row's ``custom_params``, whose ``"__req__"`` is the request: SGLang's thinking-budget processors, and any
rule that depends on what was generated so far, read ``req.output_ids`` from it. SGLang 0.5.23's speculative
verify gets this wrong in two ways:

- DFLASH chains (and the plugin's trees, which share the adjustments) call the processor with the same request for
  every verify row, so each draft position is judged as if it came right after the committed tokens: a rule such
  as "after 10 tokens, only ``</think>``" fires late, and "never the previous token" checks the wrong token;
- EAGLE's ``eagle_sample`` does not call custom logit processors at all.

Either way greedy outputs differ from non-speculative decoding, and sampled ones are not drawn from the target's
distribution. Here each verify row r of request b, the tree node whose logits pick the token after it, is given a
view of the request whose ``output_ids`` are the committed outputs followed by the drafts on the node's path
(:meth:`DraftTree.node_paths`), which is what the request holds when a non-speculative step samples that token.
Every other attribute is the request's own. The processors run last, after the penalties, the logit bias and the
grammar mask, in the order of SGLang's non-speculative sampler.

The committed outputs must be current when the verify runs: a batch with a custom logit processor runs the
scheduler's synchronous path (``speculative/workers/penalty_hooks.py``,
:func:`~sglang_kimi.speculative.workers.penalty_hooks.install_penalty_sync`).
The callers: the DFLASH chain hooks in ``speculative/workers/penalty_hooks.py``, the plugin's tree worker, and
``speculative/workers/eagle_sampling.py``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

from sglang_kimi.speculators.trees import DraftTree


def req_has_processor(req) -> bool:
    """Whether a request carries a custom logit processor."""
    return getattr(req, "custom_logit_processor", None) is not None


def has_processors(sampling_info) -> bool:
    """Whether a batch's sampling info applies custom logit processors (SGLang sets the flag only on servers
    started with ``--enable-custom-logit-processor``)."""
    return sampling_info is not None and bool(getattr(sampling_info, "has_custom_logit_processor", False))


class RequestAtNode:
    """A request as a custom logit processor sees it at one tree node: the committed ``output_ids`` followed by the
    drafts on the node's path; every other attribute is the request's own."""

    __slots__ = ("_req", "output_ids")

    def __init__(self, req, path: list[int]):
        self._req = req
        self.output_ids = [*req.output_ids, *path]

    def __getattr__(self, name: str):
        return getattr(self._req, name)


def _at_node(params, path: list[int]):
    """One row's custom_params with its request at the node; params without a request are passed as they are."""
    if not isinstance(params, dict) or "__req__" not in params:
        return params
    return {**params, "__req__": RequestAtNode(params["__req__"], path)}


def _processor_rows(sampling_info) -> Iterator[tuple[object, list[int]]]:
    """(processor, the batch rows it applies to) for each processor of the batch, in SGLang's two layouts: an
    entry with ``rows`` (0.5.22 and later) or a ``(processor, batch_mask)`` pair (0.5.20 and 0.5.21)."""
    for value in sampling_info.custom_logit_processor.values():
        if hasattr(value, "processor"):
            yield value.processor, list(value.rows)
        else:
            processor, batch_mask = value
            yield processor, batch_mask.nonzero(as_tuple=True)[0].tolist()


def apply_processors(logits: torch.Tensor, sampling_info, tree: DraftTree) -> None:
    """Each node's row of logits [B * N, V] by the batch's custom logit processors, in place, with the request
    seen at the node (:class:`RequestAtNode`); tree: the step's B trees of N slots, node i of request b scored by
    row b * N + i. A no-op for a batch without processors."""
    if not has_processors(sampling_info):
        return
    n = tree.num_slots
    paths = tree.node_paths()  # [B][N]
    for processor, rows in _processor_rows(sampling_info):
        if not rows:
            continue
        index = torch.tensor([b * n + i for b in rows for i in range(n)], device=logits.device)  # [len(rows) * N]
        params = [_at_node(sampling_info.custom_params[b], paths[b][i]) for b in rows for i in range(n)]
        result = processor(logits.index_select(0, index), params)  # [len(rows) * N, V]
        logits.index_copy_(0, index, result.to(logits.dtype))


_IN_STEP: contextvars.ContextVar[bool] = contextvars.ContextVar("sglang_kimi_exact_processors", default=False)


@contextlib.contextmanager
def exact_step() -> Iterator[None]:
    """For the length of one DFLASH decode step whose verify calls :func:`apply_processors` itself: SGLang's own
    application in the verify adjustments is held back (:func:`held_back`)."""
    token = _IN_STEP.set(True)
    try:
        yield
    finally:
        _IN_STEP.reset(token)


def in_exact_step() -> bool:
    """Whether the current DFLASH decode step applies the processors itself (:func:`exact_step`)."""
    return _IN_STEP.get()


@contextlib.contextmanager
def held_back(sampling_info) -> Iterator[None]:
    """Inside :func:`exact_step`: the sampling info shows no custom logit processor (SGLang's verify adjustments
    then skip theirs); elsewhere nothing changes."""
    if not in_exact_step() or not has_processors(sampling_info):
        yield
        return
    sampling_info.has_custom_logit_processor = False
    try:
        yield
    finally:
        sampling_info.has_custom_logit_processor = True
