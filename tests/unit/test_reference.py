"""The reference loop: speculative greedy output equals autoregressive output for every proposer and drafter,
perfect drafters reach tau = depth + 1, sampling is seeded and respects the sampler's filters."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.spec_helpers import random_tree, single_thread  # noqa: F401
from support.targets import TinyTarget, hf_target

from sglang_kimi.speculators.reference.loop import (
    ChainProposer,
    DDTreeProposer,
    DraftContext,
    EagleProposer,
    Proposal,
    causal_mask,
    generate,
    tree_verify_inputs,
)
from sglang_kimi.speculators.trees import DraftTree, build_chain
from sglang_kimi.speculators.verify import process_logits


def causal_logits(target, tokens: torch.Tensor) -> torch.Tensor:
    """Target logits [k, T, V] of token rows [k, T] under a plain causal mask."""
    k, length = tokens.shape
    positions = torch.arange(length).expand(k, length)
    return target(tokens, positions, causal_mask(length, tokens.device).expand(k, -1, -1)).logits


class AnswerDrafter:
    """Drafters that know the greedy answer ``full`` (prompt + autoregressive tokens), so they cost no target
    forward and are right, partly right, random or wrong on purpose; off the answer they propose noise.

    ``block(ctx, L)``: logits [L, V] (DFlash-style); ``step(ctx, paths [k, s+1])``: probs [k, V] (EAGLE-style).
    """

    def __init__(self, full: list[int], vocab: int, mode: str, seed: int) -> None:
        self.full, self.vocab, self.mode = full, vocab, mode
        self.gen = torch.Generator().manual_seed(seed)

    def _logits(self, answer: torch.Tensor, on_answer: torch.Tensor) -> torch.Tensor:
        noise = torch.randn((answer.shape[0], self.vocab), generator=self.gen)
        hit = torch.nn.functional.one_hot(answer, self.vocab).float() * on_answer[:, None]
        return {
            "perfect": 100.0 * hit,
            "noisy": 3.0 * hit + 2.0 * noise,
            "random": noise,
            "adversarial": noise - 1e4 * hit,  # the target's choice ranks last
        }[self.mode]

    def block(self, ctx: DraftContext, length: int) -> torch.Tensor:
        committed = len(ctx.tokens)
        assert ctx.tokens.tolist() == self.full[:committed], "decoding left the autoregressive answer"
        answer = torch.tensor(self.full[committed : committed + length])
        return self._logits(answer, torch.ones(length, dtype=torch.bool))

    def step(self, ctx: DraftContext, paths: torch.Tensor) -> torch.Tensor:
        sequences = [ctx.tokens[:-1].tolist() + path for path in paths.tolist()]
        on_answer = torch.tensor([seq == self.full[: len(seq)] for seq in sequences])
        answer = torch.tensor([self.full[len(seq)] if on else 0 for seq, on in zip(sequences, on_answer)])
        return torch.softmax(self._logits(answer, on_answer), dim=-1)


def model_step(drafter_model):
    """EAGLE-style step drafter from a (different) TinyTarget: its next-token law after context + path."""

    def step(ctx: DraftContext, paths: torch.Tensor) -> torch.Tensor:
        rows = torch.cat([ctx.tokens[:-1].expand(paths.shape[0], -1), paths], dim=1)
        return torch.softmax(causal_logits(drafter_model, rows)[:, -1], dim=-1)

    return step


def model_block(drafter_model):
    """DFlash-style block drafter from a TinyTarget: its next-token logits, repeated for every position."""
    return lambda ctx, length: causal_logits(drafter_model, ctx.tokens[None])[0, -1].expand(length, -1)


def make_proposer(kind: str, shape: tuple[int, ...], block, step):
    if kind == "eagle":
        num_steps, topk, num_draft_tokens = shape
        return EagleProposer(drafter=step, num_steps=num_steps, topk=topk, num_draft_tokens=num_draft_tokens)
    if kind == "chain":
        return ChainProposer(drafter=block, num_draft_tokens=shape[0])
    if kind == "stochastic_chain":
        return ChainProposer(drafter=block, num_draft_tokens=shape[0], sample=True, seed=shape[0])
    return DDTreeProposer(drafter=block, num_positions=shape[0], budget=shape[1])


SHAPES = {
    "chain": [(1,), (3,), (6,)],
    "stochastic_chain": [(2,), (4,)],
    "ddtree": [(3, 4), (4, 12), (6, 30)],
    "eagle": [(1, 1, 2), (3, 2, 5), (4, 3, 10)],
}
LONGEST = 6  # deepest draft above: the answer must reach past max_new_tokens by this much


@functools.cache
def autoregressive(target_seed: int, vocab: int, prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
    return generate(TinyTarget(vocab_size=vocab, seed=target_seed), prompt, max_new_tokens).tokens


# --------------------------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_tree_verify_logits_equal_causal_logits(data) -> None:
    """TinyTarget under a tree mask gives, at every node, the bits of a causal forward over prefix + path."""
    seed = data.draw(st.integers(0, 1000))
    target = TinyTarget(vocab_size=11, seed=seed, capture_layer_ids=(0, 1))
    prompt = torch.tensor(data.draw(st.lists(st.integers(0, 10), min_size=1, max_size=9)))
    tree = random_tree(torch.Generator().manual_seed(seed), 1, data.draw(st.integers(1, 9)), 11)
    tree.tokens[0, 0] = prompt[-1]
    out = target(*tree_verify_inputs(prompt, tree))
    for i in range(int(tree.num_nodes[0])):
        path = [i]
        while int(tree.parents[0, path[-1]]) > 0:
            path.append(int(tree.parents[0, path[-1]]))
        tokens = torch.cat([prompt, tree.tokens[0, path[::-1]]]) if i > 0 else prompt
        alone = target(tokens[None], torch.arange(tokens.shape[0])[None], causal_mask(tokens.shape[0], "cpu"))
        row = prompt.shape[0] - 1 + i
        assert torch.equal(out.logits[0, row], alone.logits[0, -1])
        assert torch.equal(out.hidden_states[0, row], alone.hidden_states[0, -1])


def test_tree_verify_inputs_example() -> None:
    tree = DraftTree.from_parents(torch.tensor([[2, 5, 6]]), torch.tensor([[-1, 0, 0]]))
    input_ids, positions, mask = tree_verify_inputs(torch.tensor([0, 1, 2]), tree)
    assert input_ids.tolist() == [[0, 1, 2, 5, 6]]
    assert positions.tolist() == [[0, 1, 2, 3, 3]]
    assert mask[0, 3].tolist() == [True, True, True, True, False]
    assert mask[0, 4].tolist() == [True, True, True, False, True]
    assert mask[0, :3].tolist() == causal_mask(5, "cpu")[0, :3].tolist()


@pytest.mark.parametrize("mode", ["perfect", "noisy", "random", "adversarial"])
@pytest.mark.parametrize("kind", list(SHAPES))
def test_greedy_equals_autoregressive(kind: str, mode: str) -> None:
    target = TinyTarget(vocab_size=16, seed=7)
    prompt, n = (3, 1, 4, 1, 5), 20
    expected = autoregressive(7, 16, prompt, n)
    full = list(prompt) + autoregressive(7, 16, prompt, n + LONGEST)
    for i, shape in enumerate(SHAPES[kind]):
        drafter = AnswerDrafter(full, 16, mode, seed=i)
        proposer = make_proposer(kind, shape, drafter.block, drafter.step)
        out = generate(target, prompt, n, proposer=proposer)
        assert out.tokens == expected, (kind, mode, shape)
        assert sum(out.accept_histogram) == len(proposer.accepted) == out.num_target_forwards - 1
        assert out.accept_histogram == [proposer.accepted.count(k) for k in range(len(out.accept_histogram))]
        depth = shape[0]
        if mode == "perfect":  # every step accepts the whole depth
            assert out.tau == depth + 1 and out.num_target_forwards == 1 + -(-(n - 1) // (depth + 1))
        if mode == "adversarial":
            assert out.tau == 1.0


def test_greedy_equals_autoregressive_with_model_drafters() -> None:
    target = TinyTarget(vocab_size=16, seed=7)
    prompt, n = (3, 1, 4, 1, 5), 16
    drafter_model = TinyTarget(vocab_size=16, seed=8)
    for kind in SHAPES:
        proposer = make_proposer(kind, SHAPES[kind][1], model_block(drafter_model), model_step(drafter_model))
        assert generate(target, prompt, n, proposer=proposer).tokens == autoregressive(7, 16, prompt, n)


@settings(max_examples=15, deadline=None)
@given(
    target_seed=st.integers(0, 50),
    vocab=st.sampled_from([5, 16, 40]),
    prompt=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    kind=st.sampled_from(list(SHAPES)),
    mode=st.sampled_from(["noisy", "random"]),
    shape_index=st.integers(0, 1),
)
def test_greedy_equals_autoregressive_random_targets(target_seed, vocab, prompt, kind, mode, shape_index):
    target = TinyTarget(vocab_size=vocab, seed=target_seed)
    full = prompt + autoregressive(target_seed, vocab, tuple(prompt), 12 + LONGEST)
    drafter = AnswerDrafter(full, vocab, mode, seed=target_seed)
    proposer = make_proposer(kind, SHAPES[kind][shape_index], drafter.block, drafter.step)
    assert generate(target, prompt, 12, proposer=proposer).tokens == autoregressive(
        target_seed, vocab, tuple(prompt), 12
    )


def test_hidden_states_reach_the_proposer() -> None:
    """DraftContext.hidden_states = the target's captured features of every committed token but the root."""
    target = TinyTarget(vocab_size=16, seed=3, capture_layer_ids=(1, 0))
    seen = []

    def drafter(ctx: DraftContext, length: int) -> torch.Tensor:
        seen.append((ctx.tokens.clone(), ctx.hidden_states.clone()))
        return model_block(target)(ctx, length)

    generate(target, [1, 2, 3], 16, proposer=DDTreeProposer(drafter=drafter, num_positions=3, budget=6))
    assert len(seen) > 2
    for tokens, hidden in seen:
        full = target(tokens[None, :-1], torch.arange(len(tokens) - 1)[None], causal_mask(len(tokens) - 1, "cpu"))
        assert hidden.shape == (len(tokens) - 1, 32)
        assert torch.equal(hidden, full.hidden_states[0])


