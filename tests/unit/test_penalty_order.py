"""SGLang's penalizers applied in one order in every process: additive first, scaling last
(``sglang_kimi/speculative/workers/penalty_hooks.py``)."""

import itertools

import pytest
from sglang.srt.sampling import penaltylib
from sglang.srt.sampling.penaltylib.orchestrator import BatchedPenalizerOrchestrator

from sglang_kimi.speculative.workers.penalty_hooks import _additive_then_scaling

PENALIZERS = (
    penaltylib.BatchedFrequencyPenalizer,
    penaltylib.BatchedMinNewTokensPenalizer,
    penaltylib.BatchedPresencePenalizer,
    penaltylib.BatchedRepetitionPenalizer,
)


class Batch:  # the orchestrator keeps a weak reference to its batch
    reqs: list = []
    device = "cpu"


@pytest.mark.parametrize("given", list(itertools.permutations(PENALIZERS)))
def test_every_construction_order_gives_additive_first_and_scaling_last(given):
    batch = Batch()
    orchestrator = BatchedPenalizerOrchestrator(vocab_size=8, batch=batch, penalizers=dict.fromkeys(given))
    _additive_then_scaling(None, orchestrator)
    order = [cls.__name__ for cls in orchestrator.penalizers]
    assert order == [
        "BatchedFrequencyPenalizer",
        "BatchedMinNewTokensPenalizer",
        "BatchedPresencePenalizer",
        "BatchedRepetitionPenalizer",
    ]
    assert all(orchestrator.penalizers[cls].orchestrator is orchestrator for cls in given)  # the same instances
