"""The DFLASH tree step under SGLang's overlap scheduler (``dflash_tree._record_scheduler_tensors``): every batch tensor
SGLang's own DFLASH chain records on the forward stream is recorded by the tree step too, and every batch attribute
the tree step rebinds is recorded after the rebind or restored. The recording itself is a CUDA call; here the
tensors handed to SGLang's ``record_stream_each`` are observed."""

from __future__ import annotations

import inspect
import re
from types import SimpleNamespace as NS

import pytest
import torch

pytestmark = pytest.mark.cpu_sglang_child

RESTORED = {"seq_lens_cpu", "seq_lens_sum"}  # host values the verify set-up changes and puts back
NOT_TENSORS = {"spec_info", "forward_mode"}  # objects, not device memory


def _batch_attributes_assigned(source: str) -> set[str]:
    return set(re.findall(r"\bbatch\.(\w+)\s*=(?!=)", source)) | {
        name for names in re.findall(r"\bbatch\.(\w+)\s*,\s*batch\.(\w+)\s*=(?!=)", source) for name in names
    }


def test_the_tree_step_records_what_sglangs_chain_records():
    from sglang.srt.speculative import dflash_worker_v2, spec_utils

    from sglang_kimi.speculative.workers import dflash_tree

    chain = set(re.findall(r"\bbatch\.(\w+)\.record_stream\(", inspect.getsource(dflash_worker_v2)))
    assert "seq_lens" in chain  # SGLang's chain still records its carried-over lengths
    eagle = set(re.findall(r"\bbatch\.(\w+)", inspect.getsource(spec_utils.record_stream_for_v2_verify)))
    assert chain | eagle <= set(dflash_tree.RECORDED_BATCH_TENSORS)


def test_what_the_tree_step_rebinds_is_recorded_or_restored():
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    from sglang_kimi.speculative.workers import dflash_tree

    rebound = _batch_attributes_assigned(inspect.getsource(dflash_tree.DFlashTreeWorker))
    rebound |= _batch_attributes_assigned(inspect.getsource(DFlashVerifyInput.prepare_for_verify))
    assert {"out_cache_loc", "input_ids", "seq_lens_cpu"} <= rebound  # the parse still sees the step's rebinds
    unhandled = rebound - set(dflash_tree.RECORDED_BATCH_TENSORS) - RESTORED - NOT_TENSORS
    # attributes SGLang's verify set-up sets only on other devices or models (NPU, mamba) are not the tree's
    unhandled = {name for name in unhandled if not re.search(r"dsv4|mamba", name)}
    assert not unhandled, f"rebound by the tree step, neither recorded nor restored: {sorted(unhandled)}"
    source = inspect.getsource(dflash_tree.DFlashTreeWorker._verify_inputs)
    assert "batch.seq_lens_cpu, batch.seq_lens_sum = saved_cpu, saved_sum" in source


def test_the_recorded_tensors_are_the_batchs(monkeypatch):
    from sglang_kimi.speculative.workers import dflash_tree

    seen = []
    monkeypatch.setattr(dflash_tree, "record_stream_each", lambda tensors, stream: seen.append((list(tensors), stream)))
    tensors = {name: torch.zeros(3) for name in dflash_tree.RECORDED_BATCH_TENSORS}
    bonus = torch.zeros(3, dtype=torch.long)
    batch = NS(**tensors, spec_info=NS(bonus_tokens=bonus))
    stream = object()
    assert dflash_tree._record_scheduler_tensors(batch, stream) is stream
    ((recorded, on),) = seen
    assert on is stream and all(any(t is r for r in recorded) for t in [*tensors.values(), bonus])
    seen.clear()
    assert dflash_tree._record_scheduler_tensors(batch) is None and not seen  # CPU tensors: nothing to record
