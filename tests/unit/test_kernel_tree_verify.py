"""Tree verification: the Triton kernel (CPU, float32, Triton's interpreter) against its torch twin
(``speculators.verify.walk_tree``, the same decisions from the same coins), in SGLang's layout (retrieve arrays in,
predicts / accept_index / accept_token_num out, converted by ``DraftTree.from_retrieve`` and ``VerifyResult``), on
random trees. The walk's law against the exact target law is ``tests/statistical/test_tree_walk_law.py``.

Triton reads TRITON_INTERPRET when kernels are decorated, so it must be set before Triton is first imported in
this process (see ``kernels/interpret.py``); if something imported Triton earlier without it, this module runs
itself in a fresh process instead (one test that fails with the child's output).
"""

from __future__ import annotations

import os

import pytest
import torch
from support.child_process import rerun_in_fresh_process

from sglang_kimi.kernels.interpret import interpreter_active, interpreter_imports

_ENV_BEFORE = os.environ.get("TRITON_INTERPRET")
with interpreter_imports():
    from sglang_kimi.kernels import tree_verify as tv
IN_PROCESS = interpreter_active()

from support.verify_layout import twin  # noqa: E402

from sglang_kimi.speculators.trees import DraftTree  # noqa: E402
from sglang_kimi.speculators.verify import verify_greedy  # noqa: E402

POISON = -7  # sentinel for outputs a run must overwrite (or leave alone, where SGLang leaves them undefined)


def random_tree(batch: int, slots: int, vocab: int, gen: torch.Generator, pad: bool = True, dup: bool = False):
    """Random trees as DraftTree: parent < child, random tokens (distinct among siblings unless ``dup``), and
    some requests padded (num_nodes < slots)."""
    parents = torch.full((batch, slots), -1, dtype=torch.long)
    tokens = torch.randint(vocab, (batch, slots), generator=gen)
    for b in range(batch):
        for i in range(1, slots):
            parents[b, i] = int(torch.randint(i, (1,), generator=gen))
        if not dup:
            for i in range(1, slots):
                used = {int(tokens[b, j]) for j in range(1, i) if parents[b, j] == parents[b, i]}
                free = [t for t in range(vocab) if t not in used]
                tokens[b, i] = free[int(torch.randint(len(free), (1,), generator=gen))]
    num_nodes = torch.full((batch,), slots, dtype=torch.long)
    if pad:
        num_nodes = torch.randint(1, slots + 1, (batch,), generator=gen)
    return DraftTree.from_parents(tokens, parents, num_nodes)


def retrieve(tree: DraftTree):
    return tree.tokens, tree.retrieve_index(), tree.retrieve_next_token(), tree.retrieve_next_sibling()


def boosted_logits(tree: DraftTree, vocab: int, gen: torch.Generator, boost: float = 3.0) -> torch.Tensor:
    """Random logits [B, N, V] where each node's children are likely, so walks go deep."""
    logits = torch.randn(tree.batch_size, tree.num_slots, vocab, generator=gen)
    valid = tree.valid()
    for b in range(tree.batch_size):
        for i in range(1, tree.num_slots):
            if valid[b, i]:
                logits[b, tree.parents[b, i], tree.tokens[b, i]] += boost * float(torch.rand((), generator=gen))
    return logits


def greedy_logits(tree: DraftTree, vocab: int, gen: torch.Generator, ties: bool = False) -> torch.Tensor:
    """Random logits [B, N, V] where, at most nodes, one random child's token is the argmax (deep walks). With
    ``ties`` the logits are integers and the chosen child only ties the maximum (the first maximum wins)."""
    logits = torch.randn(tree.batch_size, tree.num_slots, vocab, generator=gen) * 2
    if ties:
        logits = logits.round()
    valid = tree.valid()
    for b in range(tree.batch_size):
        for node in range(tree.num_slots):
            children = [c for c in range(tree.num_slots) if valid[b, c] and int(tree.parents[b, c]) == node]
            if children and float(torch.rand((), generator=gen)) < 0.85:
                c = children[int(torch.randint(len(children), (1,), generator=gen))]
                logits[b, node, tree.tokens[b, c]] = logits[b, node].max() + (0.0 if ties else 1.0)
    return logits


def poisoned(batch: int, slots: int, spec: int):
    return dict(
        predicts=torch.full((batch * slots,), POISON, dtype=torch.int32),
        accept_index=torch.full((batch, spec), POISON, dtype=torch.int32),
        accept_token_num=torch.full((batch,), POISON, dtype=torch.int32),
    )


