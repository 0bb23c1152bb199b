"""The draft side as the DFlash drafter graphs' captured tail (``speculative/workers/drafter_graph.py``), called the way
SGLang's graph capture calls a tail hook: once per captured batch size, on the captured forward's hidden states and
the runner's own input buffers, its results in buffers a replayed step reads. The capture itself needs a GPU; what
CPU shows is that the tail computes the eager draft side exactly, at a padded batch too, and that a step reads
buffers that the next replay overwrites in place (a graph's outputs cannot move)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_kimi.speculative.workers import drafter_graph
from sglang_kimi.speculative.workers.drafter_graph import DraftTail, same_draft
from sglang_kimi.speculators.tree_step import draft_side

VOCAB, HIDDEN, BLOCK = 97, 16, 8


def captured_call(tail: DraftTail, hidden, input_ids, seq_lens):
    """What SGLang's capture does after the drafter's forward: ``hook(runner, out, forward_batch, num_tokens)``."""
    out = SimpleNamespace(hidden_states=hidden)  # [bs*B, H]
    forward_batch = SimpleNamespace(input_ids=input_ids, seq_lens=seq_lens)
    tail(object(), out, forward_batch, hidden.shape[0])


def block_inputs(gen, bs):
    hidden = torch.randn(bs * BLOCK, HIDDEN, generator=gen)  # [bs*B, H]
    input_ids = torch.randint(0, VOCAB, (bs * BLOCK,), generator=gen)  # [bs*B]
    seq_lens = torch.randint(5, 50, (bs,), generator=gen)  # [bs]
    return hidden, input_ids, seq_lens


@pytest.mark.parametrize("width", [4, 9, 16])
def test_the_tail_writes_the_eager_draft_side_of_the_real_requests(width):
    gen = torch.Generator().manual_seed(width)
    lm_head = torch.randn(VOCAB, HIDDEN, generator=gen)  # [V, H]
    # bf16-like ties in the logits: the ranking's lowest-index rule must hold in the tail too
    lm_head = (lm_head * 4).round() / 4
    tail = DraftTail(lm_head, block=BLOCK, width=width, use_kernel=False, max_bs=8)
    real = 3
    hidden, input_ids, seq_lens = block_inputs(gen, 4)  # a graph of 4 requests replaying 3 (padding row 4)
    captured_call(tail, hidden, input_ids, seq_lens)
    got_tree, positions, ancestor, nonfinite = tail.result(real)

    root = input_ids.view(4, BLOCK)[:real, 0]
    want_tree, want_pos, want_anc, want_nf = draft_side(
        hidden.view(4, BLOCK, HIDDEN)[:real, 1:], lm_head, root, seq_lens[:real], width=width, tree=True
    )
    for field in ("tokens", "parents", "depths", "num_nodes"):
        assert torch.equal(getattr(got_tree, field), getattr(want_tree, field)), field
    assert got_tree.max_depth == want_tree.max_depth
    assert torch.equal(positions, want_pos) and torch.equal(ancestor, want_anc) and torch.equal(nonfinite, want_nf)
    assert got_tree.tokens.shape == (real, width + 1)
    assert same_draft((got_tree, positions, ancestor, nonfinite), (want_tree, want_pos, want_anc, want_nf))


def test_a_step_reads_buffers_the_next_replay_overwrites_in_place():
    gen = torch.Generator().manual_seed(0)
    lm_head = torch.randn(VOCAB, HIDDEN, generator=gen)
    tail = DraftTail(lm_head, block=BLOCK, width=6, use_kernel=False, max_bs=4)
    captured_call(tail, *block_inputs(gen, 2))
    first = tail.result(2)
    kept = first[0].tokens.clone()
    hidden, input_ids, seq_lens = block_inputs(gen, 2)
    captured_call(tail, hidden, input_ids, seq_lens)  # a replay reruns the tail into the same buffers
    assert first[0].tokens.data_ptr() == tail.tokens.data_ptr()
    want = draft_side(hidden.view(2, BLOCK, HIDDEN)[:, 1:], lm_head, input_ids.view(2, BLOCK)[:, 0], seq_lens,
                      width=6, tree=True)  # fmt: skip
    assert torch.equal(first[0].tokens, want[0].tokens) and not torch.equal(first[0].tokens, kept)
    assert torch.equal(first[1], want[1])


def test_a_capture_not_at_the_blocks_width_is_refused():
    lm_head = torch.randn(VOCAB, HIDDEN)
    tail = DraftTail(lm_head, block=BLOCK, width=4, use_kernel=False, max_bs=4)
    hidden = torch.randn(3 * (BLOCK + 1), HIDDEN)  # captured at the verify window (9), not the block (8)
    with pytest.raises(RuntimeError, match="27 tokens, 8 a request: not whole blocks of 8"):
        captured_call(tail, hidden, torch.zeros(hidden.shape[0], dtype=torch.long), torch.zeros(3, dtype=torch.long))
    # 2 requests of a 16-token window are 32 tokens, whole blocks of 8: the runner's own width says otherwise
    window = SimpleNamespace(draft_token_num=16)
    hidden = torch.randn(32, HIDDEN)
    batch = SimpleNamespace(input_ids=torch.zeros(32, dtype=torch.long), seq_lens=torch.zeros(2), spec_info=window)
    with pytest.raises(RuntimeError, match="32 tokens, 16 a request"):
        tail(object(), SimpleNamespace(hidden_states=hidden), batch, 32)
    with pytest.raises(RuntimeError, match="graph of 5 requests: the draft tail holds 4"):
        big = torch.randn(5 * BLOCK, HIDDEN)
        captured_call(tail, big, torch.zeros(5 * BLOCK, dtype=torch.long), torch.zeros(5, dtype=torch.long))
    with pytest.raises(RuntimeError, match="never captured"):
        tail.result(1)
    with pytest.raises(ValueError, match="width >= 1"):
        DraftTail(lm_head, block=BLOCK, width=0, use_kernel=False, max_bs=4)


def test_the_check_counts_a_replayed_draft_that_differs(monkeypatch, caplog):
    monkeypatch.setattr(drafter_graph, "_checked", {"steps": 0, "differed": 0})
    gen = torch.Generator().manual_seed(1)
    lm_head = torch.randn(VOCAB, HIDDEN, generator=gen)
    tail = DraftTail(lm_head, block=BLOCK, width=5, use_kernel=False, max_bs=2)
    hidden, input_ids, seq_lens = block_inputs(gen, 2)
    captured_call(tail, hidden, input_ids, seq_lens)
    eager = tail.draft(hidden.view(2, BLOCK, HIDDEN), input_ids.view(2, BLOCK)[:, 0], seq_lens)
    assert same_draft(tail.result(2), eager)
    tail.ancestor[1, 3, 0] ^= True  # one mask bit off
    assert not same_draft(tail.result(2), eager)
    assert drafter_graph._checked == {"steps": 2, "differed": 1}
    assert "differs from the eager draft" in caplog.text
    env = drafter_graph.DRAFT_GRAPHS_ENV
    for value, graphs, check in (("check", True, True), ("1", True, False), ("0", False, False)):
        monkeypatch.setenv(env, value)
        assert (drafter_graph.draft_graphs(), drafter_graph.check_replays()) == (graphs, check), value
    monkeypatch.delenv(env)
    assert (drafter_graph.draft_graphs(), drafter_graph.check_replays()) == (True, False)


def tp_tail_rank(rank: int, group, width: int, bounds: list[int]) -> dict:
    """One tensor-parallel rank: its shard of the LM head in a draft tail with the group, captured as SGLang captures
    it, and the same draft side compiled whole (``fullgraph``) with its all-gather."""
    gen = torch.Generator().manual_seed(width)
    lm_head = (torch.randn(VOCAB, HIDDEN, generator=gen) * 4).round() / 4  # ties, within and across shards
    hidden, input_ids, seq_lens = block_inputs(gen, 4)
    lo, hi = bounds[rank], bounds[rank + 1]
    tail = DraftTail(lm_head[lo:hi], block=BLOCK, width=width, use_kernel=False, max_bs=8, vocab_start=lo,
                     tp_group=group)  # fmt: skip
    captured_call(tail, hidden, input_ids, seq_lens)
    tree, positions, ancestor, nonfinite = tail.result(3)

    def draft(block_hidden, root, prefix):
        out = draft_side(block_hidden[:, 1:], tail.lm_head, root, prefix, width=width, tree=True, vocab_start=lo,
                         gather=tail._gather)  # fmt: skip
        return out[0].tokens, out[0].parents, out[1], out[2]

    compiled = torch.compile(draft, fullgraph=True, dynamic=False, backend="eager")
    block_hidden, root = hidden.view(4, BLOCK, HIDDEN)[:3], input_ids.view(4, BLOCK)[:3, 0]
    return {
        "tail": (tree.tokens, tree.parents, tree.depths, positions, ancestor, nonfinite),
        "compiled": compiled(block_hidden, root, seq_lens[:3]),
    }


@pytest.mark.parametrize("width, bounds", [(16, [0, 40, VOCAB])])  # uneven shards
def test_the_tail_at_tp2_gathers_the_shards_inside_and_builds_the_full_vocabularys_tree(width, bounds):
    """At tensor parallelism 2 each rank's tail ranks its shard and gathers the ranks' packed candidates (one
    collective, in the tail): both ranks build exactly the tree of the whole LM head, and the draft side with that
    collective compiles whole (``torch.compile(fullgraph=True)``), as a CUDA graph would hold it."""
    from support.gloo_ranks import run_ranks

    ranks = run_ranks(tp_tail_rank, 2, width, bounds)
    gen = torch.Generator().manual_seed(width)
    lm_head = (torch.randn(VOCAB, HIDDEN, generator=gen) * 4).round() / 4
    hidden, input_ids, seq_lens = block_inputs(gen, 4)
    want_tree, want_pos, want_anc, want_nf = draft_side(
        hidden.view(4, BLOCK, HIDDEN)[:3, 1:], lm_head, input_ids.view(4, BLOCK)[:3, 0], seq_lens[:3], width=width,
        tree=True,
    )  # fmt: skip
    want = (want_tree.tokens, want_tree.parents, want_tree.depths, want_pos, want_anc, want_nf)
    for rank in ranks:
        for got, expected in zip(rank["tail"], want):
            assert torch.equal(got, expected)
        tokens, parents, positions, ancestor = rank["compiled"]
        assert torch.equal(tokens, want[0]) and torch.equal(parents, want[1])
        assert torch.equal(positions, want_pos) and torch.equal(ancestor, want_anc)
