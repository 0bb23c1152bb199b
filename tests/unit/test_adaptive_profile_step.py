"""What a cell of the adaptive start-up profile times: the forwards of one real step of its width.

``profile_step`` of adaptive DFLASH and of adaptive EAGLE3 with SGLang's forwards replaced by recorders: a width
that drafts runs the drafter (DFLASH: one drafter pass over the block; EAGLE3: ``width - 1`` draft forwards), width 0
runs none, and every width verifies ``width + 1`` tokens per request (EAGLE3 then extends the drafter over them).
The timing itself is what ``fastest`` returns, so the test counts calls, not seconds.

The modules import SGLang's model runner, which needs the CPU import shims: the tests run in the session's CPU
SGLang child process (``cpu_sglang_child``).
"""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.cpu_sglang_child


BATCH = 3


@pytest.fixture
def calls(monkeypatch):
    """Every forward ``profile_step`` runs, in order: ("draft", ...), ("verify", window), ("extend", window)."""
    from sglang_kimi.speculative.adaptive import dflash, eagle, start

    log: list[tuple] = []

    def dummy_batch(runner, device, batch_size, extent):
        prefix = torch.full((batch_size,), 7)  # [bs]
        return torch.zeros(batch_size, dtype=torch.int64), prefix, prefix.clone()

    def verify_forward(runner, device, req_pool_indices, prefix, prefix_cpu, window, algorithm):
        log.append(("verify", window, prefix.shape[0]))

    def fastest(step, repeats, device):
        step()
        return 0.25

    for module in (dflash, start):
        monkeypatch.setattr(module, "dummy_batch", dummy_batch, raising=False)
        monkeypatch.setattr(module, "verify_forward", verify_forward, raising=False)
        monkeypatch.setattr(module, "fastest", fastest, raising=False)
    monkeypatch.setattr(dflash, "plan_dummy_window", lambda runner, device, rpi, prefix, prefix_cpu, n: n)
    monkeypatch.setattr(eagle, "_draft_context", lambda worker: nullcontext())
    monkeypatch.setattr(eagle, "draft_decode_forward", lambda w, bs, steps: log.append(("draft", steps, bs)))
    monkeypatch.setattr(eagle, "draft_extend_forward", lambda w, bs, window: log.append(("extend", window, bs)))
    return log


def dflash_worker(log):
    def draft_tree(batch, root, prefix, prefix_cpu, plan, width):
        log.append(("draft", width, root.shape[0], plan))

    runner = SimpleNamespace()
    return SimpleNamespace(target_worker=SimpleNamespace(model_runner=runner), device="cpu", block_size=8,
                           _draft_tree=draft_tree)  # fmt: skip


def test_a_dflash_cell_runs_the_drafter_only_when_it_drafts(calls):
    from sglang_kimi.speculative.adaptive import dflash

    worker = dflash_worker(calls)
    for width in (0, 1, 5, 16):
        calls.clear()
        assert dflash.profile_step(worker, BATCH, width, repeats=2) == 0.25
        verify = [("verify", width + 1, BATCH)]
        # a width that drafts: one drafter pass over the whole block (its KV plan: the block's 8 slots)
        assert calls == ([("draft", width, BATCH, 8)] if width else []) + verify, width


def test_an_eagle3_cell_runs_the_draft_forwards_of_its_width(calls, monkeypatch):
    from sglang.srt.environ import envs

    from sglang_kimi.speculative.adaptive import eagle

    activated = []
    worker = SimpleNamespace(target_worker=SimpleNamespace(model_runner=SimpleNamespace()), device="cpu",
                             adaptive_controller=SimpleNamespace(_activate=activated.append))  # fmt: skip
    skip_zero = envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.get()
    for width in (0, 1, 2, 4):
        calls.clear()
        assert eagle.profile_step(worker, BATCH, width, repeats=2) == 0.25
        draft = [("draft", width, BATCH)] if width > 1 else []  # width 1 drafts from the previous extend
        extend = [] if width == 0 and skip_zero else [("extend", width + 1, BATCH)]
        assert calls == draft + [("verify", width + 1, BATCH)] + extend, width
    assert activated == [0, 1, 2, 4]  # each cell in its width's runtime state