def run_both(tree: DraftTree, block_v: int, **target):
    spec = tree.max_depth + 1
    args = retrieve(tree)
    kern = tv.tree_verify(
        *args, num_spec_tokens=spec, block_v=block_v, **poisoned(tree.batch_size, tree.num_slots, spec), **target
    )
    ref = twin(*args, num_spec_tokens=spec, **poisoned(tree.batch_size, tree.num_slots, spec), **target)
    return kern, ref


def assert_same(kern, ref):
    assert torch.equal(kern.accept_token_num, ref.accept_token_num)
    assert torch.equal(kern.accept_index, ref.accept_index)
    assert torch.equal(kern.predicts, ref.predicts)  # also: the same untouched (poisoned) entries


def as_verify_result(out, tree: DraftTree):
    """SGLang-format outputs -> (accepted local nodes [B, D+1], num_accepted [B], bonus [B], output tokens)."""
    B, N = tree.tokens.shape
    idx = out.accept_index.long()
    local = torch.where(idx >= 0, idx - torch.arange(B)[:, None] * N, -1)
    num = out.accept_token_num.long()
    rows = idx.clamp(min=0)
    tokens = torch.where(idx >= 0, out.predicts.long()[rows], -1)
    bonus = tokens[torch.arange(B), num]
    return local, num, bonus, tokens


# ----------------------------------------------------------------------------------------------------------------
# greedy


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("source", ["predict", "logits"])
def test_greedy_kernel_equals_ref_and_speculators(seed, source):
    gen = torch.Generator().manual_seed(seed)
    vocab = 37
    tree = random_tree(5, 9, vocab, gen)
    logits = greedy_logits(tree, vocab, gen, ties=(seed == 2))  # seed 2: exact ties, the first maximum wins
    target = {"target_predict": logits.argmax(-1)} if source == "predict" else {"target_logits": logits}
    kern, ref = run_both(tree, block_v=16, **target)  # 3 vocab blocks: exercises the blocked argmax
    assert_same(kern, ref)
    expected = verify_greedy(tree, logits)
    for out in (kern, ref):
        local, num, bonus, tokens = as_verify_result(out, tree)
        assert torch.equal(num, expected.num_accepted)
        assert torch.equal(local, expected.accepted_nodes)
        assert torch.equal(bonus, expected.bonus)
        assert torch.equal(tokens, expected.output_tokens)
    if seed != 2:
        assert int(expected.num_accepted.max()) >= 2, "test trees should be accepted deep somewhere"


def test_greedy_worked_example_from_docstring():
    # root 0 -> children 1 (a=11), 2 (b=12); node 1 -> child 3 (c=13); argmax per node = [12, 0, 22, 0]
    tree = DraftTree.from_parents(torch.tensor([[5, 11, 12, 13]]), torch.tensor([[-1, 0, 0, 1]]))
    predict = torch.tensor([[12, 0, 22, 0]])
    for fn in (tv.tree_verify, twin):
        out = fn(*retrieve(tree), num_spec_tokens=3, target_predict=predict, **poisoned(1, 4, 3))
        assert out.accept_index.tolist() == [[0, 2, -1]]
        assert out.accept_token_num.tolist() == [1]
        assert out.predicts.tolist() == [12, POISON, 22, POISON]


def test_depth_limit_stops_the_walk():
    # a chain of 4 drafts, all matching, but only num_spec_tokens = 3 (2 drafts) may be accepted
    tree = DraftTree.from_parents(torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[-1, 0, 1, 2, 3]]))
    predict = torch.tensor([[2, 3, 4, 5, 9]])
    for fn in (tv.tree_verify, twin):
        out = fn(*retrieve(tree), num_spec_tokens=3, target_predict=predict, **poisoned(1, 5, 3))
        assert out.accept_token_num.tolist() == [2]
        assert out.accept_index.tolist() == [[0, 1, 2]]
        assert out.predicts.tolist()[:3] == [2, 3, 4]  # bonus at node 2 is its argmax (4)


# ----------------------------------------------------------------------------------------------------------------
# sampled: kernel and twin make the same decisions from the same coins


