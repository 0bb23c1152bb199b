"""The cost probe (``sglang_kimi/models/cost_probe.py``): distinct routed experts per router call, padded rows and
shared-expert slots left out; forwards timed by role and mode; nothing recorded while it is off; and the CPU
stand-in of SGLang's simulated routing that the step-cost benchmark serves with."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_kimi.models import cost_probe
from sglang_kimi.models.kimi_shapes import expected_distinct_experts
from sglang_kimi.platform.cpu import cpu_path_fixes


def test_counts_distinct_routed_experts_per_call_size():
    counter = cost_probe.ExpertCounter()
    ids = torch.tensor([[0, 3], [3, 5], [-1, -1]], dtype=torch.int32)  # [rows, top_k]: the last row is padding
    counter.add(ids, routed_experts=8, top_k=2)
    counter.add(torch.tensor([[7, 7 + 1]]), routed_experts=8, top_k=2)  # id 8: a shared-expert slot, not routed
    snap = counter.snapshot()
    assert (snap["routed_experts"], snap["top_k"]) == (8, 2)
    assert snap["by_rows"] == {
        "3": {"calls": 1, "distinct_sum": 3, "tokens_sum": 2},
        "1": {"calls": 1, "distinct_sum": 1, "tokens_sum": 1},
    }
    counter.add(torch.tensor([[1, 2], [1, 2], [2, 1]]), routed_experts=8, top_k=2)
    assert counter.snapshot()["by_rows"]["3"] == {"calls": 2, "distinct_sum": 5, "tokens_sum": 5}


def test_hooks_record_only_when_enabled(monkeypatch):
    clock, counter = cost_probe.ForwardClock(), cost_probe.ExpertCounter()
    monkeypatch.setattr(cost_probe, "forward_clock", clock)
    monkeypatch.setattr(cost_probe, "expert_counter", counter)
    runner = SimpleNamespace(device="cpu", is_draft_worker=True)
    batch = SimpleNamespace(forward_mode=SimpleNamespace(name="TARGET_VERIFY"))
    output = (torch.ones(2, 2), torch.tensor([[1, 2], [3, 4]]), torch.zeros(2, 6))  # weights, ids, logits [rows, E]
    config = SimpleNamespace(top_k=2, num_shared_topk_slots=0)

    monkeypatch.setattr(cost_probe, "ENABLED", False)
    assert cost_probe._timed_forward(lambda r, b: "out", runner, batch) == "out"
    assert cost_probe._count_experts(output, hidden_states=None, router_logits=output[2], topk_config=config) is output
    assert clock.snapshot() == {} and counter.snapshot()["by_rows"] == {}
    assert cost_probe.snapshot() == {"enabled": False}

    monkeypatch.setattr(cost_probe, "ENABLED", True)
    for _ in range(3):
        cost_probe._timed_forward(lambda r, b: "out", runner, batch)
    cost_probe._count_experts(output, hidden_states=None, router_logits=output[2], topk_config=config)
    snap = cost_probe.snapshot()
    assert snap["device"].startswith("cpu:")
    assert snap["forwards"]["draft"]["target_verify"]["count"] == 3
    assert snap["forwards"]["draft"]["target_verify"]["seconds"] >= 0
    assert snap["experts"]["by_rows"]["2"] == {"calls": 1, "distinct_sum": 4, "tokens_sum": 2}


def test_a_failing_forward_is_still_timed(monkeypatch):
    clock = cost_probe.ForwardClock()
    monkeypatch.setattr(cost_probe, "forward_clock", clock)
    monkeypatch.setattr(cost_probe, "ENABLED", True)

    def broken(runner, batch):
        raise RuntimeError("forward failed")

    runner = SimpleNamespace(device="cpu", is_draft_worker=False)
    with pytest.raises(RuntimeError, match="forward failed"):
        cost_probe._timed_forward(broken, runner, SimpleNamespace(forward_mode=SimpleNamespace(name="DECODE")))
    assert clock.snapshot()["target"]["decode"]["count"] == 1


def test_a_draft_graph_runners_replay_counts_as_the_drafters(monkeypatch):
    clock = cost_probe.ForwardClock()
    monkeypatch.setattr(cost_probe, "forward_clock", clock)
    monkeypatch.setattr(cost_probe, "ENABLED", True)
    graph_runner = SimpleNamespace(model_runner=SimpleNamespace(device="cpu", is_draft_worker=True))
    batch = SimpleNamespace(forward_mode=SimpleNamespace(name="DRAFT_EXTEND"))
    cost_probe._timed_forward(lambda r, b, select_index: select_index, graph_runner, batch, select_index=3)
    assert clock.snapshot() == {"draft": {"draft_extend": {"count": 1, "seconds": pytest.approx(0, abs=1)}}}


def _original_is_not_called(*args, **kwargs):
    raise AssertionError("the Triton kernel was called for CPU tensors")


def test_uniform_simulated_routing_on_cpu_spreads_each_token_evenly():
    experts, k, tokens = 384, 8, 2000
    ids = torch.zeros(tokens, k, dtype=torch.int32)  # [tokens, k]
    weights = torch.zeros(tokens, k)  # [tokens, k]
    cpu_path_fixes._simulated_routing_in_torch(_original_is_not_called, ids, weights, experts, random=True, seed=3)
    assert all(len(set(row)) == k for row in ids.tolist())  # k distinct experts per token
    assert torch.allclose(weights, torch.full_like(weights, 1 / k))
    hits = torch.bincount(ids.flatten().long(), minlength=experts).float()  # [experts]
    assert hits.mean() == pytest.approx(tokens * k / experts)
    assert hits.std() < 0.35 * hits.mean()  # uniform: no expert far from its share
    for n in (1, 16, 72):  # the union of n tokens' experts, against the random-routing expectation
        unions = [len(set(ids[i : i + n].flatten().tolist())) for i in range(0, tokens - n, n)]
        assert sum(unions) / len(unions) == pytest.approx(expected_distinct_experts(experts, k, n), rel=0.05)


def test_round_robin_and_padding_on_cpu():
    ids, weights = torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 2)
    cpu_path_fixes._simulated_routing_in_torch(
        _original_is_not_called, ids, weights, 8, random=False, num_ranks=2, num_token_non_padded=torch.tensor(3)
    )
    # slot d = t * k + j goes to rank d % 2 and expert (d // 2) % 4 within it
    assert ids.tolist() == [[0, 4], [1, 5], [2, 6], [-1, -1]]
    assert weights[3].tolist() == [0.0, 0.0] and weights[0].tolist() == [0.5, 0.5]
