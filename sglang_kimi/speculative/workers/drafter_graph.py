"""The DFlash drafter of a DFLASH tree server in SGLang's CUDA graphs, at the draft block's width.

SGLang's DFLASH chain captures its drafter at ``speculative_num_draft_tokens``, which for a chain is the block, and
folds its LM-head argmax into each graph as a capture tail hook (``ModelRunner.capture_tail_hooks``: called once per
captured batch size on the captured forward's output, so its work replays with the graph). A tree server's
``speculative_num_draft_tokens`` is its verify window (budget + 1: it sizes the target's buffers and KV
reservations), while its drafter runs the block. So:

- :func:`block_width` builds the drafter's attention backends and graphs as SGLang builds a chain's drafter whose
  block is this block: ``speculative_num_draft_tokens`` reads the block while they are set up;
- :class:`DraftTail` is the captured tail: the step's draft side (``speculators.tree_step.draft_side``: each draft
  position ranked by the target's LM head, the DDTree of the server's widest budget, padded to the verify window)
  from the drafter's hidden states, into buffers allocated once for the largest captured batch. Adaptive chains
  have no tail of their own: their drafter graphs fold in SGLang's chain argmax, whose first w drafts are the chain
  of width w (``DFlashTreeWorker._maybe_build_draft_sampler``).

A step whose drafter forward replayed a graph reads the tail's buffers; a step that ran eager (no graphs, a batch
larger than the largest graph, an adaptive width narrower than the widest) computes the same function from the
hidden states. Under tensor parallelism the tail ranks this rank's shard of the LM head and all-gathers the ranks'
packed candidates into a buffer of its own inside the graph (``GroupCoordinator.all_gather_into_tensor``, the
collective SGLang's chain folds into the same graphs for its argmax), so every rank builds the same tree in the
replay.

``SGLANG_KIMI_DRAFT_GRAPHS``: unset or ``1`` captures the drafter's graphs where SGLang would capture a chain's;
``0`` leaves the drafter eager (SGLang's capture of it stays off, as with graphs off); ``check`` captures them and
recomputes each replayed step's draft eagerly from the replayed hidden states, logging an error for a step whose
tree, positions or mask differ and how many replayed steps were checked (a GPU check, not for serving: every
replayed step also pays the eager draft).
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager

import torch
from sglang.srt.runtime_context import get_spec

from sglang_kimi.settings import DRAFT_GRAPHS_ENV
from sglang_kimi.speculators.tree_step import draft_side
from sglang_kimi.speculators.trees import DraftTree

logger = logging.getLogger(__name__)

_checked = {"steps": 0, "differed": 0}


def draft_graphs() -> bool:
    return os.environ.get(DRAFT_GRAPHS_ENV, "1") != "0"


def check_replays() -> bool:
    return os.environ.get(DRAFT_GRAPHS_ENV, "1") == "check"


def replay_checks() -> dict:
    """How many replayed drafts ``check`` compared with the eager ones, and how many differed."""
    return {"draft_replays_checked": _checked["steps"], "draft_replays_differed": _checked["differed"]}


def same_draft(replayed: tuple, eager: tuple) -> bool:
    """Whether a replayed step's draft (tree, positions, ancestor, nonfinite) equals the eager one; counts and logs."""
    tree, *rest = replayed
    eager_tree, *eager_rest = eager
    pairs = [(getattr(tree, f), getattr(eager_tree, f)) for f in ("tokens", "parents", "depths", "num_nodes")]
    same = tree.max_depth == eager_tree.max_depth and all(
        a.shape == b.shape and bool(torch.equal(a, b)) for a, b in pairs + list(zip(rest, eager_rest))
    )
    _checked["steps"] += 1
    if not same:
        _checked["differed"] += 1
        logger.error("%s=check: a replayed step's draft differs from the eager draft (%s)", DRAFT_GRAPHS_ENV, _checked)
    elif _checked["steps"] in (1, 10, 100, 1000) or _checked["steps"] % 10000 == 0:
        logger.info("%s=check: replayed drafts equal the eager ones (%s)", DRAFT_GRAPHS_ENV, _checked)
    return same


@contextmanager
def block_width(block: int):
    """``speculative_num_draft_tokens`` reads ``block`` inside: the width SGLang sizes a DFLASH drafter's attention
    metadata and captures its graphs at."""
    with get_spec().override(speculative_num_draft_tokens=int(block)):
        yield


