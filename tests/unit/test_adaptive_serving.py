"""The serving side of adaptive speculation without a server: the settings file, the cost-profile file and the
runtime that asks and feeds the policy (the policy itself: test_policy.py)."""

import json
import logging
import time

import pytest
import torch

from sglang_kimi.errors import SpeculativeConfigError
from sglang_kimi.speculative.adaptive.config import (
    AdaptiveConfig,
    AdaptiveConfigError,
    default_buckets,
    default_tree_widths,
    load_adaptive_config,
    resolve_widths,
)
from sglang_kimi.speculative.adaptive.profile import FORMAT, load_or_measure, read_profile, unwritable, write_profile
from sglang_kimi.speculative.adaptive.runtime import AdaptiveRuntime
from sglang_kimi.speculators.policy import ChainAcceptance, CostTable, WidthPolicy

pytestmark = pytest.mark.unit


def _write(tmp_path, text, name="policy.json"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_settings_file_round_trip(tmp_path):
    settings = {"widths": [0, 2, 5], "buckets": [1, 8], "explore_every": 4, "explore_budget": 1, "hysteresis": 0}
    config = load_adaptive_config(_write(tmp_path, json.dumps(settings)))
    assert config.widths == (0, 2, 5) and config.buckets == (1, 8)
    assert config.explore_every == 4 and config.explore_budget == 1.0 and config.hysteresis == 0.0
    assert AdaptiveConfig().explore_budget is None  # the policy's default, 0.2 / explore_every
    assert config.cost_decay == AdaptiveConfig().cost_decay  # unset keys keep their defaults
    assert load_adaptive_config(None) == AdaptiveConfig()


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"widths": [0, 1,', ["not valid JSON"]),
        ("[0, 1]", ["JSON object"]),
        ('{"width": [0, 1]}', ["unknown setting(s) width", "widths"]),
        ('{"widths": []}', ["'widths'", "non-empty list"]),
        ('{"widths": [0, 1.5]}', ["'widths'", "integers"]),
        ('{"widths": [0, 2, 2]}', ["distinct"]),
        ('{"buckets": [0, 4]}', ["'buckets'", ">= 1"]),
        ('{"explore_every": 1}', ["'explore_every' must be >= 2"]),
        ('{"explore_every": true}', ["'explore_every' must be an integer"]),
        ('{"hysteresis": 1.0}', ["'hysteresis' must be in [0, 1)"]),
        ('{"explore_budget": 1.5}', ["'explore_budget' must be in [0, 1]"]),
        ('{"explore_budget": "all"}', ["'explore_budget' must be a number"]),
        ('{"cost_decay": 0}', ["'cost_decay' must be in (0, 1]"]),
        ('{"profile_repeats": 0}', ["'profile_repeats' must be >= 1"]),
    ],
)
def test_each_bad_settings_file_is_one_clear_error(tmp_path, text, words):
    path = _write(tmp_path, text)
    with pytest.raises(AdaptiveConfigError) as error:
        load_adaptive_config(path)
    message = str(error.value)
    assert path in message and all(w in message for w in words), message
    assert isinstance(error.value, SpeculativeConfigError)  # printed as a start-up error, without a traceback


def test_an_unreadable_settings_file_names_the_path(tmp_path):
    with pytest.raises(AdaptiveConfigError, match="cannot read"):
        load_adaptive_config(str(tmp_path / "missing.json"))


def test_widths_and_buckets_resolve():
    assert resolve_widths(AdaptiveConfig(), 7, "drafts") == tuple(range(8))
    assert resolve_widths(AdaptiveConfig(widths=(5, 0, 2)), 7, "drafts") == (0, 2, 5)
    with pytest.raises(AdaptiveConfigError, match=r"\[9\].*\(7\)"):
        resolve_widths(AdaptiveConfig(widths=(0, 9)), 7, "drafts")
    with pytest.raises(AdaptiveConfigError, match="initial_width 3"):
        resolve_widths(AdaptiveConfig(widths=(0, 2), initial_width=3), 7, "drafts")
    with pytest.raises(AdaptiveConfigError, match="initial_width 3"):
        resolve_widths(AdaptiveConfig(initial_width=3), 32, "budget", default_tree_widths(32))
    assert default_tree_widths(32) == (0, 1, 2, 4, 8, 16, 32)
    assert default_tree_widths(12) == (0, 1, 2, 4, 8, 12)
    assert default_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    assert default_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert default_buckets(1) == (1,)


KEY = {"device": "cuda:NVIDIA H100", "model": "/m", "tp_size": 8, "widths": [0, 1], "buckets": [1, 4]}


