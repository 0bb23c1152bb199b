"""Draft trees: structure properties, DDTree against brute force and a heap, EAGLE and retrieve arrays against
SGLang's own code."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.spec_helpers import (  # noqa: F401 (single_thread is an autouse fixture)
    children_of,
    ddtree_brute_force,
    path_to_root,
    random_tree,
    sglang_speculative,
    single_thread,
    tree_lists,
)

from sglang_kimi.speculators.ddtree import build_ddtree
from sglang_kimi.speculators.reference.heap import ddtree_heap
from sglang_kimi.speculators.trees import (
    NO_NODE,
    NO_PARENT,
    PAD_TOKEN_ID,
    SORT_RANK_MAX,
    SURVIVOR_SLACK,
    DraftTree,
    _survivor_topk,
    build_chain,
    build_eagle_tree,
    draft_eagle_tree,
    topk_lowest_index_ties,
)
from sglang_kimi.speculators.verify import verify_greedy

FAST = settings(max_examples=40, deadline=None)


def check_tree(tree: DraftTree) -> None:
    """Every structural promise of DraftTree, checked against plain-Python walks of the parent lists."""
    batch, slots = tree.tokens.shape
    mask = tree.ancestor_mask()
    first_child, next_sibling = tree.retrieve_next_token(), tree.retrieve_next_sibling()
    start = torch.arange(batch) * 3 + 5
    positions = tree.positions(start)
    paths = tree.node_paths()
    assert tree.retrieve_index().tolist() == [[b * slots + i for i in range(slots)] for b in range(batch)]
    for b in range(batch):
        n = int(tree.num_nodes[b])
        assert 1 <= n <= slots
        _, parents = tree_lists(tree, b)
        assert parents[0] == NO_PARENT and all(0 <= p < i for i, p in enumerate(parents) if i > 0)
        assert tree.tokens[b, n:].eq(PAD_TOKEN_ID).all() and tree.parents[b, n:].eq(NO_PARENT).all()
        kids = children_of(parents) + [[] for _ in range(slots - n)]
        for i in range(slots):
            seen = path_to_root(parents, i) if i < n else [i]
            depth = len(seen) - 1 if i < n else 0
            assert mask[b, i].nonzero().flatten().tolist() == sorted(seen)
            assert int(tree.depths[b, i]) == depth <= tree.max_depth
            assert int(positions[b, i]) == int(start[b]) + depth
            drafts = [int(tree.tokens[b, j]) for j in sorted(seen) if j != 0] if i < n else []  # root to i, root out
            assert paths[b][i] == drafts
            walked, child = [], int(first_child[b, i])
            while child != NO_NODE:
                walked.append(child)
                child = int(next_sibling[b, child])
            assert walked == kids[i]
        assert next_sibling[b, 0] == NO_NODE


@st.composite
def trees(draw) -> DraftTree:
    batch = draw(st.integers(1, 3))
    slots = draw(st.integers(1, 10))
    num_nodes = [draw(st.integers(1, slots)) for _ in range(batch)]
    parents = [[-1] + [draw(st.integers(0, i - 1)) for i in range(1, slots)] for _ in range(batch)]
    tokens = [[draw(st.integers(0, 5)) for _ in range(slots)] for _ in range(batch)]
    return DraftTree.from_parents(torch.tensor(tokens), torch.tensor(parents), torch.tensor(num_nodes))


@FAST
@given(trees())
def test_random_tree_properties(tree: DraftTree) -> None:
    check_tree(tree)


def test_docstring_example() -> None:
    tree = DraftTree.from_parents(torch.tensor([[5, 1, 2, 3, 0]]), torch.tensor([[-1, 0, 0, 1, 0]]), torch.tensor([4]))
    assert tree.tokens.tolist() == [[5, 1, 2, 3, -1]]
    assert tree.depths.tolist() == [[0, 1, 1, 2, 0]]
    assert tree.positions(torch.tensor([7])).tolist() == [[7, 8, 8, 9, 7]]
    assert tree.retrieve_next_token().tolist() == [[1, 3, -1, -1, -1]]
    assert tree.retrieve_next_sibling().tolist() == [[-1, 2, -1, -1, -1]]
    assert tree.node_paths() == [[[], [1], [2], [1, 3], []]]
    assert tree.ancestor_mask()[0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [0, 0, 0, 0, 1],
    ]


@pytest.mark.parametrize("parents", [[[-1, 1, 0]], [[-1, 0, 2]], [[0, 0, 1]]])
def test_from_parents_rejects_non_trees(parents: list[list[int]]) -> None:
    with pytest.raises(ValueError):
        DraftTree.from_parents(torch.zeros((1, 3), dtype=torch.long), torch.tensor(parents))


def test_chain() -> None:
    tree = build_chain(torch.tensor([5, 6]), torch.tensor([[7, 9], [1, 2]]))
    assert tree.tokens.tolist() == [[5, 7, 9], [6, 1, 2]]
    assert tree.parents.tolist() == [[-1, 0, 1]] * 2
    assert tree.max_depth == 2
    check_tree(tree)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_topk_lowest_index_ties(data) -> None:
    num = data.draw(st.integers(1, 12))
    k = data.draw(st.integers(1, num))
    rows = data.draw(st.lists(st.lists(st.integers(-2, 2), min_size=num, max_size=num), min_size=1, max_size=3))
    values, ids = topk_lowest_index_ties(torch.tensor(rows, dtype=torch.float32), k)
    for row, got_v, got_i in zip(rows, values.tolist(), ids.tolist()):
        expected = sorted(range(num), key=lambda t: (-row[t], t))[:k]
        assert got_i == expected and got_v == [row[t] for t in expected]


@pytest.mark.parametrize("seed", range(4))
def test_long_rows_rank_as_the_stable_sort(seed: int) -> None:
    """Rows longer than SORT_RANK_MAX take the integer-key top-k: the same values and ids as the stable sort of short
    rows, on tie-heavy rows with -0.0 beside 0.0, infinities and NaN (NaN first, as torch ranks it)."""
    gen = torch.Generator().manual_seed(seed)
    num = SORT_RANK_MAX + 37 + 100 * seed
    pool = torch.tensor([-0.0, 0.0, 1.5, -1.5, 3.0, float("inf"), float("-inf"), float("nan"), 1e-38, -1e-38])
    rows = pool[torch.randint(len(pool), (4, num), generator=gen)]
    rows[0] = torch.randn(num, generator=gen).bfloat16().float()  # bf16-rounded logits: ties among reals
    rows[1, 5:] = rows[1, 5:].nan_to_num(nan=2.0)  # NaN only near the front
    rows[2] = -rows[2].abs()  # negatives only: their order is the flipped bits'
    rows[2, 7] = float("nan")  # ... and a NaN of the other sign
    rows[2, 9] = -float("nan")
    for k in (1, 8, 33, num // 2, num):
        values, ids = topk_lowest_index_ties(rows, k)
        ref_values, ref_ids = rows.sort(dim=-1, descending=True, stable=True)
        assert ids.tolist() == ref_ids[:, :k].tolist(), k
        torch.testing.assert_close(values, ref_values[:, :k], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("k", [1, 8, 32])
def test_vocabulary_rows_rank_from_the_survivors(k: int) -> None:
    """At a vocabulary's length the ranking is torch.topk's survivors ordered (no whole-row keys): bf16-rounded logits,
    ties at the cut in about half the rows, all complete, and the stable sort's ids and values."""
    gen = torch.Generator().manual_seed(k)
    rows = (torch.randn(12, 163840, generator=gen) * 3).bfloat16().float()
    _, _, complete = _survivor_topk(rows, k, 2 * k + SURVIVOR_SLACK)
    assert bool(complete.all())
    values, ids = topk_lowest_index_ties(rows, k)
    ref_values, ref_ids = rows.sort(dim=-1, descending=True, stable=True)
    assert ids.tolist() == ref_ids[:, :k].tolist()
    assert torch.equal(values, ref_values[:, :k])


