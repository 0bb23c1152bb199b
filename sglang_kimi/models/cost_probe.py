"""What each forward of a serving process costs, and how many distinct experts its MoE layers read: the step-cost
benchmark's view from inside the server (``bench/bench_step_cost.py``). Off unless ``SGLANG_KIMI_COST_PROBE=1`` is
set in the server's environment; off, each hook returns at once.

- **Forwards.** Every ``ModelRunner.forward`` (the target's model runner and the drafter's alike), and every replay
  of SGLang's EAGLE draft graph runners (which bypass it), is timed between two device synchronisations and summed
  by role (``target``, ``draft``) and forward mode (``decode``, ``target_verify``, ``extend``, ``draft_extend``,
  ...). The synchronisations put the device's time on the host's
  clock: a forward's seconds are its launch and its device time, and the next phase's launches no longer overlap it
  (a CUDA graph replay is one launch: little is lost). On a CPU there is nothing to wait for.
- **Experts.** Every ``select_experts`` (the MoE router's top-k) adds, on the device and without a synchronisation
  (so that a captured CUDA graph replays it), three numbers to the row of its token count: one call, the distinct
  routed experts its tokens chose, and the tokens that routed (rows SGLang masked as padding, id -1, do not). The
  key is the number of rows the router saw: under CUDA graphs the captured, padded batch size.

``/server_info`` → ``internal_states[i].sglang_kimi.cost_probe``::

    {"enabled": true, "device": "cuda:NVIDIA H200",
     "forwards": {"target": {"target_verify": {"count": 120, "seconds": 1.93}, ...}, "draft": {...}},
     "experts": {"routed_experts": 384, "top_k": 8,
                 "by_rows": {"72": {"calls": 7200, "distinct_sum": 1.4e6, "tokens_sum": 518400}, ...}}}

Reading the expert counts waits for the device once (outside any forward).
"""

from __future__ import annotations

import os
import threading
import time

import torch

ENV = "SGLANG_KIMI_COST_PROBE"
ENABLED = os.environ.get(ENV, "") == "1"
MAX_ROWS = 1 << 15  # token counts above this share the last row


class ForwardClock:
    """Seconds and counts of the model forwards of this process, by role and forward mode."""

    def __init__(self) -> None:
        self._cells: dict[tuple[str, str], list[float]] = {}
        self._lock = threading.Lock()
        self.device: str | None = None  # the profile's device name (platform/capabilities.device_name) of the forwards

    def add(self, role: str, mode: str, seconds: float) -> None:
        with self._lock:
            cell = self._cells.setdefault((role, mode), [0, 0.0])
            cell[0] += 1
            cell[1] += seconds

    def snapshot(self) -> dict:
        with self._lock:
            out: dict[str, dict] = {}
            for (role, mode), (count, seconds) in sorted(self._cells.items()):
                out.setdefault(role, {})[mode] = {"count": int(count), "seconds": seconds}
            return out


class ExpertCounter:
    """Device-side sums per router call size: [calls, distinct experts, routed tokens] in one row per size."""

    def __init__(self) -> None:
        self.sums: torch.Tensor | None = None  # [MAX_ROWS + 1, 3] int64, on the router's device
        self.routed_experts = 0
        self.top_k = 0

    def add(self, topk_ids: torch.Tensor, routed_experts: int, top_k: int) -> None:
        """``topk_ids`` [rows, slots]: expert ids, -1 for a padded row; ids >= ``routed_experts`` are shared-expert
        slots SGLang appends, not routed experts."""
        if self.sums is None or self.sums.device != topk_ids.device:
            self.sums = torch.zeros(MAX_ROWS + 1, 3, dtype=torch.int64, device=topk_ids.device)
        self.routed_experts, self.top_k = int(routed_experts), int(top_k)
        routed = (topk_ids >= 0) & (topk_ids < routed_experts)  # [rows, slots]
        slot = torch.where(routed, topk_ids, routed_experts).reshape(-1).long()  # [rows * slots]; misses -> spare slot
        hit = torch.zeros(routed_experts + 1, dtype=torch.int64, device=topk_ids.device)  # [experts + 1]
        hit.index_fill_(0, slot, 1)
        row = self.sums[min(int(topk_ids.shape[0]), MAX_ROWS)]  # [3]
        row[0] += 1
        row[1] += hit[:routed_experts].sum()
        row[2] += routed.any(dim=1).sum()

    def snapshot(self) -> dict:
        by_rows: dict[str, dict] = {}
        if self.sums is not None:
            sums = self.sums.cpu()  # one wait for the device
            for rows in torch.nonzero(sums[:, 0]).flatten().tolist():
                calls, distinct, tokens = sums[rows].tolist()
                by_rows[str(rows)] = {"calls": calls, "distinct_sum": distinct, "tokens_sum": tokens}
        return {"routed_experts": self.routed_experts, "top_k": self.top_k, "by_rows": by_rows}


forward_clock = ForwardClock()
expert_counter = ExpertCounter()


def _synchronize(device) -> None:
    if torch.device(device).type == "cuda" and not torch.cuda.is_current_stream_capturing():
        torch.cuda.synchronize()


def _timed_forward(original, runner, forward_batch, *args, **kwargs):
    """AROUND ``ModelRunner.forward`` and the EAGLE draft graph runners' ``execute`` (which replay without it): the
    forward between two synchronisations, on :data:`forward_clock`."""
    if not ENABLED or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        return original(runner, forward_batch, *args, **kwargs)
    model_runner = getattr(runner, "model_runner", runner)  # a graph runner's model runner
    if forward_clock.device is None:
        from sglang_kimi.platform.capabilities import device_name

        forward_clock.device = device_name(model_runner.device)
    _synchronize(model_runner.device)
    start = time.perf_counter()
    try:
        return original(runner, forward_batch, *args, **kwargs)
    finally:
        _synchronize(model_runner.device)
        role = "draft" if getattr(model_runner, "is_draft_worker", False) else "target"
        forward_clock.add(role, forward_batch.forward_mode.name.lower(), time.perf_counter() - start)


def _count_experts(result, hidden_states, router_logits, topk_config, *args, **kwargs):
    """AFTER ``select_experts``: the call's distinct routed experts on :data:`expert_counter`."""
    if ENABLED:
        topk_ids = result[1]  # StandardTopKOutput(topk_weights, topk_ids, router_logits, ...)
        routed = int(router_logits.shape[-1])
        expert_counter.add(topk_ids, routed, int(topk_config.top_k) - int(topk_config.num_shared_topk_slots))
    return result


def snapshot() -> dict:
    """The probe's sums, reported in ``/server_info``."""
    if not ENABLED:
        return {"enabled": False}
    return {
        "enabled": True,
        "device": forward_clock.device,
        "forwards": forward_clock.snapshot(),
        "experts": expert_counter.snapshot(),
    }


def install_forward_clock(target: str, *graph_runners: str):
    """Table entry ``kimi-cost-probe-forwards``: ``ModelRunner.forward`` and the draft graph runners' replays."""
    from sglang_kimi.hooks import hook

    for name in (target, *graph_runners):
        hook(name, _timed_forward, "AROUND")


def install_expert_counter(target: str):
    """Table entry ``kimi-cost-probe-experts``."""
    from sglang_kimi.hooks import hook

    hook(target, _count_experts, "AFTER")