class DraftTail:
    """The draft side as the drafter graphs' captured tail, for one (block, tree budget) and batches up to
    ``max_bs``. Called by SGLang's capture as ``tail(runner, out, forward_batch, num_tokens)``; a step reads
    :meth:`result` after a replay."""

    def __init__(
        self,
        lm_head: torch.Tensor,
        *,
        block: int,
        width: int,
        use_kernel: bool,
        max_bs: int,
        vocab_start: int = 0,
        tp_group=None,
    ):
        """``lm_head``: the target's LM head, its real vocabulary rows; under tensor parallelism this rank's shard
        (ids from ``vocab_start``), with ``tp_group`` the group its shards are split over (SGLang's
        ``GroupCoordinator``: ``world_size``, ``all_gather_into_tensor``)."""
        if not 1 <= width or block < 2:
            raise ValueError(f"a draft tail needs width >= 1 and a block of >= 2 tokens (got {width}, {block})")
        self.lm_head = lm_head  # [V or V_shard, H]
        self.vocab_start, self.tp_group = int(vocab_start), tp_group
        self.block, self.width, self.use_kernel = int(block), int(width), bool(use_kernel)
        n = self.width + 1
        depth = min(self.width, self.block - 1)
        k = min(self.width, lm_head.shape[0])
        device, long = lm_head.device, torch.int64
        self.tokens = torch.zeros((max_bs, n), dtype=long, device=device)  # [max_bs, N]
        self.parents = torch.zeros((max_bs, n), dtype=long, device=device)  # [max_bs, N]
        self.depths = torch.zeros((max_bs, n), dtype=long, device=device)  # [max_bs, N]
        self.num_nodes = torch.zeros((max_bs,), dtype=long, device=device)  # [max_bs]
        self.positions = torch.zeros((max_bs, n), dtype=long, device=device)  # [max_bs, N]
        self.ancestor = torch.zeros((max_bs, n, n), dtype=torch.bool, device=device)  # [max_bs, N, N]
        self.nonfinite = torch.zeros((max_bs, depth, k), dtype=torch.bool, device=device)  # [max_bs, D, K]
        if tp_group is not None:  # every rank's packed candidates (values, ids, lse), rank after rank
            rows = int(tp_group.world_size) * max_bs * depth
            self.gathered = torch.zeros((rows, 2 * k + 1), dtype=torch.float32, device=device)  # [tp*max_bs*D, 2K+1]
        self.max_depth: int | None = None  # static per (width, block): set by the first capture
        self.captured_bs: set[int] = set()

    def draft(self, hidden: torch.Tensor, root: torch.Tensor, prefix_lens: torch.Tensor):
        """The step's draft side from the drafter's block: hidden [bs, B, H], root [bs], prefix_lens [bs] ->
        (tree of N = width + 1 slots, positions [bs, N], ancestor [bs, N, N], nonfinite [bs, D, K])."""
        return draft_side(
            hidden[:, 1:], self.lm_head, root, prefix_lens, width=self.width, tree=True, use_kernel=self.use_kernel,
            vocab_start=self.vocab_start, gather=None if self.tp_group is None else self._gather,
        )  # fmt: skip

    def _gather(self, packed: torch.Tensor) -> torch.Tensor:
        """Every rank's packed candidates [n, C] into the tail's own buffer (a graph's collective writes a fixed
        address) -> [tp, n, C] in rank order."""
        tp, n = int(self.tp_group.world_size), packed.shape[0]
        out = self.gathered[: tp * n]
        self.tp_group.all_gather_into_tensor(out, packed.contiguous())
        return out.view(tp, *packed.shape)

    def __call__(self, runner, out, forward_batch, num_tokens: int) -> None:
        """SGLang's capture tail hook: the draft side of the captured batch, written into the buffers."""
        del runner
        hidden = getattr(out, "hidden_states", None)
        if hidden is None:
            raise RuntimeError("the DFlash drafter's captured forward has no hidden states for the draft tail")
        per_request = getattr(getattr(forward_batch, "spec_info", None), "draft_token_num", None) or self.block
        bs = int(num_tokens) // self.block
        if int(per_request) != self.block or bs * self.block != int(num_tokens):
            raise RuntimeError(
                f"the DFlash drafter graph holds {num_tokens} tokens, {per_request} a request: not whole blocks of "
                f"{self.block} (its graphs must be captured at the block's width)"
            )
        if bs > self.tokens.shape[0]:
            raise RuntimeError(f"a DFlash drafter graph of {bs} requests: the draft tail holds {self.tokens.shape[0]}")
        root = forward_batch.input_ids[: bs * self.block].view(bs, self.block)[:, 0]  # [bs]
        tree, positions, ancestor, nonfinite = self.draft(
            hidden.view(bs, self.block, -1), root, forward_batch.seq_lens[:bs]
        )
        for buffer, value in (
            (self.tokens, tree.tokens),
            (self.parents, tree.parents),
            (self.depths, tree.depths),
            (self.num_nodes, tree.num_nodes),
            (self.positions, positions),
            (self.ancestor, ancestor),
            (self.nonfinite, nonfinite),
        ):
            buffer[:bs].copy_(value)
        self.max_depth = tree.max_depth
        self.captured_bs.add(bs)

    def result(self, bs: int) -> tuple[DraftTree, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The replayed step's draft for its ``bs`` requests (a padded graph's extra rows are left out)."""
        if self.max_depth is None:
            raise RuntimeError("the draft tail was never captured")
        tree = DraftTree(
            tokens=self.tokens[:bs],
            parents=self.parents[:bs],
            depths=self.depths[:bs],
            num_nodes=self.num_nodes[:bs],
            max_depth=self.max_depth,
        )
        return tree, self.positions[:bs], self.ancestor[:bs], self.nonfinite[:bs]
