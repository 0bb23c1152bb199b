"""Lossless sampled verification on ROCm and CPU (``sglang_kimi/speculative/workers/eagle_sampling.py``,
``dflash_sampling.py``).

- the target distribution equals what SGLang's ``pytorch`` sampler draws from (its own filtering code);
- EAGLE trees through the ``eagle_sample`` hook and DFLASH chains through the DFLASH hook: over many requests on a
  fixed tree and fixed logits, the first emitted token follows p(.|root) and the second, after a drafted child c,
  follows p(.|c) (chi-square); greedy verification fails the same test;
- greedy batches and configurations the lossless rule does not cover go to SGLang's own code.

SGLang's modules need the CPU import shims, so the tests run in a child process with ``SGLANG_USE_CPU_ENGINE=1``
(a CPU SGLang process, shared with the session's other such files: ``cpu_sglang_child``) and the shims on
``PYTHONPATH``; in the parent, one test fails with the child's report of them.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import sglang.srt.layers.dp_attention as dp_attention
import sglang.srt.runtime_context as runtime_context
import torch
from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.eagle_utils import TreeMaskMode, build_tree_kernel_efficient
from support.stats import chi2_pvalue

from sglang_kimi.speculative.workers import dflash_sampling as ds
from sglang_kimi.speculative.workers import eagle_sampling as es
from sglang_kimi.speculative.workers.tree_verify_inputs import verify_probs

pytestmark = pytest.mark.cpu_sglang_child


V = 12


@pytest.fixture
def spec_config(monkeypatch):
    """The runtime configuration eagle_sample reads, for a single-rank CPU server."""
    spec = SimpleNamespace(
        speculative_use_rejection_sampling=False,
        speculative_accept_threshold_single=1.0,
        speculative_accept_threshold_acc=1.0,
    )
    group = SimpleNamespace(world_size=1)
    monkeypatch.setattr(runtime_context, "get_spec", lambda: spec)
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: SimpleNamespace(tp_group=group, attn_tp_group=group))
    monkeypatch.setattr(dp_attention, "is_dp_attention_enabled", lambda: False)
    return spec


def sampling_info(bs, temperature=1.0, top_k=1 << 30, top_p=1.0, min_p=0.0, greedy=False):
    return SimpleNamespace(
        temperatures=torch.full((bs, 1), temperature),
        top_ks=torch.full((bs,), top_k, dtype=torch.int32),
        top_ps=torch.full((bs,), top_p),
        min_ps=torch.full((bs,), min_p),
        need_top_k_sampling=top_k < V,
        need_top_p_sampling=top_p < 1.0,
        need_min_p_sampling=min_p > 0.0,
        is_all_greedy=greedy,
        sampling_seed=None,
        acc_additive_penalties=None,
        acc_scaling_penalties=None,
        logit_bias=None,
        has_watermark_candidates=False,
    )


@pytest.mark.parametrize(
    "top_k,top_p,min_p",
    [(1 << 30, 1.0, 0.0), (5, 1.0, 0.0), (1 << 30, 0.7, 0.0), (4, 0.8, 0.0), (1 << 30, 0.9, 0.2)],
)
def test_target_probs_are_what_the_pytorch_sampler_draws_from(top_k, top_p, min_p):
    gen = torch.Generator().manual_seed(top_k % 97)
    bs, n = 3, 4
    logits = torch.randn(bs * n, V, generator=gen) * 2
    info = sampling_info(bs, temperature=0.7, top_k=top_k, top_p=top_p, min_p=min_p)
    ours = verify_probs(logits, info, n)
    probs = torch.softmax(logits / 0.7, dim=-1)
    rows = torch.arange(bs).repeat_interleave(n)
    if info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling:
        _, filtered, idx, _ = top_k_top_p_min_p_sampling_from_probs_torch(
            probs.clone(),
            info.top_ks[rows],
            info.top_ps[rows],
            info.min_ps[rows],
            info.need_min_p_sampling,
            None,
            None,
            return_filtered_probs=True,
        )
        reference = torch.zeros_like(probs).scatter_(-1, idx.long(), filtered)
    else:
        reference = probs
    reference = reference / reference.sum(-1, keepdim=True)
    assert torch.allclose(ours, reference, atol=1e-6)
    assert ((ours > 0) == (reference > 0)).all()


def eagle_verify_input(rows: int, candidates: torch.Tensor):
    """``rows`` copies of one EAGLE tree (topk 2, 2 steps, 4 nodes) built by SGLang's tree builder."""
    # selected draft ids 0, 1 (step 0: children of the root) and 2 (step 1: its parent is parent_list[2 // 2],
    # draft id 0): nodes 1, 2, 3 = tokens candidates[1:], node 3 under node 1
    parent_list = torch.tensor([[-1, 0, 1]]).repeat(rows, 1)
    top_scores_index = torch.tensor([[0, 1, 2]]).repeat(rows, 1)
    draft = candidates[1:].repeat(rows, 1)
    _, _, r_index, r_next, r_sibling, tokens = build_tree_kernel_efficient(
        candidates[:1].repeat(rows),
        parent_list,
        top_scores_index,
        draft,
        torch.full((rows,), 5),
        5 * rows,
        2,
        2,
        4,
        TreeMaskMode.QLEN_ONLY,
    )
    return SimpleNamespace(
        draft_token=tokens,
        draft_token_num=4,
        max_tree_depth=3,
        retrieve_index=r_index,
        retrieve_next_token=r_next,
        retrieve_next_sibling=r_sibling,
    )


