"""Verification coins and SGLang's layout: seeded coins depend on the request's seed and committed length only (a
seeded request reproduces its output whatever shares its batch), and SGLang's retrieve arrays and verify outputs
convert to and from ``DraftTree`` / ``VerifyResult`` losslessly. Their uniformity: ``tests/statistical``."""

import torch
from support.spec_helpers import random_tree

from sglang_kimi.speculators.trees import DraftTree
from sglang_kimi.speculators.verify import MAX_COIN, VerifyResult, random_coins, seeded_coins, verify_sampled

VOCAB, SLOTS = 12, 9


def test_seeded_coins_depend_on_seed_and_offset_only():
    seeds = torch.tensor([7, 7, 8, 7])
    offsets = torch.tensor([100, 101, 100, 100])
    coins = seeded_coins(seeds, offsets, SLOTS)
    assert coins.uniform.shape == coins.final.shape == (4, SLOTS)
    assert torch.equal(coins.uniform[0], coins.uniform[3]) and torch.equal(coins.final[0], coins.final[3])
    assert not torch.equal(coins.uniform[0], coins.uniform[1])  # another step
    assert not torch.equal(coins.uniform[0], coins.uniform[2])  # another seed
    alone = seeded_coins(seeds[2:3], offsets[2:3], SLOTS)  # the batch around a request changes nothing
    assert torch.equal(alone.uniform[0], coins.uniform[2]) and torch.equal(alone.final[0], coins.final[2])
    assert float(coins.uniform.min()) >= 0 and float(torch.cat([coins.uniform, coins.final]).max()) <= MAX_COIN


def test_a_seeded_request_verifies_the_same_in_any_batch():
    gen = torch.Generator().manual_seed(3)
    tree = random_tree(gen, 6, SLOTS, VOCAB)
    probs = torch.softmax(torch.randn(6, SLOTS, VOCAB, generator=gen), dim=-1)
    seeds, offsets = torch.tensor([5, 6, 7, 8, 9, 10]), torch.tensor([40, 41, 42, 43, 44, 45])
    batch = verify_sampled(tree, probs, seeded_coins(seeds, offsets, SLOTS))
    again = verify_sampled(tree, probs, seeded_coins(seeds, offsets, SLOTS))
    assert torch.equal(batch.output_tokens, again.output_tokens)
    rows = [4, 1]
    sub = DraftTree(*(getattr(tree, f)[rows] for f in ("tokens", "parents", "depths", "num_nodes")), tree.max_depth)
    alone = verify_sampled(sub, probs[rows], seeded_coins(seeds[rows], offsets[rows], SLOTS))
    assert torch.equal(alone.output_tokens, batch.output_tokens[rows])
    other = verify_sampled(tree, probs, seeded_coins(seeds + 1000, offsets, SLOTS))
    assert not torch.equal(other.output_tokens, batch.output_tokens)


def test_random_coins_follow_the_generator():
    a = random_coins(3, 4, generator=torch.Generator().manual_seed(1))
    b = random_coins(3, 4, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.uniform, b.uniform) and torch.equal(a.final, b.final)
    assert not torch.equal(a.uniform, a.final)


def test_sglang_layout_round_trip():
    gen = torch.Generator().manual_seed(4)
    tree = random_tree(gen, 5, SLOTS, VOCAB, min_nodes=SLOTS)  # SGLang's trees have no padding
    back = DraftTree.from_retrieve(
        tree.tokens, tree.retrieve_next_token(), tree.retrieve_next_sibling(), tree.max_depth
    )
    for field in ("tokens", "parents", "depths", "num_nodes"):
        assert torch.equal(getattr(back, field), getattr(tree, field)), field
    probs = torch.softmax(torch.randn(5, SLOTS, VOCAB, generator=gen) * 3, dim=-1)
    result = verify_sampled(tree, probs, gen)
    predicts = torch.full((5 * SLOTS,), -7, dtype=torch.int32)
    accept_index = torch.full((5, tree.max_depth + 1), -7, dtype=torch.int32)
    accept_num = torch.full((5,), -7, dtype=torch.int32)
    result.to_sglang(predicts, accept_index, accept_num)
    assert (
        accept_index[accept_index >= 0] // SLOTS == torch.arange(5)[:, None].expand_as(accept_index)[accept_index >= 0]
    ).all()
    again = VerifyResult.from_sglang(predicts, accept_index, accept_num, SLOTS)
    for field in ("accepted_nodes", "num_accepted", "bonus", "output_tokens"):
        assert torch.equal(getattr(again, field), getattr(result, field)), field
    untouched = torch.ones_like(predicts, dtype=torch.bool)
    untouched[accept_index[accept_index >= 0].long()] = False
    assert (predicts[untouched] == -7).all()  # SGLang leaves the rest undefined; nothing else is written