def test_sampling_is_seeded_and_respects_top_k() -> None:
    """Every sampled token lies in the target's top-2 at its prefix: rows are aligned in the sampled path too."""
    target = TinyTarget(vocab_size=16, seed=5)
    prompt = [1, 2, 3]
    for kind, shape in [("ddtree", (4, 10)), ("stochastic_chain", (3,)), ("eagle", (3, 2, 6)), ("chain", (3,))]:
        runs = []
        for seed in (0, 0, 1):
            proposer = make_proposer(kind, shape, model_block(target), model_step(target))
            out = generate(target, prompt, 16, proposer=proposer, temperature=1.3, top_k=2, seed=seed)
            runs.append(out.tokens)
        assert max(proposer.accepted) >= 1
        assert runs[0] == runs[1] and runs[0] != runs[2]
        tokens = torch.tensor(prompt + runs[0])
        probs = process_logits(causal_logits(target, tokens[None])[0], 1.3, top_k=2)  # [T, V]
        assert (probs[len(prompt) - 1 : -1].gather(1, tokens[len(prompt) :, None]) > 0).all()


def test_proposal_root_must_be_the_last_token() -> None:
    class WrongRoot:
        def propose(self, context: DraftContext) -> Proposal:
            return Proposal(build_chain(context.tokens[-1:] + 1, torch.tensor([[0]])))

        def update(self, result) -> None:
            raise AssertionError("never reached")

    with pytest.raises(ValueError):
        generate(TinyTarget(vocab_size=8), [1, 2], 4, proposer=WrongRoot())


