"""Custom logit processors in the speculative verify (``speculative/workers/custom_processors.py``): every node's row
equals what
the processor gives a non-speculative step whose request holds the committed outputs and the drafts on the node's
path, for processors that read the request's output so far."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from support.processors import processor
from support.spec_helpers import path_to_root, random_tree

from sglang_kimi.speculative.workers.custom_processors import (
    RequestAtNode,
    apply_processors,
    exact_step,
    held_back,
    in_exact_step,
)
from sglang_kimi.speculators.trees import DraftTree

VOCAB = 16
PROMPT = [3, 4, 5]


def request(output_ids: list[int]):
    return SimpleNamespace(origin_input_ids=list(PROMPT), output_ids=list(output_ids), rid="r")


def batch_of(tree: DraftTree, processed: dict[int, tuple[str, dict]], layout: str):
    """The sampling info of a batch of ``tree.batch_size`` requests, each with committed outputs ending in its root;
    ``processed``: request -> (processor name, custom_params). ``layout``: SGLang's processor table, ``rows`` (0.5.22
    and later) or ``mask`` (0.5.20 and 0.5.21)."""
    batch = tree.batch_size
    reqs = [request([7, int(tree.tokens[b, 0])]) for b in range(batch)]
    params = [None] * batch
    groups: dict[str, list[int]] = {}
    for b, (name, custom) in processed.items():
        params[b] = {**custom, "__req__": reqs[b]}
        groups.setdefault(name, []).append(b)
    table = {}
    for name, rows in groups.items():
        if layout == "rows":
            table[name] = SimpleNamespace(processor=processor(name)(), rows=rows, indices=torch.tensor(rows))
        else:
            table[name] = (processor(name)(), torch.tensor([b in rows for b in range(batch)]))
    info = SimpleNamespace(has_custom_logit_processor=bool(table), custom_logit_processor=table, custom_params=params)
    return info, reqs


def non_speculative_rows(logits: torch.Tensor, tree: DraftTree, processed, reqs) -> torch.Tensor:
    """The oracle: each real node's row processed alone, with a request whose outputs are the committed ones and
    then the drafts from the root down to the node (walked up the parent list by ``path_to_root``)."""
    n = tree.num_slots
    out = logits.clone()
    for b, (name, custom) in processed.items():
        parents = tree.parents[b].tolist()
        for i in range(int(tree.num_nodes[b])):
            path = [int(tree.tokens[b, node]) for node in reversed(path_to_root(parents, i)[:-1])]  # root left out
            seen = request(reqs[b].output_ids + path)
            row = logits[b * n + i : b * n + i + 1].clone()
            out[b * n + i] = processor(name)()(row, [{**custom, "__req__": seen}])[0]
    return out


PROCESSED = {0: ("NoRepeat", {}), 2: ("ForceAfter", {"after": 4, "token": 9}), 3: ("NoRepeat", {})}


@pytest.mark.parametrize("layout", ["rows", "mask"])
@pytest.mark.parametrize("seed", range(6))
def test_each_node_is_processed_with_its_own_output(seed: int, layout: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    tree = random_tree(gen, batch=4, slots=7, vocab=VOCAB)
    logits = torch.randn(tree.batch_size * tree.num_slots, VOCAB, generator=gen)  # [B * N, V]
    info, reqs = batch_of(tree, PROCESSED, layout)
    expected = non_speculative_rows(logits, tree, PROCESSED, reqs)

    got = logits.clone()
    apply_processors(got, info, tree)
    valid = tree.valid().reshape(-1)
    assert torch.equal(got[valid], expected[valid])
    unprocessed = torch.arange(tree.num_slots) + 1 * tree.num_slots  # request 1 has no processor
    assert torch.equal(got[unprocessed], logits[unprocessed])
    assert [r.output_ids for r in reqs] == [[7, int(tree.tokens[b, 0])] for b in range(4)], "requests were changed"


def test_the_oracle_tells_the_committed_outputs_from_the_node_s() -> None:
    """What SGLang's DFLASH verify did, every row processed with the committed outputs, is not the oracle's
    answer on a chain of repeated drafts: the test above can fail."""
    tree = DraftTree.from_parents(torch.tensor([[2, 6, 6, 6]]), torch.tensor([[-1, 0, 1, 2]]))
    logits = torch.zeros(4, VOCAB)
    processed = {0: ("NoRepeat", {})}
    info, reqs = batch_of(tree, processed, "rows")
    expected = non_speculative_rows(logits, tree, processed, reqs)
    committed_only = processor("NoRepeat")()(logits.clone(), [info.custom_params[0]] * 4)
    assert not torch.equal(committed_only, expected)
    got = logits.clone()
    apply_processors(got, info, tree)
    assert torch.equal(got, expected)
    assert got[1:, 6].eq(float("-inf")).all() and got[0, 2] == float("-inf")  # after a 6, never 6; after the root 2


def test_a_batch_without_processors_is_left_alone() -> None:
    tree = DraftTree.from_parents(torch.tensor([[2, 6]]), torch.tensor([[-1, 0]]))
    logits = torch.randn(2, VOCAB)
    info, _ = batch_of(tree, {}, "rows")
    got = logits.clone()
    apply_processors(got, info, tree)
    apply_processors(got, None, tree)
    assert torch.equal(got, logits)


def test_params_without_a_request_are_passed_as_they_are() -> None:
    seen = []

    class Recorder:
        def __call__(self, logits, params):
            seen.extend(params)
            return logits

    tree = DraftTree.from_parents(torch.tensor([[2, 6]]), torch.tensor([[-1, 0]]))
    info = SimpleNamespace(
        has_custom_logit_processor=True,
        custom_logit_processor={"r": SimpleNamespace(processor=Recorder(), rows=[0], indices=torch.tensor([0]))},
        custom_params=[{"k": 1}],
    )
    apply_processors(torch.zeros(2, VOCAB), info, tree)
    assert seen == [{"k": 1}, {"k": 1}]


def test_request_at_node_shows_the_request_with_the_path() -> None:
    req = request([7, 2])
    view = RequestAtNode(req, [6, 8])
    assert view.output_ids == [7, 2, 6, 8] and view.origin_input_ids == PROMPT and view.rid == "r"
    assert req.output_ids == [7, 2]


def test_sglang_s_own_application_is_held_back_only_inside_a_step() -> None:
    info = SimpleNamespace(has_custom_logit_processor=True)
    with held_back(info):
        assert info.has_custom_logit_processor  # outside a DFLASH step: SGLang's path (DSPARK, say) is untouched
    assert not in_exact_step()
    with exact_step():
        assert in_exact_step()
        with held_back(info):
            assert not info.has_custom_logit_processor
        assert info.has_custom_logit_processor
        with pytest.raises(RuntimeError), held_back(info):
            raise RuntimeError("a failing verify")
        assert info.has_custom_logit_processor
    assert not in_exact_step()
