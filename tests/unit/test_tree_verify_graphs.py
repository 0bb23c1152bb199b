"""The DFLASH tree worker under CUDA graphs (``speculative/workers/tree_verify_graphs.py``,
``DFlashTreeWorker.init_cuda_graphs``):
SGLang's capture of the DFLASH verify graph takes the tree mask when the tree worker serves, and a start-up whose
target graphs lack it is refused; the drafter is captured at the block's width, not at the verify window SGLang would
capture it for, with the draft side as its captured tail (``drafter_graph.py``).

These run SGLang's own capture-time code (``DecodeCudaGraphRunner.get_spec_info``, the mask policy) on CPU with
stand-in runners; the graphs themselves need a CUDA device. SGLang's modules need the CPU import shims, so the
tests run in the session's CPU SGLang child process (``cpu_sglang_child``).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace as NS

import pytest
import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang.srt.speculative import dflash_utils
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sglang_kimi.speculative.workers import tree_verify_graphs as tvg

pytestmark = pytest.mark.cpu_sglang_child


@pytest.fixture
def policy_hooked(monkeypatch):
    """SGLang's mask policy with the plugin's AROUND hook applied, as the hook registry applies it in a server; the
    tree worker not yet built."""
    monkeypatch.setattr(tvg, "_tree_verify_in_process", False)
    hooked = functools.partial(tvg._mask_policy, dflash_utils.resolve_dflash_verify_mask_policy)
    monkeypatch.setattr(dflash_utils, "resolve_dflash_verify_mask_policy", hooked)


def triton_backend():
    return object.__new__(TritonAttnBackend)  # the policy reads the backend's type only


def capture_spec_info(is_draft_worker: bool = False):
    """What SGLang's decode graph runner hands the model at capture for a DFLASH target verify of width 9."""
    runner = NS(
        model_runner=NS(
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            attn_backend=triton_backend(),
            is_draft_worker=is_draft_worker,
        ),
        captured_req_width=9,
        buffers=NS(custom_mask=torch.ones(64, dtype=torch.bool)),
        _capture_ragged_verify_layout=lambda num_tokens: None,
    )
    return DecodeCudaGraphRunner.get_spec_info(runner, 9 * 4), runner.buffers.custom_mask


def test_sglang_captures_dflash_chains_causally_on_triton(policy_hooked):
    spec_info, _ = capture_spec_info()
    assert spec_info.custom_mask is None  # the captured kernel ignores any mask a replay brings


def test_the_tree_worker_makes_the_capture_take_the_mask(policy_hooked):
    tvg.mark_tree_verify()
    spec_info, buffer = capture_spec_info()
    assert spec_info.custom_mask is buffer and spec_info.draft_token_num == 9
    drafter_info, _ = capture_spec_info(is_draft_worker=True)
    assert drafter_info.custom_mask is None  # the drafter's non-causal block keeps SGLang's capture


def test_target_graphs_without_the_mask_are_refused(policy_hooked):
    eager = NS(decode_cuda_graph_runner=None, attn_backend=triton_backend())
    graphs = NS(decode_cuda_graph_runner=object(), attn_backend=triton_backend())
    tvg.check_target_graphs(eager)  # no graphs: nothing replays
    with pytest.raises(RuntimeError, match="--cuda-graph-backend-decode disabled") as refused:
        tvg.check_target_graphs(graphs)
    assert "TritonAttnBackend" in str(refused.value) and "dflash-tree-verify-graph-mask" in str(refused.value)
    tvg.mark_tree_verify()
    tvg.check_target_graphs(graphs)