def test_survivors_flag_rows_with_more_ties_than_survived() -> None:
    """A row with more values tied at the k-th than survived is flagged (and ranked again over the whole row), a row
    whose ties all survived is not; the docstring's example too."""
    _, _, complete = _survivor_topk(torch.tensor([[1.0, 5, 5, 5, 0, 2]]), 1, 2)
    assert complete.tolist() == [False]
    num, k = 1000, 4
    rows = torch.zeros(3, num)
    rows[0, 500:] = 1.0  # 500 values tie at the 4th best: more than 2k + slack survivors
    rows[1, 10:13] = 2.0  # ties at the cut, all among the survivors
    rows[1, [7, 900]] = 1.0
    rows[2, 990:] = float("nan")  # NaN ties above every number, all surviving
    _, _, complete = _survivor_topk(rows, k, 2 * k + SURVIVOR_SLACK)
    assert complete.tolist() == [False, True, True]
    values, ids = topk_lowest_index_ties(rows, k)
    assert ids.tolist() == [[500, 501, 502, 503], [10, 11, 12, 7], [990, 991, 992, 993]]


def test_survivor_ranking_compiles_whole():
    """The GPU's ranking of long rows (survivors only, no host read) compiles as one graph."""
    torch._dynamo.reset()
    rows = torch.randn(3, 2000).bfloat16().float()
    compiled = torch.compile(lambda x: _survivor_topk(x, 8, 32), fullgraph=True, dynamic=False, backend="eager")
    for got, want in zip(compiled(rows), _survivor_topk(rows, 8, 32)):
        assert torch.equal(got, want)


