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


def test_a_tree_servers_paths_are_read_per_request_and_checked_against_its_steps(record, tmp_path):
    import torch

    from sglang_kimi.speculative.acceptance_trace import append_paths

    trace = tmp_path / "paths.jsonl"
    rids = [record.rid_of(0), record.rid_of(1), record.rid_of(2)]
    # three steps: the verify's accepted nodes [bs, D+1] (the root, the path, -1 after)
    append_paths(str(trace), rids, 8, torch.tensor([[0, 1, 3], [0, 2, -1], [0, -1, -1]]))
    append_paths(str(trace), rids, 8, torch.tensor([[0, 1, -1], [0, 1, 5], [0, 4, -1]]))
    append_paths(str(trace), rids[:1], 8, torch.tensor([[0, -1, -1]]))  # a step past request 0's end (overlap)
    append_paths(str(trace), rids, 8, torch.tensor([[0, 9, 9]]), rank=1)  # another TP rank: nothing written
    assert [json.loads(line)["path"] for line in trace.read_text().splitlines()] == [
        [1, 3],
        [2],
        [],
        [1],
        [1, 5],
        [4],
        [],
    ]
    steps = [[2, 1], [1, 1], [0, 2]]  # request 2's second step accepted 2 in the stream, 1 in the trace
    paths = record.read_paths(trace, 4, [*steps, None])
    assert paths == [[[1, 3], [1]], [[2], [1, 5]], None, None]
    # the last step may have accepted more than the token limit let it commit
    assert record.read_paths(trace, 1, [[2, 0]]) == [[[1, 3], [1]]]