def _same_or_rounding_tie(kern, ref, tree, probs, final_coins):
    """Kernel and twin sum the residual in different orders; a bonus may differ only if the twin's u' * R lies
    within float32 rounding of a CDF boundary. Everything else must be identical."""
    assert torch.equal(kern.accept_token_num, ref.accept_token_num)
    assert torch.equal(kern.accept_index, ref.accept_index)
    diff = (kern.predicts != ref.predicts).nonzero().flatten().tolist()
    B, N = tree.tokens.shape
    for row in diff:
        b = row // N
        num = int(ref.accept_token_num[b])
        assert row == int(ref.accept_index[b, num]), "only a bonus may differ"
        node = row - b * N
        p = probs[b, node].double()
        children = tree.tokens[b][(tree.parents[b] == node) & tree.valid()[b]]
        if num < tree.max_depth:  # stopped by rejection: children removed
            p[children[p[children] > 0]] = 0
        coin = final_coins[b] if final_coins.dim() == 1 else final_coins[b, node]
        u = float(coin) * float(p.sum())
        assert float((p.cumsum(0) - u).abs().min()) < 1e-5 * max(1.0, float(p.sum())), f"bonus differs at {row}"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_sampled_kernel_equals_ref(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    vocab = 50
    tree = random_tree(6, 8, vocab, gen, dup=(seed == 3))  # seed 3: repeated sibling tokens
    probs = torch.softmax(boosted_logits(tree, vocab, gen, boost=4.0), dim=-1)
    if seed == 1:  # zero-probability tokens, children among them
        probs = probs * (torch.rand(probs.shape, generator=gen) > 0.3)
        probs = probs / probs.sum(-1, keepdim=True)
    coins = torch.rand(tree.batch_size, tree.num_slots, generator=gen)
    final = torch.rand(tree.batch_size, generator=gen) if seed % 2 == 0 else torch.rand(6, 8, generator=gen)
    if seed == 2:  # extreme coins: 0 and the largest float32 below 1
        coins[0] = 0.0
        coins[1] = 1.0 - 2**-24
        final[0] = 0.0
        final[1] = 1.0 - 2**-24
    kern, ref = run_both(
        tree, block_v=16, target_probs=probs, uniform_samples=coins, uniform_samples_for_final_sampling=final
    )
    _same_or_rounding_tie(kern, ref, tree, probs, final)
    # the emitted tokens are possible: every accepted child and every bonus has positive probability
    local, num, bonus, tokens = as_verify_result(ref, tree)
    for b in range(tree.batch_size):
        path = local[b, : int(num[b]) + 1].tolist()
        for parent, child in zip(path, path[1:]):
            assert probs[b, parent, tree.tokens[b, child]] > 0
        assert probs[b, path[-1], bonus[b]] > 0


def test_sampled_all_mass_on_rejected_children_falls_back_to_a_child():
    # p(.|root) puts everything on the two children; a coin at 1 - 2^-24 can pass their float32 sum
    tree = DraftTree.from_parents(torch.tensor([[0, 1, 2]]), torch.tensor([[-1, 0, 0]]))
    probs = torch.zeros(1, 3, 4)
    probs[0, 0, 1] = 0.3
    probs[0, 0, 2] = 0.7 - 1e-7  # float32 sum < 1
    probs[0, 1:, 3] = 1.0
    coins = torch.full((1, 3), 1.0 - 2**-24)
    final = torch.tensor([0.5])
    kern, ref = run_both(
        tree, block_v=16, target_probs=probs, uniform_samples=coins, uniform_samples_for_final_sampling=final
    )
    assert_same(kern, ref)
    bonus = int(ref.predicts[int(ref.accept_index[0, int(ref.accept_token_num[0])])])
    assert probs[0, 0, bonus] > 0 or int(ref.accept_token_num[0]) == 1


# ----------------------------------------------------------------------------------------------------------------


def test_inputs_are_checked():
    tree = DraftTree.from_parents(torch.tensor([[0, 1]]), torch.tensor([[-1, 0]]))
    with pytest.raises(ValueError, match="exactly one"):
        tv.tree_verify(*retrieve(tree), num_spec_tokens=2)
    with pytest.raises(ValueError, match="uniform"):
        tv.tree_verify(*retrieve(tree), num_spec_tokens=2, target_probs=torch.ones(1, 2, 3) / 3)
    with pytest.raises(ValueError, match="exactly one"):
        verify_greedy(tree, None)
    with pytest.raises(ValueError, match="coins"):
        from sglang_kimi.speculators.verify import verify_tree

        verify_tree(tree, target_probs=torch.ones(1, 2, 3) / 3)


def test_env_restored_after_import():
    assert os.environ.get("TRITON_INTERPRET") == _ENV_BEFORE


if not IN_PROCESS:  # Triton was imported here before without the interpreter: run this module in a fresh process
    rerun_in_fresh_process(globals(), interpret=True)