def test_the_drafter_is_captured_at_the_blocks_width_with_the_draft_tail(monkeypatch, policy_hooked):
    """SGLang's set-up runs as it is (its memory checks, its draft scopes) and captures the drafter, with
    ``speculative_num_draft_tokens`` reading the block (8) instead of the tree server's verify window (9), and the
    draft side as a capture tail hook; then the target's graphs are checked. ``SGLANG_KIMI_DRAFT_GRAPHS=0``
    turns the drafter's capture off, and a failed capture names that switch."""
    from sglang.srt.runtime_context import _ConfigBag
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_kimi.speculative.workers import drafter_graph
    from sglang_kimi.speculative.workers.dflash_tree import DFlashTreeWorker

    spec = _ConfigBag("spec")  # SGLang's published speculative settings, as a tree server of budget 8 has them
    spec._set("speculative_num_draft_tokens", 9)
    monkeypatch.setattr(drafter_graph, "get_spec", lambda: spec)
    vocab, hidden, block = 50, 8, 8
    seen = []

    class Drafter:
        def init_cuda_graphs(self, capture_decode_cuda_graph: bool = True):
            seen.append((capture_decode_cuda_graph, spec.speculative_num_draft_tokens))

    in_draft_scope = []  # SGLang's set-up runs inside the drafter's TP context (draft_tp_context)
    head_read_in_scope = []

    def sglang_setup(self):  # what DFlashWorkerV2.init_cuda_graphs does with the drafter on a GPU
        in_draft_scope.append(True)
        try:
            assert self._maybe_build_draft_sampler() is None  # the tree's tail joins the hooks instead
            self._draft_worker.init_cuda_graphs(capture_decode_cuda_graph=True)
        finally:
            in_draft_scope.pop()
        out = NS(hidden_states=torch.randn(2 * block, hidden))  # the capture of 2 requests runs its tail hooks
        batch = NS(input_ids=torch.randint(0, vocab, (2 * block,)), seq_lens=torch.tensor([5, 7]))
        for hook in self.draft_model_runner.capture_tail_hooks:
            hook(object(), out, batch, 2 * block)

    monkeypatch.setattr(DFlashWorkerV2, "init_cuda_graphs", sglang_setup)
    head_shard = DFlashTreeWorker._head_shard

    def observed_head_shard(self):  # the LM head's shard and group, read where SGLang reads its sampler's
        head_read_in_scope.append(bool(in_draft_scope))
        return head_shard(self)

    monkeypatch.setattr(DFlashTreeWorker, "_head_shard", observed_head_shard)
    worker = object.__new__(DFlashTreeWorker)
    drafter = Drafter()
    target = NS(
        model_runner=NS(
            decode_cuda_graph_runner=NS(max_bs=4),
            attn_backend=triton_backend(),
            model=NS(lm_head=NS(weight=torch.randn(vocab + 14, hidden))),  # padded rows past the vocabulary
            req_to_token_pool=NS(size=3),
        )
    )
    vars(worker).update(
        _draft_worker=drafter, _target_worker=target, _adaptive_pending=False, _tail=None, block_size=block,
        max_width=8, tree_budget=8, _use_triton_ddtree=False, draft_model_runner=NS(capture_tail_hooks=[]),
        model_runner=NS(model_config=NS(vocab_size=vocab)),
    )  # fmt: skip
    monkeypatch.setattr(DFlashTreeWorker, "target_worker", property(lambda self: target), raising=False)
    with pytest.raises(RuntimeError, match="causal chain verify"):
        worker.init_cuda_graphs()  # the tree worker not marked: the target's graphs are refused
    assert seen == [(True, block)] and spec.speculative_num_draft_tokens == 9
    tvg.mark_tree_verify()
    worker.draft_model_runner.capture_tail_hooks.clear()
    worker.init_cuda_graphs()
    tail = worker._tail
    assert tail is not None and tail.captured_bs == {2} and tail.lm_head.shape == (vocab, hidden)
    assert tail.tokens.shape == (4, 9) and tail.result(2)[0].tokens.shape == (2, 9)  # [max_bs, N], N = 9
    assert worker.draft_model_runner.capture_tail_hooks == [tail]  # kept for a later re-capture
    assert head_read_in_scope and all(head_read_in_scope)  # inside the drafter's TP context, as SGLang's sampler
    worker.init_cuda_graphs()  # a re-capture: a new tail replaces the old hook
    assert worker.draft_model_runner.capture_tail_hooks == [worker._tail] and worker._tail is not tail

    monkeypatch.setenv(drafter_graph.DRAFT_GRAPHS_ENV, "0")
    seen.clear()
    worker.draft_model_runner.capture_tail_hooks.clear()
    worker._tail = None
    worker.init_cuda_graphs()
    assert seen == [(False, block)] and worker._tail is None and "init_cuda_graphs" not in vars(drafter)
    assert worker.draft_model_runner.capture_tail_hooks == []

    class Failing:
        def init_cuda_graphs(self, capture_decode_cuda_graph: bool = True):
            raise RuntimeError("The size of tensor a (224) must match the size of tensor b (252)")

    monkeypatch.delenv(drafter_graph.DRAFT_GRAPHS_ENV)
    vars(worker)["_draft_worker"] = Failing()
    with pytest.raises(RuntimeError, match="SGLANG_KIMI_DRAFT_GRAPHS=0 to run the drafter eager") as failed:
        worker.init_cuda_graphs()
    assert "tensor a (224)" in str(failed.value) and spec.speculative_num_draft_tokens == 9


def chain_worker(monkeypatch, block: int = 8, **attributes):
    """A tree worker serving adaptive chains (no tree budget) of the block's width, its SGLang parts stand-ins."""
    from sglang.srt.runtime_context import _ConfigBag

    from sglang_kimi.speculative.workers import drafter_graph
    from sglang_kimi.speculative.workers.dflash_tree import DFlashTreeWorker

    spec = _ConfigBag("spec")
    spec._set("speculative_num_draft_tokens", block)
    monkeypatch.setattr(drafter_graph, "get_spec", lambda: spec)
    worker = object.__new__(DFlashTreeWorker)
    vars(worker).update(
        _adaptive_pending=False, _tail=None, block_size=block, max_width=block - 1, tree_budget=None,
        draft_model_runner=NS(capture_tail_hooks=[]), _draft_sampler=None, adaptive=None, device="cpu",
    )  # fmt: skip
    vars(worker).update(attributes)
    return worker