def emitted(predict, accept_index, accept_lens, k):
    """The k-th output token of each request (accepted drafts, then the bonus)."""
    rows = torch.arange(accept_index.shape[0])
    return predict[accept_index[rows, k].long()].long()


def test_eagle_sampled_tree_follows_the_target(spec_config):
    gen = torch.Generator().manual_seed(11)
    rows = 20000
    candidates = torch.tensor([7, 3, 5, 9])  # root (committed), children 3 and 5 of the root, 9 under 3
    verify_input = eagle_verify_input(rows, candidates)
    root_children = []
    child = int(verify_input.retrieve_next_token[0, 0])
    while child != -1:
        root_children.append(int(candidates[child]))
        child = int(verify_input.retrieve_next_sibling[0, child])
    assert root_children == [3, 5] and int(verify_input.retrieve_next_token[0, 1]) == 3
    node_logits = torch.randn(4, V, generator=gen) * 1.5
    node_logits[0, 3] += 2.0  # make the drafted children likely under the target
    node_logits[1, 9] += 2.0
    info = sampling_info(rows, temperature=1.0, top_p=0.9)
    batch = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY, seq_lens=torch.full((rows,), 5), device="cpu", sampling_info=info
    )
    logits_output = SimpleNamespace(next_token_logits=node_logits.repeat(rows, 1))

    def upstream(*args, **kwargs):
        raise AssertionError("a sampled CPU batch must not reach SGLang's greedy verify")

    predict, accept_lens, accept_index = es.eagle_sample_lossless(upstream, verify_input, batch, logits_output)
    target = verify_probs(node_logits, sampling_info(1, top_p=0.9), 4)  # [4, V]
    first = emitted(predict, accept_index, accept_lens, 0)
    assert chi2_pvalue(torch.bincount(first, minlength=V), target[0]) > 1e-4
    after_3 = first == 3
    second = emitted(predict, accept_index[after_3], accept_lens[after_3], 1)
    assert chi2_pvalue(torch.bincount(second, minlength=V), target[1]) > 1e-4  # node 1 (token 3) is the parent
    assert (accept_lens[after_3] >= 2).all() and (accept_lens <= 3).all()

    # Greedy verification (SGLang's CPU behaviour before the hook) fails the same test.
    greedy_first = torch.full((rows,), int(target[0].argmax()))
    assert chi2_pvalue(torch.bincount(greedy_first, minlength=V), target[0]) < 1e-6


def test_greedy_batches_and_uncovered_settings_keep_upstream(spec_config):
    calls = []

    def upstream(*args, **kwargs):
        calls.append(kwargs)
        return "upstream"

    candidates = torch.tensor([7, 3, 5, 9])
    verify_input = eagle_verify_input(2, candidates)
    logits_output = SimpleNamespace(next_token_logits=torch.zeros(8, V))
    greedy = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY,
        seq_lens=torch.full((2,), 5),
        device="cpu",
        sampling_info=sampling_info(2, greedy=True),
    )
    assert es.eagle_sample_lossless(upstream, verify_input, greedy, logits_output) == "upstream"
    sampled = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY,
        seq_lens=torch.full((2,), 5),
        device="cpu",
        sampling_info=sampling_info(2),
    )
    spec_config.speculative_use_rejection_sampling = True  # upstream's chain rejection sampler: lossless
    assert es.eagle_sample_lossless(upstream, verify_input, sampled, logits_output) == "upstream"
    spec_config.speculative_use_rejection_sampling = False
    spec_config.speculative_accept_threshold_acc = 0.5  # relaxed acceptance: not the lossless rule
    assert es.eagle_sample_lossless(upstream, verify_input, sampled, logits_output) == "upstream"
    assert len(calls) == 3


def test_dflash_sampled_chain_follows_the_target(spec_config):
    gen = torch.Generator().manual_seed(12)
    bs, n = 20000, 4
    chain = torch.tensor([2, 6, 1, 8])  # bonus, then three drafted tokens
    node_logits = torch.randn(n, V, generator=gen)
    node_logits[0, 6] += 2.5
    node_logits[1, 1] += 2.5
    info = sampling_info(bs, temperature=1.0, top_p=0.9)

    def upstream(**kwargs):
        raise AssertionError("the CPU path must not reach SGLang's CUDA-only DFLASH sampling")

    accepted, bonus = ds.dflash_sampled_verify(
        upstream, candidates=chain.repeat(bs, 1), next_token_logits=node_logits.repeat(bs, 1), sampling_info=info
    )
    assert accepted.shape == (bs,) and bonus.dtype == torch.int64
    target = verify_probs(node_logits, sampling_info(1, top_p=0.9), n)
    # the first emitted token is the draft 6 when accepted, else the bonus
    first = torch.where(accepted > 0, torch.full_like(bonus, 6), bonus)
    assert chi2_pvalue(torch.bincount(first, minlength=V), target[0]) > 1e-4
    second = torch.where(accepted[accepted > 0] > 1, torch.ones_like(bonus[accepted > 0]), bonus[accepted > 0])
    assert chi2_pvalue(torch.bincount(second, minlength=V), target[1]) > 1e-4
    assert ds.dflash_sampling_available(lambda: False) is True
    spec_config.speculative_accept_threshold_single = 0.3
    assert ds.dflash_sampling_available(lambda: False) is False  # upstream's greedy fallback and its warning