def test_a_profile_is_reused_only_for_its_own_setup(tmp_path, caplog):
    path = tmp_path / "profile.json"
    write_profile(path, KEY, {1: {0: 0.01, 1: 0.02}, 4: {0: 0.03, 1: 0.05}})
    assert json.loads(path.read_text())["format"] == FORMAT
    assert read_profile(path, KEY).table == {1: {0: 0.01, 1: 0.02}, 4: {0: 0.03, 1: 0.05}}
    with caplog.at_level(logging.WARNING, logger="sglang_kimi"):
        assert read_profile(path, {**KEY, "tp_size": 4}) is None
        assert read_profile(path, {**KEY, "device": "cuda:NVIDIA H200"}) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "another setup" in lines[0] and "tp_size: 8 (file) vs 4 (this server)" in lines[0]
    assert "H100" in lines[1] and "H200" in lines[1]


def test_a_stale_or_corrupt_profile_is_measured_afresh_and_replaced(tmp_path, caplog):
    path = tmp_path / "profile.json"
    calls = []

    def step(batch, width):
        calls.append((batch, width))
        return 0.001 * batch * (width + 1)

    write_profile(path, {**KEY, "model": "/another"}, {1: {0: 9.0, 1: 9.0}})
    with caplog.at_level(logging.INFO, logger="sglang_kimi"):
        saved, file, measured = load_or_measure(str(path), KEY, [1, 4], [0, 1], step)
    assert measured and file == path and sorted(calls) == [(1, 0), (1, 1), (4, 0), (4, 1)]
    assert saved.table[4][1] == pytest.approx(0.008) and saved.measured == {}
    assert any("another setup" in r.getMessage() and "/another" in r.getMessage() for r in caplog.records)
    assert any("profiled batch 4 (2/2 buckets" in r.getMessage() for r in caplog.records)  # progress per bucket
    calls.clear()
    saved, _, measured = load_or_measure(str(path), KEY, [1, 4], [0, 1], step)  # a restart: reused, not measured
    assert not measured and not calls and saved.table[4][1] == pytest.approx(0.008)
    path.write_text("{not json")
    _, _, measured = load_or_measure(str(path), KEY, [1, 4], [0, 1], step)
    assert measured and read_profile(path, KEY) is not None


def test_a_profile_file_that_cannot_be_written_is_named(tmp_path):
    """The start-up check of a --speculative-kimi-adaptive-profile file: a folder, a path under a file and a path on
    a read-only mount are refused with the reason; a new file in a new folder is fine and the check leaves nothing
    in it but the folder."""
    assert unwritable(tmp_path / "new" / "deeper" / "profile.json") is None
    assert [p.name for p in (tmp_path / "new" / "deeper").iterdir()] == []
    assert "is a folder: name a file in it" in unwritable(tmp_path)
    (tmp_path / "file").write_text("")
    assert f"{tmp_path / 'file'} is a file, not a folder" in unwritable(tmp_path / "file" / "sub" / "profile.json")
    assert "cannot be written" in unwritable("/proc/sglang-kimi-profile.json")  # root is refused there too
    write_profile(tmp_path / "file" / "profile.json", KEY, {1: {0: 0.01}})  # the serving side only warns


def test_the_real_steps_costs_are_saved_and_a_restart_starts_from_them(tmp_path):
    """A serving server saves its measured cost table into the profile file (at most every ``save_every``
    seconds); the next start on the same setup reads it back, and the restored cells stand in for the profile
    until this server's own steps outweigh them."""
    path = tmp_path / "profile.json"
    profiled = {1: {0: 0.01, 2: 0.02}, 8: {0: 0.02, 2: 0.05}}
    saved, _, _ = load_or_measure(str(path), KEY, [1, 8], [0, 2], lambda b, w: profiled[b][w])
    costs = CostTable()
    for b, row in saved.table.items():
        for w, seconds in row.items():
            costs.set(b, w, seconds)
    policy = WidthPolicy([0, 2], [1, 8], ChainAcceptance(2), costs, explore_every=4)
    writes = []

    def save(cells):
        writes.append(cells)
        write_profile(path, KEY, saved.table, cells, created=saved.created)

    runtime = AdaptiveRuntime(policy, "test", "cpu", prometheus=False, clock=SteppedClock(), save=save, save_every=0)
    for _ in range(40):
        width = runtime.choose(8)
        start = runtime.start()
        runtime.clock.now += 3 * profiled[8][width]  # real steps take 3x the profile
        runtime.finish(start, 8, width, torch.tensor([width] * 8))
    assert len(writes) == 40 and runtime.snapshot()["profile"]["measured_saved"]
    on_disk = json.loads(path.read_text())
    assert on_disk["created"] == saved.created and "updated" in on_disk

    restart, _, measured = load_or_measure(str(path), KEY, [1, 8], [0, 2], lambda b, w: 1 / 0)  # not profiled again
    assert not measured and restart.table == saved.table
    assert set(restart.measured) == {8} and restart.measured[8][2][0] == pytest.approx(3 * 0.05)
    fresh = CostTable()
    for b, row in restart.table.items():
        for w, seconds in row.items():
            fresh.set(b, w, seconds)
    for b, row in restart.measured.items():
        for w, (seconds, steps) in row.items():
            fresh.restore(b, w, seconds, steps)
    assert fresh.seconds(8, 2) == pytest.approx(0.15) and fresh.seconds(8, 0) == pytest.approx(0.06)
    assert fresh.calibration(1) == pytest.approx(3.0, rel=0.01)  # bucket 1 never ran: scaled by what bucket 8 saw
    for _ in range(60):  # the traffic changed after the restart: this server's steps take over
        fresh.observe(8, 2, 0.10)
    assert fresh.seconds(8, 2) == pytest.approx(0.10, rel=0.05)


