"""Verification laid out as its consumers read it, for tests.

- :func:`twin`: the torch verification twin (``speculators.verify.walk_tree``) in the Triton kernel's interface
  (SGLang's layout), for tests that compare the kernel with it on CPU under the interpreter and on a GPU.
- :func:`verify_side`: the DDTree step's verify side (``speculators.verify.verify_tree``, then
  ``speculators.tree_step.commit_layout``) as one function, which ``tests/unit/test_tree_step.py`` compiles whole and
  exports.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang_kimi.speculators.tree_step import CommitLayout, commit_layout
from sglang_kimi.speculators.trees import DraftTree
from sglang_kimi.speculators.verify import Coins, verify_tree, walk_tree


def twin(
    candidates, retrieve_index, next_token, next_sibling, *, num_spec_tokens, target_predict=None, target_logits=None,
    target_probs=None, uniform_samples=None, uniform_samples_for_final_sampling=None, predicts=None,
    accept_index=None, accept_token_num=None,
):  # fmt: skip
    """The torch twin in the kernel's interface: SGLang's arrays -> DraftTree -> walk_tree -> SGLang's outputs."""
    if sum(t is not None for t in (target_predict, target_logits, target_probs)) != 1:
        raise ValueError("pass exactly one of target_predict, target_logits, target_probs")
    if target_probs is not None and (uniform_samples is None or uniform_samples_for_final_sampling is None):
        raise ValueError("sampled verification needs uniform_samples and uniform_samples_for_final_sampling")
    batch, n = candidates.shape
    assert torch.equal(retrieve_index, torch.arange(batch * n, device=candidates.device).view(batch, n))
    tree = DraftTree.from_retrieve(candidates, next_token, next_sibling, num_spec_tokens - 1, (candidates >= 0).sum(1))
    if target_predict is not None:  # a one-hot at the given argmax
        target_logits = torch.nn.functional.one_hot(target_predict.long(), int(target_predict.max()) + 1).float()
    coins = None
    if target_probs is not None:
        final = uniform_samples_for_final_sampling
        coins = Coins(uniform_samples, final[:, None].expand(batch, n) if final.dim() == 1 else final)
    result = walk_tree(tree, target_logits=target_logits, target_probs=target_probs, coins=coins)
    predicts = torch.zeros(batch * n, dtype=torch.int32, device=candidates.device) if predicts is None else predicts
    accept_index = (
        torch.full((batch, num_spec_tokens), -1, dtype=torch.int32, device=candidates.device)
        if accept_index is None
        else accept_index
    )
    accept_token_num = (
        torch.zeros(batch, dtype=torch.int32, device=candidates.device)
        if accept_token_num is None
        else accept_token_num
    )
    result.to_sglang(predicts, accept_index, accept_token_num)
    return SimpleNamespace(predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num)


def verify_side(
    tree: DraftTree,
    verify_slots: torch.Tensor,
    draft_rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    target_logits: torch.Tensor | None = None,
    target_probs: torch.Tensor | None = None,
    coins: Coins | None = None,
    ancestor: torch.Tensor | None = None,
) -> CommitLayout:
    """Verify the window (greedy from target_logits [B, N, V], or sampled from target_probs [B, N, V] with coins)
    and lay out its commit (``speculators.tree_step.commit_layout``). ``ancestor`` [B, N, N]: the draft side's mask
    (``speculators.tree_step.draft_side``), reused."""
    result = verify_tree(tree, target_logits=target_logits, target_probs=target_probs, coins=coins, ancestor=ancestor)
    return commit_layout(result, verify_slots, draft_rows, prefix_lens)
