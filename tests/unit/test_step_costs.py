"""A measured or projected ``t(B, w)`` table as the adaptive policy's start-up profile
(``speculative/adaptive/profile.py``, the setting ``step_costs``): read, matched against the server (device, TP,
rank shape, mode, each difference named), spread over the server's buckets and widths, and refused outside them."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from sglang_kimi.errors import SpeculativeConfigError
from sglang_kimi.models import kimi_shapes as ks
from sglang_kimi.speculative.adaptive.config import AdaptiveConfigError, load_adaptive_config
from sglang_kimi.speculative.adaptive.profile import (
    StepCosts,
    StepCostsError,
    fitting_step_costs,
    load_or_measure,
    read_profile,
    read_step_costs,
    server_cost_setup,
    step_costs_mismatches,
    step_costs_table,
    write_step_costs,
)

RANK = ks.rank_target_config(ks.RankShape(tp=8, layers=6))
DEVICE = "cuda:NVIDIA H200"


def _costs(seconds=None, device=DEVICE, config=RANK, tp=1):
    represented, shape = server_cost_setup(config, tp)
    table = seconds or {"tree": {1: {0: 0.010, 8: 0.012, 16: 0.016}, 8: {0: 0.014, 8: 0.030, 16: 0.050}}}
    return StepCosts(device, represented, shape, table, source="test")


def test_a_table_round_trips_through_its_file(tmp_path):
    costs = _costs()
    write_step_costs(tmp_path / "t.json", costs)
    back = read_step_costs(tmp_path / "t.json")
    assert (back.device, back.tp, back.shape, back.seconds) == (costs.device, costs.tp, costs.shape, costs.seconds)
    assert back.created and back.source == "test"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{", "not valid JSON"),
        (json.dumps({"format": "sglang-kimi-cost-profile/1"}), "is not sglang-kimi-step-costs/1"),
        (json.dumps({"format": "sglang-kimi-step-costs/1", "device": "x"}), "malformed"),
        (
            json.dumps(
                {
                    "format": "sglang-kimi-step-costs/1",
                    "device": "x",
                    "tp": 1,
                    "shape": {},
                    "seconds": {"tree": {"1": {"0": 0}}},
                }
            ),
            "time > 0",
        ),  # fmt: skip
    ],
)
def test_a_bad_file_is_one_clear_error(tmp_path, content, words):
    (tmp_path / "t.json").write_text(content)
    with pytest.raises(StepCostsError, match=words):
        read_step_costs(tmp_path / "t.json")


def test_each_difference_from_the_server_is_named():
    costs = _costs()
    represented, shape = server_cost_setup(RANK, 1)
    assert step_costs_mismatches(costs, tp=represented, shape=shape, mode="tree", device=DEVICE) == []
    kimi = {"text_config": ks.KIMI_K26_TEXT}
    other_tp, other_shape = server_cost_setup(kimi, 4)
    problems = step_costs_mismatches(costs, tp=other_tp, shape=other_shape, mode="chain", device="cuda:AMD MI300X")
    text = "; ".join(problems)
    assert "device 'cuda:NVIDIA H200' (table) vs 'cuda:AMD MI300X'" in text
    assert "TP 8 (table) vs 4 (this server)" in text
    assert "shape attention_heads: 8 (file) vs 16 (this server)" in text
    assert "shape num_hidden_layers: 6 (file) vs 61" in text
    assert "mode 'chain' (this server) is not in the table, which has ['tree']" in text


def test_fitting_costs_are_accepted_for_their_server_and_refused_with_the_fix_for_another(tmp_path):
    write_step_costs(tmp_path / "t.json", _costs())

    def fit(tp, device=DEVICE):
        return fitting_step_costs(
            tmp_path / "t.json", model_config=RANK, tp=tp, ep=1, moe_a2a_backend=None, mode="tree", device=device
        )

    assert fit(1).seconds == _costs().seconds
    with pytest.raises(StepCostsError) as e:
        fit(2, device="cpu:x")
    message = str(e.value)
    assert "TP 8 (table) vs 16" in message and "device 'cuda:NVIDIA H200' (table) vs 'cpu:x'" in message
    assert "bench/bench_step_cost.py" in message and "drop 'step_costs'" in message


def test_the_table_spreads_over_buckets_and_widths_between_its_measurements():
    costs = _costs()
    table = step_costs_table(costs, "tree", buckets=[1, 4, 8], widths=[0, 4, 8, 16])
    assert table[1] == {0: 0.010, 4: pytest.approx(0.011), 8: 0.012, 16: 0.016}
    assert table[4][0] == pytest.approx(0.010 + (0.014 - 0.010) * 3 / 7)  # batch 4 between 1 and 8
    assert table[4][8] == pytest.approx(0.012 + (0.030 - 0.012) * 3 / 7)
    assert table[8][16] == 0.050


def test_cells_outside_the_table_are_refused():
    with pytest.raises(StepCostsError) as e:
        step_costs_table(_costs(), "tree", buckets=[1, 16], widths=[0, 32])
    message = str(e.value)
    assert "cover batches [1, 8] and widths [0, 8, 16]" in message
    assert "(1, 32)" in message and "(16, 0)" in message and "narrow the adaptive setting" in message


def test_the_setting_reads_a_path_beside_the_settings_file(tmp_path):
    write_step_costs(tmp_path / "h200.json", _costs())
    settings = tmp_path / "policy.json"
    settings.write_text(json.dumps({"step_costs": "h200.json"}))
    assert load_adaptive_config(str(settings)).step_costs == str((tmp_path / "h200.json").resolve())
    settings.write_text(json.dumps({"step_costs": "missing.json"}))
    with pytest.raises(AdaptiveConfigError, match="'step_costs' missing.json is not a file"):
        load_adaptive_config(str(settings))
    settings.write_text(json.dumps({"step_costs": 3}))
    with pytest.raises(AdaptiveConfigError, match="must be the path of a step-costs file"):
        load_adaptive_config(str(settings))


def test_a_given_table_replaces_the_start_up_profile_and_is_kept(tmp_path):
    key = {"device": DEVICE, "mode": "tree"}
    given = step_costs_table(_costs(), "tree", [1, 8], [0, 8])

    def never(batch, width):
        raise AssertionError("profiled although a table was given")

    saved, file, measured = load_or_measure(str(tmp_path / "p.json"), key, [1, 8], [0, 8], never, given=given)
    assert saved.table == given and measured is False
    assert read_profile(file, key).table == given  # a restart reuses it (with what real steps add)
    saved, _, _ = load_or_measure(str(tmp_path / "p.json"), key, [1, 8], [0, 8], never, given=given)
    assert saved.table == given


def test_start_up_validation_refuses_a_table_for_another_setup(tmp_path):
    from sglang_kimi.speculative import validation

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(RANK))
    write_step_costs(tmp_path / "t.json", _costs())
    config = SimpleNamespace(step_costs=str(tmp_path / "t.json"))
    cfg = SimpleNamespace(model_path=str(model), tp_size=1, ep_size=1, moe_a2a_backend="none")
    assert validation._check_step_costs(cfg, config, "tree") is config
    with pytest.raises(SpeculativeConfigError, match="--speculative-kimi-adaptive-config: step costs .* mode 'chain'"):
        validation._check_step_costs(cfg, config, "chain")
    hub = SimpleNamespace(model_path="moonshotai/Kimi-K2.6", tp_size=8, ep_size=1, moe_a2a_backend="none")
    assert validation._check_step_costs(hub, config, "tree") is config  # compared in the scheduler, once downloaded