def test_topk_lowest_index_ties_docstring() -> None:
    values = torch.tensor([0.0, 3.0, 1.0, 3.0])
    assert [x.tolist() for x in topk_lowest_index_ties(values, 2)] == [[3.0, 3.0], [1, 3]]
    assert [x.tolist() for x in topk_lowest_index_ties(values, 3)] == [[3.0, 3.0, 1.0], [1, 3, 2]]


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 3),
    length=st.integers(1, 3),
    vocab=st.integers(1, 4),
    budget=st.integers(1, 30),
    ties=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_ddtree_equals_brute_force(batch, length, vocab, budget, ties, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values: exact score ties everywhere
        logits = torch.randint(-1, 2, (batch, length, vocab), generator=gen).float()
    else:
        logits = torch.randn((batch, length, vocab), generator=gen)
    root = torch.randint(0, 100, (batch,), generator=gen)
    tree = build_ddtree(root, logits, budget)
    num_prefixes = sum(vocab**d for d in range(1, length + 1))
    assert tree.num_nodes.tolist() == [1 + min(budget, num_prefixes)] * batch
    check_tree(tree)
    for b in range(batch):
        got = tuple(x[b].tolist() for x in (tree.tokens, tree.parents, tree.depths))
        assert got == ddtree_brute_force(int(root[b]), logits[b], budget)


@pytest.mark.parametrize("rounding", [torch.float32, torch.bfloat16])
def test_ddtree_equals_heap_at_scale(rounding: torch.dtype) -> None:
    """L=7, budget 64 over V=2000: the top-K cut and, with bf16-rounded logits, its tie path."""
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn((4, 7, 2000), generator=gen) * 3).to(rounding).float()
    root = torch.tensor([1, 2, 3, 4])
    tree = build_ddtree(root, logits, 64)
    check_tree(tree)
    heap = ddtree_heap(root, logits, 64)
    for field in ("tokens", "parents", "depths", "num_nodes"):
        assert torch.equal(getattr(tree, field), getattr(heap, field)), field
    assert tree.max_depth == heap.max_depth


def test_ddtree_docstring_example() -> None:
    probs = torch.tensor([[[0.6, 0.3, 0.1], [0.7, 0.2, 0.1]]])
    tree = build_ddtree(torch.tensor([9]), probs.log(), 3)
    assert tree.tokens.tolist() == [[9, 0, 0, 1]]
    assert tree.parents.tolist() == [[-1, 0, 1, 0]]
    assert tree.depths.tolist() == [[0, 1, 2, 1]]


