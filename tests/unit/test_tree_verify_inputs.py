"""SGLang-convention tensors for tree verify: the FULL_MASK layout and the verify distribution."""

from types import SimpleNamespace

import torch

from sglang_kimi.speculative.workers.tree_verify_inputs import (
    SGLANG_TOP_K_ALL,
    requests_max_top_k,
    verify_probs,
    write_tree_mask,
)
from sglang_kimi.speculators.trees import DraftTree
from sglang_kimi.speculators.verify import process_logits


def _tree(parents: list[list[int]]) -> DraftTree:
    parents_t = torch.tensor(parents)
    tokens = torch.arange(parents_t.numel()).view(parents_t.shape) + 10
    return DraftTree.from_parents(tokens, parents_t)


def test_full_mask_layout_per_request():
    tree = _tree([[-1, 0, 0, 1], [-1, 0, 1, 2]])
    prefix_lens = [2, 3]
    n = 4
    flat = torch.full((sum(n * (p + n) for p in prefix_lens) + 5,), 7, dtype=torch.uint8)  # stale cells: 7
    write_tree_mask(flat, tree.ancestor_mask(), torch.tensor(prefix_lens))
    first = flat[: n * (2 + n)].view(n, 2 + n)
    second = flat[n * (2 + n) : n * (2 + n) + n * (3 + n)].view(n, 3 + n)
    # only the tree blocks are written: the prefix cells and the tail keep what they held
    assert (first[:, :2] == 7).all() and (second[:, :3] == 7).all() and (flat[-5:] == 7).all()
    assert torch.equal(first[:, 2:], tree.ancestor_mask()[0])
    assert torch.equal(second[:, 3:], tree.ancestor_mask()[1])
    # node 3 of request 0 sees root, node 1 and itself, not its uncle 2
    assert first[3, 2:].tolist() == [True, True, False, True]


def test_verify_probs_expands_sampling_params_per_request():
    gen = torch.Generator().manual_seed(0)
    bs, n, vocab = 3, 4, 30
    logits = torch.randn(bs * n, vocab, generator=gen)
    info = SimpleNamespace(
        temperatures=torch.tensor([[0.7], [1.0], [1.3]]),
        top_ks=torch.tensor([5, SGLANG_TOP_K_ALL, 1], dtype=torch.int32),  # 1 = greedy in SGLang
        top_ps=torch.tensor([1.0, 0.8, 1.0]),
        min_ps=torch.tensor([0.0, 0.1, 0.0]),
        need_min_p_sampling=True,
    )
    probs = verify_probs(logits, info, n).view(bs, n, vocab)
    rows = logits.view(bs, n, vocab)
    torch.testing.assert_close(probs[0], process_logits(rows[0], 0.7, 5, 1.0, 0.0))
    torch.testing.assert_close(probs[1], process_logits(rows[1], 1.0, 0, 0.8, 0.1))
    assert torch.equal(probs[2].argmax(-1), rows[2].argmax(-1)) and torch.equal(probs[2].max(-1).values, torch.ones(n))
    assert ((probs[0] > 0).sum(-1) == 5).all()


def test_every_tp_rank_commits_rank_0s_sampled_verify(monkeypatch):
    """A sampled tree verify draws coins from each rank's own generator; what every rank commits is rank 0's."""
    from sglang_kimi.speculative.workers import sampled_verify
    from sglang_kimi.speculators.verify import VerifyResult

    def result(nodes, accepted, bonus, tokens):
        return VerifyResult(torch.tensor(nodes), torch.tensor(accepted), torch.tensor(bonus), torch.tensor(tokens))

    rank0 = result([[0, 1, 3], [0, -1, -1]], [2, 0], [8, 6], [[11, 13, 8], [6, -1, -1]])
    rank1 = result([[0, 2, -1], [0, 1, -1]], [1, 1], [7, 9], [[12, 7, -1], [11, 9, -1]])

    class TwoRanks:  # what a broadcast from rank 0 does to rank 1's tensor
        world_size = 2
        broadcasts = 0

        def broadcast(self, tensor, src):
            assert src == 0
            tensor.copy_(torch.cat([rank0.accepted_nodes, rank0.output_tokens, rank0.num_accepted[:, None],
                                    rank0.bonus[:, None]], dim=1))  # fmt: skip
            TwoRanks.broadcasts += 1

    monkeypatch.setattr(sampled_verify, "_verify_group", TwoRanks)
    synced = sampled_verify.sampled_result_from_rank0(rank1)
    assert TwoRanks.broadcasts == 1  # one collective per verify step
    for field in ("accepted_nodes", "num_accepted", "bonus", "output_tokens"):
        assert torch.equal(getattr(synced, field), getattr(rank0, field)), field

    class OneRank:
        world_size = 1

    monkeypatch.setattr(sampled_verify, "_verify_group", OneRank)
    assert sampled_verify.sampled_result_from_rank0(rank1) is rank1


def test_the_requests_top_k_bounds_the_selection_only_when_every_request_has_one():
    def reqs(*top_ks):
        return [SimpleNamespace(sampling_params=SimpleNamespace(top_k=k)) for k in top_ks]

    assert requests_max_top_k(reqs(5, 1, 40)) == 40  # greedy requests are SGLang's top_k 1
    assert requests_max_top_k(reqs(5, SGLANG_TOP_K_ALL)) is None  # one request samples the whole vocabulary
    assert requests_max_top_k(reqs(5, -1)) is None and requests_max_top_k([]) is None

    gen = torch.Generator().manual_seed(1)
    bs, n, vocab = 2, 3, 600
    logits = torch.randn(bs * n, vocab, generator=gen) * 3
    info = SimpleNamespace(
        temperatures=torch.tensor([[0.8], [1.2]]), top_ks=torch.tensor([7, 20], dtype=torch.int32),
        top_ps=torch.tensor([0.9, 1.0]), min_ps=torch.zeros(2), need_min_p_sampling=False,
        need_top_k_sampling=True, need_top_p_sampling=True,
    )  # fmt: skip
    bounded = verify_probs(logits, info, n, requests_max_top_k(reqs(7, 20)))
    assert torch.equal(bounded > 0, verify_probs(logits, info, n) > 0)
    torch.testing.assert_close(bounded, verify_probs(logits, info, n), rtol=4e-7, atol=0)
    # no request filters (SGLang's flags): the tempered softmax itself
    plain = SimpleNamespace(**{**vars(info), "top_ks": torch.full((2,), SGLANG_TOP_K_ALL), "top_ps": torch.ones(2),
                               "need_top_k_sampling": False, "need_top_p_sampling": False})  # fmt: skip
    expected = torch.softmax(logits / torch.tensor([0.8, 1.2]).repeat_interleave(n)[:, None], dim=-1)
    torch.testing.assert_close(verify_probs(logits, plain, n), expected, rtol=1e-6, atol=0)
