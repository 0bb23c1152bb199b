"""``scripts/record_acceptance.py`` reads each decode step's accepted drafts from a streamed response (its servers run
only when the script runs): one chunk per step, checked against SGLang's step count and histogram, the last step's
length from the histogram, and a response whose chunks were coalesced left out rather than guessed."""

from __future__ import annotations

import json

import pytest
from support.repo_scripts import load_script

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def record():
    return load_script("scripts/record_acceptance.py")


def stream(tokens: list[int], verify_ct: int, histogram: list[int]) -> list[str]:
    """The ``data:`` lines of a streamed ``/generate`` answer whose chunks carry ``tokens`` committed so far, SGLang's
    counters on the last one."""
    lines = [f"data: {json.dumps({'meta_info': {'completion_tokens': n}, 'output_ids': [0] * n})}" for n in tokens]
    last = {"completion_tokens": tokens[-1], "spec_verify_ct": verify_ct, "spec_correct_drafts_histogram": histogram}
    lines[-1] = f"data: {json.dumps({'meta_info': last, 'output_ids': [0] * tokens[-1]})}"
    return ["", *lines, "data: [DONE]"]


def test_each_chunk_after_the_first_is_one_step_and_the_last_one_is_completed_from_the_histogram(record):
    # the prefill's token, then steps of 2, 2, 6, 8 and 1 new tokens; the last step accepted 5 drafts, of which the
    # request's 20-token limit kept none
    steps, ids = record.parse_stream(stream([1, 3, 5, 11, 19, 20], 5, [0, 2, 0, 0, 0, 2, 0, 1]))
    assert steps == [1, 1, 5, 7, 5] and len(ids) == 20


def test_coalesced_chunks_are_left_out_not_guessed(record):
    # two steps (2 and 6 new tokens) arrived as one chunk of 8: four chunks for five steps
    steps, _ = record.parse_stream(stream([1, 3, 11, 19, 20], 5, [0, 2, 0, 0, 0, 2, 0, 1]))
    assert steps is None
    # the counts agree but a length does not: also left out
    assert record.steps_of([1, 2, 4], {"spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 0, 2]}) is None


def test_an_error_event_is_an_error(record):
    with pytest.raises(RuntimeError, match="error"):
        record.parse_stream(['data: {"error": {"message": "boom"}}'])


def test_the_configurations_and_the_file_format(record):
    configs = record.configurations()
    assert configs["matched/dflash-chain"]["width"] == 7 and configs["eagle3/chain"]["family"] == "chain"
    assert sorted(c["width"] for n, c in configs.items() if n.startswith("mismatched/dflash-tree")) == [2, 4, 8, 16, 32]
    data = {"format": record.FORMAT, "traces": {"x": {"requests": [[1, 2, 3], None], "args": ["a"]}}}
    text = record.dump(data)
    assert json.loads(text) == data and "[1,2,3]" in text