# --------------------------------------------------------------------------------------------------------------
# EAGLE: SGLang's own select_top_k_tokens / organize_draft_results / build_tree kernel against ours.


def path_drafter(vocab: int, seed: int):
    """A drafter whose next-token probabilities depend on the whole path (last two tokens and length)."""
    gen = torch.Generator().manual_seed(seed)
    by_last, by_prev, by_len = (torch.randn((n, vocab), generator=gen) * 2 for n in (vocab, vocab, 16))

    def drafter(paths: torch.Tensor) -> torch.Tensor:  # [M, s] -> [M, V]
        prev = paths[:, -2] if paths.shape[1] > 1 else paths[:, -1]
        return torch.softmax(by_last[paths[:, -1]] + by_prev[prev] + by_len[paths.shape[1]], dim=-1)

    return drafter


def sglang_eagle(root, drafter, topk, num_steps, num_draft_tokens, seq_lens):
    """EagleWorkerV2.draft_forward's loop around SGLang's own functions; the draft "hidden state" is the path."""
    f = sglang_speculative()
    batch = root.shape[0]
    hidden = root[:, None]  # [B, 1]
    topk_p, topk_index = f["fast_topk"](drafter(hidden), topk, dim=-1)
    score_list, token_list, parents_list, scores = [], [], [], None
    for i in range(num_steps):
        input_ids, hidden, scores, tree_info = f["select_top_k_tokens"](i, topk_p, topk_index, hidden, scores, topk)
        score_list.append(tree_info[0])
        token_list.append(tree_info[1])
        parents_list.append(tree_info[2])
        if i == num_steps - 1:
            break
        hidden = torch.cat([hidden, input_ids[:, None]], dim=1)  # the draft forward on the frontier
        topk_p, topk_index = f["fast_topk"](drafter(hidden), topk, dim=-1)
    parent_list, top_scores_index, draft_tokens = f["organize_draft_results"](
        score_list, token_list, parents_list, num_draft_tokens
    )
    n = num_draft_tokens
    mask = torch.full((batch * n * n,), True)
    positions = torch.empty(batch * n, dtype=torch.long)
    retrieve = torch.full((3, batch, n), -1, dtype=torch.long)
    f["sgl_build_tree_kernel_triton"](
        parent_list, top_scores_index, seq_lens, mask, positions, *retrieve, topk, num_steps, n,
        f["TreeMaskMode"].QLEN_ONLY,
    )  # fmt: skip
    return {
        "organized": (parent_list, top_scores_index, draft_tokens),
        "tokens": torch.cat([root[:, None], draft_tokens], dim=1),
        "mask": mask.view(batch, n, n),
        "positions": positions.view(batch, n),
        "retrieve": retrieve,
    }


@pytest.mark.parametrize(
    "topk,num_steps,num_draft_tokens",
    [(1, 3, 4), (2, 1, 3), (2, 3, 6), (3, 4, 12), (4, 3, 8), (3, 3, 22)],  # (3, 3, 22): every candidate kept,
)
def test_eagle_tree_equals_sglang(topk: int, num_steps: int, num_draft_tokens: int) -> None:
    vocab, batch = 12, 3
    drafter = path_drafter(vocab, seed=topk * 10 + num_steps)
    root = torch.tensor([0, 5, 11])
    seq_lens = torch.tensor([4, 9, 6])
    sglang = sglang_eagle(root, drafter, topk, num_steps, num_draft_tokens, seq_lens)

    def step_fn(paths: torch.Tensor, parent_slot: torch.Tensor) -> torch.Tensor:
        return drafter(paths.flatten(0, 1)).view(batch, paths.shape[1], vocab)

    ours = draft_eagle_tree(root, step_fn, num_steps=num_steps, topk=topk, num_draft_tokens=num_draft_tokens)
    rebuilt = build_eagle_tree(root, *sglang["organized"], topk=topk, num_steps=num_steps)
    for tree in (ours, rebuilt):
        check_tree(tree)
        assert tree.num_nodes.tolist() == [num_draft_tokens] * batch
        assert torch.equal(tree.tokens, sglang["tokens"])
        assert torch.equal(tree.ancestor_mask(), sglang["mask"])
        assert torch.equal(tree.positions(seq_lens), sglang["positions"])
        ours_retrieve = (tree.retrieve_index(), tree.retrieve_next_token(), tree.retrieve_next_sibling())
        assert torch.equal(torch.stack(ours_retrieve), sglang["retrieve"])