def test_adaptive_chains_capture_sglangs_chain_drafter_and_causal_verify(monkeypatch, policy_hooked):
    """Adaptive chains: the drafter graphs fold in SGLang's own chain argmax (its draft sampler), the plugin adds
    no tail, and the target's causal chain-verify graphs are SGLang's chain's, not refused; a tree server builds
    no sampler."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_kimi.speculative.workers.dflash_tree import DFlashTreeWorker

    sampler = NS(out=torch.zeros(4, dtype=torch.int64))
    monkeypatch.setattr(DFlashWorkerV2, "_maybe_build_draft_sampler", lambda self: sampler)
    built = []
    monkeypatch.setattr(
        DFlashWorkerV2, "init_cuda_graphs", lambda self: built.append(self._maybe_build_draft_sampler())
    )
    target = NS(model_runner=NS(decode_cuda_graph_runner=object(), attn_backend=triton_backend()))
    monkeypatch.setattr(DFlashTreeWorker, "target_worker", property(lambda self: target), raising=False)
    worker = chain_worker(monkeypatch)
    worker.init_cuda_graphs()  # causal target graphs: not refused for chains
    assert built == [sampler] and worker._tail is None and worker.draft_model_runner.capture_tail_hooks == []
    from sglang_kimi.speculative.workers.drafter_graph import DraftTail

    vars(worker)["tree_budget"] = 7  # a tree server: no sampler of SGLang's, its own tail among the hooks instead
    tail = object.__new__(DraftTail)
    monkeypatch.setattr(DFlashTreeWorker, "_new_draft_tail", lambda self: tail)
    assert worker._maybe_build_draft_sampler() is None
    assert worker.draft_model_runner.capture_tail_hooks == [tail] and worker._tail is tail


def test_the_blocks_full_chain_is_sglangs_chain_step_and_narrower_chains_the_plugins(monkeypatch):
    """The width the policy picks decides the step: the block's full chain (7 drafts of a block of 8) runs
    SGLang's DFLASH chain step and the policy sees its accepted counts; narrower widths run the plugin's step."""
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_kimi.speculative.workers.dflash_tree import DFlashTreeWorker

    class Policy:
        def __init__(self, widths):
            self.widths, self.finished = list(widths), []

        def choose(self, bs):
            return self.widths.pop(0)

        def start(self):
            return "started"

        def finish(self, started, bs, width, accepted, paths):
            self.finished.append((started, bs, width, accepted.tolist(), paths))

    chain = NS(accept_lens=torch.tensor([3, 1, 8], dtype=torch.int32))  # accepted + 1
    monkeypatch.setattr(DFlashWorkerV2, "forward_batch_generation", lambda self, batch, *args: chain)
    monkeypatch.setattr(DFlashTreeWorker, "_tree_decode_step", lambda self, batch, width, *args: ("plugin", width))
    policy = Policy([7, 3, 0, 7])
    worker = chain_worker(monkeypatch, adaptive=policy)
    decode = NS(is_extend=lambda: False, is_idle=lambda: False, is_decode=lambda: True)
    batch = NS(
        forward_mode=decode, is_extend_in_batch=False, spec_info=object.__new__(DFlashDraftInputV2),
        seq_lens=torch.tensor([5, 9, 4]), reqs=[], sampling_info=None,
    )  # fmt: skip
    assert worker.forward_batch_generation(batch) is chain
    assert worker.forward_batch_generation(batch) == ("plugin", 3)
    assert worker.forward_batch_generation(batch) == ("plugin", 0)
    assert worker.forward_batch_generation(batch) is chain
    assert policy.finished == [("started", 3, 7, [2, 0, 7], None)] * 2  # the plugin's step records its own


def test_a_narrower_chain_takes_the_first_drafts_of_sglangs_in_graph_argmax(monkeypatch):
    """A replayed drafter graph of adaptive chains leaves SGLang's argmax drafts of the whole block in its
    sampler's buffer (padding rows after the batch's): a chain of width w is the root and the first w of them."""
    block, bs, width = 8, 2, 3
    out = torch.arange(100, 100 + 4 * (block - 1))  # a graph of 4 requests: [4 * (B-1)]
    worker = chain_worker(monkeypatch, _draft_sampler=NS(out=out))
    monkeypatch.setattr(type(worker), "_draft_block", lambda self, *args: (torch.randn(bs, block, 4), True))
    root, prefix = torch.tensor([11, 12]), torch.tensor([5, 9])
    tree, positions, ancestor = worker._draft_tree(None, root, prefix, prefix, None, width)
    drafts = out[: bs * (block - 1)].view(bs, block - 1)[:, :width]
    assert torch.equal(tree.tokens, torch.cat([root[:, None], drafts], dim=1))
    assert torch.equal(tree.parents, torch.tensor([[-1, 0, 1, 2]] * bs))
    assert torch.equal(positions, prefix[:, None] + torch.arange(width + 1))
    assert torch.equal(ancestor, torch.ones(width + 1, width + 1, dtype=torch.bool).tril().expand(bs, -1, -1))
