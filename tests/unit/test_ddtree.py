"""The DDTree's ranking and its tensor-parallel form: each position's best K tokens from raw logits, and the merge of
vocabulary shards' candidates (simulated shards on CPU, ties across shards), giving the same tree."""

import pytest
import torch

from sglang_kimi.speculators.ddtree import (
    PACKED_ID_LIMIT,
    build_ddtree,
    build_ddtree_ranked,
    logsumexp_from_max,
    merge_packed_candidates,
    merge_shard_candidates,
    num_tree_nodes,
    pack_shard_candidates,
    rank_draft_logits,
    shard_candidates,
)


def sharded_ranking(logits: torch.Tensor, k: int, bounds: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """What the DFLASH tree worker computes at tensor parallelism len(bounds) - 1: each rank ranks its vocabulary
    shard logits[:, bounds[r]:bounds[r + 1]] and packs its candidates, one all-gather stacks them in rank order,
    one merge."""
    parts = [shard_candidates(logits[:, lo:hi], k, lo) for lo, hi in zip(bounds, bounds[1:])]
    gathered = torch.stack([pack_shard_candidates(*p) for p in parts])  # [S, n, 2k+1]
    return merge_packed_candidates(gathered, k)


def test_packed_candidates_merge_as_the_shards_own_tensors():
    """Ids travel as float32 beside the values: exact below 2**24 (Kimi's 163,840 tokens are far below)."""
    gen = torch.Generator().manual_seed(3)
    k, shards, n = 5, 3, 4
    values = torch.randn(shards, n, k, generator=gen).sort(dim=-1, descending=True).values
    ids = torch.stack([torch.randint(0, 1000, (n, k), generator=gen) + s * 1000 for s in range(shards)])
    ids[-1, 0, 0] = PACKED_ID_LIMIT - 1  # the largest id that travels exactly
    lse = torch.randn(shards, n, 1, generator=gen) + 5
    packed = torch.stack([pack_shard_candidates(values[s], ids[s], lse[s]) for s in range(shards)])
    assert packed.shape == (shards, n, 2 * k + 1) and packed.dtype == torch.float32
    by_shard = [torch.cat(list(t), dim=-1) for t in (values, ids, lse)]  # [n, S*k], [n, S*k], [n, S]
    want_lp, want_ids = merge_shard_candidates(*by_shard, k)
    got_lp, got_ids = merge_packed_candidates(packed, k)
    assert torch.equal(got_ids, want_ids) and torch.equal(got_lp, want_lp)
    assert int(packed[-1, 0, k]) == PACKED_ID_LIMIT - 1


def test_ranking_is_the_top_k_of_log_softmax():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 300, generator=gen) * 4
    lp, ids = rank_draft_logits(logits, 16)
    full = torch.log_softmax(logits, dim=-1)
    ref_lp, ref_ids = full.topk(16, dim=-1)  # tie-free inputs: torch's order is the rule's order
    assert torch.equal(ids, ref_ids)
    # the same values up to float32 rounding of the log-sum-exp (other reduction order), ~1e-7 relative
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    assert lp.dtype == torch.float32 and ids.dtype == torch.int64


def test_ranking_in_blocks_is_the_ranking_at_once(monkeypatch):
    """A CPU ranks rows CPU_RANK_BLOCK_ELEMENTS at a time: the blocks (one of them short) give the ranking of the
    batch at once, in the input's leading shape, for 2-D and 3-D inputs."""
    import sglang_kimi.speculators.ddtree as ddtree

    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(3, 7, 300, generator=gen) * 4).bfloat16().float()  # bf16-rounded: ties among the logits
    at_once = rank_draft_logits(logits, 16)
    monkeypatch.setattr(ddtree, "CPU_RANK_BLOCK_ELEMENTS", 4 * 300)  # blocks of 4 rows: 21 rows in 6 blocks
    for got, want_shape in (
        (rank_draft_logits(logits, 16), (3, 7, 16)),
        (rank_draft_logits(logits.view(21, 300), 16), (21, 16)),
    ):
        assert got[0].shape == got[1].shape == want_shape
        assert torch.equal(got[1].view(3, 7, 16), at_once[1]) and torch.equal(got[0].view(3, 7, 16), at_once[0])


def test_ranking_breaks_ties_by_lower_id():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 3.0]])
    lp, ids = rank_draft_logits(logits, 2)
    assert ids.tolist() == [[1, 3]] and lp[0, 0] == lp[0, 1]