def test_eagle_docstring_example() -> None:
    """topk=2, num_steps=2, num_draft_tokens=4 with the probabilities of the draft_eagle_tree docstring."""
    r, a, b, c, d, e, f = range(7)
    table = {(r,): {a: 0.6, b: 0.3}, (r, a): {c: 0.5, d: 0.4}, (r, b): {e: 0.9, f: 0.1}}

    def step_fn(paths: torch.Tensor, parent_slot: torch.Tensor) -> torch.Tensor:
        probs = torch.zeros(paths.shape[:2] + (7,))
        for i, path in enumerate(paths[0].tolist()):
            for token, p in table[tuple(path)].items():
                probs[0, i, token] = p
        return probs

    tree = draft_eagle_tree(torch.tensor([r]), step_fn, num_steps=2, topk=2, num_draft_tokens=4)
    assert tree.tokens.tolist() == [[r, a, b, c]]
    assert tree.parents.tolist() == [[-1, 0, 0, 1]]


def test_eagle_token_map() -> None:
    """Drafter ids are mapped to target ids (SGLang's hot_token_id) after the top-k."""
    drafter = path_drafter(6, seed=3)
    token_map = torch.tensor([6, 13, 20, 27, 34, 41])  # token_map[i] % 6 == i, so the drafter sees the same ids

    def step_fn(paths: torch.Tensor, parent_slot: torch.Tensor) -> torch.Tensor:
        return drafter(paths.flatten(0, 1) % 6).view(paths.shape[0], paths.shape[1], 6)

    plain = draft_eagle_tree(torch.tensor([1]), step_fn, num_steps=3, topk=2, num_draft_tokens=6)
    mapped = draft_eagle_tree(torch.tensor([1]), step_fn, num_steps=3, topk=2, num_draft_tokens=6, token_map=token_map)
    assert torch.equal(mapped.tokens[:, 1:], token_map[plain.tokens[:, 1:]])
    assert torch.equal(mapped.parents, plain.parents)


def test_eagle_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        draft_eagle_tree(torch.tensor([0]), None, num_steps=2, topk=2, num_draft_tokens=8)  # only 6 candidates


def test_retrieve_arrays_drive_sglang_greedy_verify() -> None:
    """SGLang's verify_tree_greedy kernel, fed our retrieve arrays, accepts the same path as verify_greedy."""
    f = sglang_speculative()
    gen = torch.Generator().manual_seed(0)
    batch, slots, vocab = 64, 12, 3  # a 3-token vocabulary makes deep acceptance common
    tree = random_tree(gen, batch, slots, vocab)
    predict = torch.randint(0, vocab, (batch, slots), generator=gen)
    ours = verify_greedy(tree, torch.nn.functional.one_hot(predict, vocab).float())
    predicts = torch.zeros(batch * slots, dtype=torch.long)
    accept_index = torch.full((batch, tree.max_depth + 1), -1, dtype=torch.long)
    accept_num = torch.zeros(batch, dtype=torch.long)
    f["verify_tree_greedy_triton"](
        predicts, accept_index, accept_num, tree.tokens, tree.retrieve_index(), tree.retrieve_next_token(),
        tree.retrieve_next_sibling(), predict,
    )  # fmt: skip
    assert torch.equal(accept_num, ours.num_accepted)
    assert int(ours.num_accepted.max()) >= 3  # the walk went deep somewhere
    offsets = torch.arange(batch)[:, None] * slots
    assert torch.equal(torch.where(accept_index >= 0, accept_index - offsets, NO_NODE), ours.accepted_nodes)
    for b in range(batch):
        emitted = predicts[accept_index[b, : int(accept_num[b]) + 1]].tolist()
        assert emitted == ours.output_lists()[b]