def test_hf_target_adapter() -> None:
    """A transformers Llama scores a tree in one forward like it scores each path alone; greedy DDTree decoding
    through the adapter equals autoregressive decoding."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).double().eval()
    target = hf_target(model, capture_layer_ids=(0,))
    prompt = torch.tensor([5, 9, 2, 7])
    tree = DraftTree.from_parents(torch.tensor([[7, 1, 2, 3, 4]]), torch.tensor([[-1, 0, 0, 1, 2]]))
    out = target(*tree_verify_inputs(prompt, tree))
    assert out.hidden_states.shape == (1, 3 + 5, 32)
    # Not float64-exact: transformers' eager attention takes its softmax in float32 (softmax(..., dtype=float32))
    # even in a float64 model, so the tree and per-path forwards (other lengths, masked columns) differ by ~1e-7
    # relative in the attention weights: a few 1e-8 on these O(0.3) logits (1e-8 measured). A wrong tree mask
    # (a sibling seen, a parent hidden, the block transposed) moves them by > 3e-2, a position off by one by 2.6e-4.
    for node, path in [(1, [1]), (3, [1, 3]), (4, [2, 4])]:
        tokens = torch.cat([prompt, tree.tokens[0, path]])
        alone = target(tokens[None], torch.arange(len(tokens))[None], causal_mask(len(tokens), "cpu"))
        torch.testing.assert_close(out.logits[0, 3 + node], alone.logits[0, -1], rtol=0, atol=1e-6)
        torch.testing.assert_close(out.hidden_states[0, 3 + node], alone.hidden_states[0, -1], rtol=0, atol=1e-6)
    expected = generate(target, prompt, 10).tokens
    proposer = DDTreeProposer(drafter=model_block(target), num_positions=3, budget=8)
    out = generate(target, prompt, 10, proposer=proposer)
    assert out.tokens == expected and out.tau > 1