@pytest.mark.parametrize(
    "vocab,k,bounds",
    [
        (64, 8, [0, 16, 32, 48, 64]),  # even shards (TP 4)
        (50, 8, [0, 13, 26, 38, 50]),  # SGLang pads the last shard; the plugin reads only the real rows
        (30, 12, [0, 5, 30]),  # a shard smaller than K offers all it has
        (20, 20, [0, 7, 14, 20]),  # K = V: every token ranked
    ],
)
def test_shard_merge_equals_the_full_vocabulary_ranking(vocab, k, bounds):
    gen = torch.Generator().manual_seed(vocab + k)
    logits = torch.randn(6, vocab, generator=gen) * 3
    lp, ids = sharded_ranking(logits, k, bounds)
    ref_lp, ref_ids = rank_draft_logits(logits, k)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)  # per-shard log-sum-exps, merged: float32 rounding


def test_ties_across_shards_go_to_the_lower_id():
    # equal logits in three shards straddle the cut of k = 3: ids 2 (shard 0), 5 and 7 (shard 1), 9 (shard 2)
    logits = torch.full((1, 12), -5.0)
    logits[0, [9, 7, 5, 2]] = 1.0
    logits[0, 11] = 4.0
    lp, ids = sharded_ranking(logits, 3, [0, 4, 8, 12])
    assert ids.tolist() == [[11, 2, 5]]
    assert ids.tolist() == rank_draft_logits(logits, 3)[1].tolist()


def test_sharded_ranking_builds_the_same_tree():
    gen = torch.Generator().manual_seed(7)
    batch, length, vocab, budget = 3, 7, 96, 32
    logits = torch.randn(batch, length, vocab, generator=gen) * 2
    root = torch.randint(vocab, (batch,), generator=gen)
    lp, ids = sharded_ranking(logits.view(-1, vocab), budget, [0, 24, 48, 72, 96])
    tree = build_ddtree_ranked(root, lp.view(batch, length, -1), ids.view(batch, length, -1), budget)
    expected = build_ddtree(root, logits, budget)
    for field in ("tokens", "parents", "depths", "num_nodes"):
        assert torch.equal(getattr(tree, field), getattr(expected, field)), field


def test_num_tree_nodes():
    assert num_tree_nodes(2, 2, 10) == 6  # 2 prefixes of depth 1, 4 of depth 2
    assert num_tree_nodes(7, 64, 64) == 64
    assert num_tree_nodes(3, 1, 10) == 3  # a chain


def test_logsumexp_from_the_top_value_is_torchs():
    """The ranking's log-sum-exp from the top-k's first value: torch.logsumexp's value on ordinary rows (to float32
    rounding) and on rows of -inf, with +inf or with NaN; in place it overwrites the rows, else leaves them alone."""
    gen = torch.Generator().manual_seed(3)
    rows = (torch.randn(6, 5000, generator=gen) * 5).bfloat16().float()
    rows[1] = float("-inf")
    rows[2, 17] = float("inf")
    rows[3, 99] = float("nan")
    rows[4, :4000] = float("-inf")
    kept = rows.clone()
    row_max = rows.nan_to_num(nan=float("inf")).amax(dim=-1, keepdim=True)  # NaN ranks above every number
    row_max[3] = float("nan")
    got = logsumexp_from_max(rows, row_max)
    assert torch.equal(rows.nan_to_num(), kept.nan_to_num())  # not written
    torch.testing.assert_close(got, torch.logsumexp(kept, dim=-1, keepdim=True), rtol=2e-6, atol=0, equal_nan=True)
    scratch = kept.clone()
    assert torch.equal(logsumexp_from_max(scratch, row_max, in_place=True).nan_to_num(), got.nan_to_num())
    assert not torch.allclose(scratch, kept, equal_nan=True)  # the exponentials were written over the rows


def test_overwrite_ranks_the_same_and_only_then_writes_the_rows():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 700, generator=gen)
    kept = logits.clone()
    lp, ids = rank_draft_logits(logits, 9)
    assert torch.equal(logits, kept)
    lp2, ids2 = rank_draft_logits(logits, 9, overwrite=True)
    assert torch.equal(lp, lp2) and torch.equal(ids, ids2) and not torch.equal(logits, kept)