def test_a_slow_save_interval_writes_once_per_interval():
    writes = []
    runtime = _runtime(save=writes.append, save_every=0.5)
    for _ in range(50):
        width = runtime.choose(1)
        start = runtime.start()
        runtime.clock.now += cost(1, width)
        runtime.finish(start, 1, width, torch.tensor([width]))
    assert writes == []  # nothing before the interval has passed (the test's steps take no wall time)
    time.sleep(0.6)
    runtime.drain()  # nothing new folded in since: no write
    assert writes == []
    runtime.finish(runtime.start(), 1, 0, torch.tensor([0]))
    assert len(writes) == 1 and set(writes[0]) == {1}


def test_the_default_profile_file_is_one_per_setup(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _, a, _ = load_or_measure(None, KEY, [1], [0], lambda b, w: 0.1)
    _, b, _ = load_or_measure(None, {**KEY, "tp_size": 2}, [1], [0], lambda b, w: 0.1)
    assert a != b and a.parent == b.parent == tmp_path / "sglang-kimi" / "cost-profiles"


class SteppedClock:
    """A clock the test advances by the step's synthetic cost."""

    cuda = False

    def __init__(self):
        self.now = 0.0

    def mark(self):
        return self.now

    def ready(self, end):
        return True

    @staticmethod
    def seconds(start, end):
        return end - start


def cost(batch, width):
    return 0.010 + 0.001 * width if batch == 1 else 0.020 + 0.030 * width  # verify grows with tokens at batch 8


def _runtime(widths=(0, 1, 2, 3), explore_every=20, **kwargs):
    costs = CostTable()
    for w in widths:
        for b in (1, 8):
            costs.set(b, w, 0.5 * cost(b, w))  # a start-up profile off by 2x: the steps' timings correct it
    policy = WidthPolicy(list(widths), [1, 8], ChainAcceptance(max(widths)), costs, explore_every=explore_every)
    return AdaptiveRuntime(policy, "test", "cpu", prometheus=False, clock=SteppedClock(), **kwargs)


def test_runtime_learns_from_the_steps_and_logs_each_change_once(caplog):
    runtime = _runtime()
    with caplog.at_level(logging.INFO, logger="sglang_kimi"):
        for _ in range(300):
            for batch in (1, 8):
                width = runtime.choose(batch)
                start = runtime.start()
                runtime.clock.now += cost(batch, width)
                accepted = torch.tensor([min(width, 2)] * batch)  # two drafts always accepted, the third never
                runtime.finish(start, batch, width, accepted)
    snap = runtime.snapshot()
    assert snap["buckets"]["1"]["width"] == 2  # cheap verify: stop where acceptance stops
    assert snap["buckets"]["8"]["width"] == 0  # expensive verify: 2 tokens for 2.5x the cost do not pay
    switches = sum(s["switches"] for s in snap["buckets"].values())
    changes = [r for r in caplog.records if "now runs width" in r.getMessage()]
    assert len(changes) == switches >= 1
    assert sum(snap["steps_by_width"].values()) == 600
    assert (
        snap["acceptance"][:2] == [pytest.approx(1.0, abs=0.02)] * 2 and snap["acceptance"][2] < 0.25
    )  # rarely tried: the prior still shows
    assert snap["costs"][1][2] == pytest.approx(cost(1, 2), rel=0.01)  # refined from the profile's 0.5x


def test_runtime_with_frequent_exploration_runs_many_widths():
    runtime = _runtime(explore_every=2)
    for _ in range(100):
        width = runtime.choose(1)
        start = runtime.start()
        runtime.clock.now += cost(1, width)
        runtime.finish(start, 1, width, torch.tensor([width]))
    assert sum(1 for n in runtime.snapshot()["steps_by_width"].values() if n) >= 2


def test_the_grafana_dashboard_queries_metrics_the_plugin_exports():
    import re

    from support.paths import REPO

    dashboard = json.loads((REPO / "monitoring" / "grafana-sglang-kimi.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = {re.sub(r"_total$", "", n) for e in exprs for n in re.findall(r"sglang_kimi:[a-z_]+", e)}
    source = "\n".join(p.read_text() for p in (REPO / "sglang_kimi").rglob("*.py"))
    exported = set(re.findall(r'"(sglang_kimi:[a-z_]+)"', source))
    exported |= {f"sglang_kimi:adaptive_{n}" for n in re.findall(r'gauge\(\s*"([a-z_]+)"', source)}
    assert names and names <= exported, f"dashboard metrics the plugin does not export: {sorted(names - exported)}"
    assert {"sglang_kimi:adaptive_width", "sglang_kimi:spec_accepted_per_position"} <= names


class _EagleWorker:
    """What SGLang's AdaptiveController needs of EAGLEWorkerV2: the active step count and the state switch."""

    def __init__(self, steps):
        self.speculative_num_steps = steps
        self.switches = 0

    def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None):
        assert speculative_num_draft_tokens == speculative_num_steps + 1
        return speculative_num_steps

    def apply_runtime_state(self, state):
        self.switches += state != self.speculative_num_steps
        self.speculative_num_steps = state


def test_eagle_steps_policy_drives_sglangs_adaptive_controller():
    """SGLang's controller asks the plugin's policy before each step; the step's outcome reaches the policy with its
    result (tagged at the end of the step, recorded once where the accepted counts are on the host)."""
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController

    from sglang_kimi.speculative.adaptive.eagle_policy import EagleStepsPolicy
    from sglang_kimi.speculative.adaptive.runtime import STEP_TAG, record_tagged_step, tag_step

    runtime = _runtime()
    policy = EagleStepsPolicy(runtime, [0, 1, 2, 3])
    worker = _EagleWorker(3)
    controller = AdaptiveController(worker, policy)
    controller.init_states(cuda_graph_bs=[1, 2, 4, 8])
    assert policy.cuda_graph_bs_for_step(0) == [1, 2, 4, 8]  # every bucket may run every width
    for _ in range(300):
        for batch in (1, 8):
            start = runtime.start()
            controller.activate_step_by_batch(batch)
            width = worker.speculative_num_steps
            runtime.clock.now += cost(batch, width)
            result = type("Result", (), {})()
            tag_step(result, runtime, start, batch, width)
            controller.on_verify_complete([min(width, 2)] * batch, batch)  # SGLang's own call: ignored
            record_tagged_step(result, torch.tensor([min(width, 2)] * batch))
            assert getattr(result, STEP_TAG) is None
            record_tagged_step(result, torch.tensor([0] * batch))  # a second call records nothing
    snap = runtime.snapshot()
    assert snap["buckets"]["1"]["width"] == 2 and snap["buckets"]["8"]["width"] == 0
    assert sum(snap["steps_by_width"].values()) == 600
    assert worker.switches >= 2


@pytest.mark.parametrize("release, refused", [("0.5.21", True), ("0.5.22", False), ("0.5.23.post1", False)])
def test_adaptive_eagle3_needs_sglang_0_5_22(monkeypatch, release, refused):
    """Its policy profiles SGLang's runtime states with KVIndexTranslator.bind_runner_slots (0.5.22 on): an older
    SGLang is refused at start-up, naming both releases, instead of failing in the profile."""
    from types import SimpleNamespace

    import sglang.version

    from sglang_kimi.speculative import validation

    monkeypatch.setattr(sglang.version, "__version__", release)
    cfg = SimpleNamespace(
        speculative_eagle_topk=1,
        speculative_adaptive_config=None,
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
    )
    if refused:
        with pytest.raises(
            SpeculativeConfigError, match=f"needs SGLang 0.5.22 or later; the installed SGLang is {release}"
        ):
            validation._check_adaptive_eagle(cfg)
    else:
        validation._check_adaptive_eagle(cfg)
