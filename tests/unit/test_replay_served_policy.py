"""The served adaptive policy is the replayed one: the policy a DFLASH server builds (``dflash.start_adaptive`` ->
``start_runtime``) and the one ``bench/replay_adaptive.py`` builds, fed one recorded trace through the calls the
worker makes, choose the same width at every step.

``start_runtime``'s modules import SGLang's model runner, which needs the CPU import shims: the test runs in the
session's CPU SGLang child process (``cpu_sglang_child``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from support.repo_scripts import load_script

pytestmark = pytest.mark.cpu_sglang_child


@pytest.fixture(scope="module")
def replay():
    return load_script("bench/replay_adaptive.py")


def test_the_served_policy_decides_as_the_replayed_one(replay, tmp_path, monkeypatch):
    """The policy a DFLASH server builds (``dflash.start_adaptive`` -> ``start_runtime``, its profile measured by
    ``profile_step``, here the replay's profile) and the bench's, fed one recorded trace through the calls the
    worker makes (``choose``, ``start``, ``finish``), choose the same width at every step."""
    from sglang_kimi.settings import PluginArgs
    from sglang_kimi.speculative.adaptive import dflash, start

    sources = replay.default_sources(seed=1)
    h200 = {t.mode: t for t in replay.costs_from_serving()}

    for mode, source, widths in (
        ("chain", sources["matched/dflash-chain"], replay.CHAIN_WIDTHS),
        ("tree", sources["matched/dflash-tree"], tuple(w for w in replay.TREE_WIDTHS if w <= 8)),
    ):
        costs = h200[mode]
        profile = replay.profile_of(costs, widths, replay.BUCKETS, replay.NOISE["cpu"], seed=1)
        monkeypatch.setattr(dflash, "profile_step", lambda worker, b, w, repeats: profile[b][w])
        tp = SimpleNamespace(tp_group=SimpleNamespace(world_size=1, rank_in_group=0))
        monkeypatch.setattr(start, "get_parallel", lambda: tp)
        args = PluginArgs(adaptive=True, adaptive_profile=str(tmp_path / f"{mode}.json"), adaptive_widths=widths)
        server_args = SimpleNamespace(
            model_path=None, speculative_draft_model_path=None, tp_size=1, attention_backend="kimi_cpu",
            enable_metrics=False, max_running_requests=64, _sglang_kimi=args,
        )  # fmt: skip
        runner = SimpleNamespace(max_running_requests=64, dtype="torch.float32")
        worker = SimpleNamespace(
            server_args=server_args, device="cpu", target_worker=SimpleNamespace(model_runner=runner),
            tree_budget=None if mode == "chain" else max(widths), block_size=8,
        )  # fmt: skip
        served = dflash.start_adaptive(worker, args)
        served.clock = replay.ReplayClock(lag=0)

        class Worker:
            """The calls ``DFlashTreeWorker`` makes on its runtime around a step."""

            def __init__(self):
                self.decisions: list[int] = []

            def choose(self, batch):
                self.decisions.append(served.choose(batch))
                return self.decisions[-1]

            def observe(self, batch, width, accepted, seconds, paths=None):
                import torch

                started = served.start()
                served.clock.now += seconds
                nodes = None if paths is None else torch.tensor(replay.accepted_node_rows(paths))
                served.finish(started, batch, width, torch.tensor(accepted), nodes)

        server = Worker()
        bench = replay.Policy(replay.plugin_policy(source.family, widths, replay.BUCKETS, profile), lag=0)
        for contender in (server, bench):
            noise = replay.NoiseStream(replay.NOISE["cpu"], 1, costs(1, 0))
            replay.replay(contender, source, costs, noise, replay.ramp(48, 16))
        assert len(server.decisions) > 300 and len(set(server.decisions)) > 1
        assert server.decisions == bench.decisions, f"{mode}: the served policy chose differently"
