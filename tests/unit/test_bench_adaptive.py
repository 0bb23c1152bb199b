"""``bench/bench_adaptive.py``'s bookkeeping (its servers run only when the benchmark runs): repeats fold into the
median per level with every run kept, and the targets are judged on the folded numbers."""

from __future__ import annotations

import pytest
from support.repo_scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/bench_adaptive.py")


def level(c, tput, tau=None, width=None):
    return {"concurrency": c, "output_throughput": tput, "tau": tau, "chosen_width": width}


def test_repeats_fold_into_the_median_per_level(bench):
    repeats = [
        [level(1, 10.0, 2.0, 3), level(8, 80.0, 1.5, 1)],
        [level(1, 30.0, 2.2, 3), level(8, 20.0, 1.7, 0)],
        [level(1, 12.0, 2.4, 2), level(8, 60.0, 1.6, 1)],
    ]
    folded = bench.median_runs(repeats)
    assert [lv["output_throughput"] for lv in folded] == [12.0, 60.0]
    assert folded[0]["tau"] == pytest.approx(2.2) and folded[1]["tau"] == pytest.approx(1.6)
    assert folded[0]["output_throughput_runs"] == [10.0, 30.0, 12.0]
    assert folded[1]["chosen_width"] == 1  # the last run's


def test_eagle3_target_compares_the_plugin_with_sglangs_adaptive_per_level(bench):
    runs = {
        "eagle3-sglang-adaptive": [level(1, 50.0), level(8, 100.0)],
        "eagle3-kimi-adaptive": [level(1, 55.0, width=3), level(8, 99.0, width=1)],
    }
    analysis = bench.analyse_eagle(runs, [1, 8])
    assert analysis["kimi_vs_sglang_adaptive"] == {1: pytest.approx(1.1), 8: pytest.approx(0.99)}
    assert analysis["chosen_width"] == {1: 3, 8: 1}
    assert list(analysis["targets"].values()) == [False]  # 0.99x at c=8 misses ">= at every level"


def test_targets_are_judged_per_drafter_against_its_own_group(bench):
    def runs(*tputs):
        return [{**level(c, t, width=16), "output_throughput_runs": [t * 0.9, t]} for c, t in zip((1, 8), tputs)]

    results = {
        "drafters": {
            "matched": {
                "none": runs(10.0, 40.0),
                "chain-7": runs(30.0, 60.0),  # best at c=1
                "tree-8": runs(25.0, 80.0),  # best at c=8, and the best single static
                "adaptive": runs(29.0, 78.0),
            }
        }
    }
    a = bench.analyse(results, [1, 8])["matched"]
    assert a["best_static_per_level"] == {1: "chain-7", 8: "tree-8"} and a["best_single_static"] == "tree-8"
    assert a["adaptive_vs_best_static"] == {1: pytest.approx(29 / 30), 8: pytest.approx(78 / 80)}
    assert a["adaptive_first_run_vs_best_static"][1] == pytest.approx(0.9 * 29 / 30)
    assert a["adaptive_vs_best_single_geomean"] == pytest.approx(((29 / 25) * (78 / 80)) ** 0.5)
    assert a["best_static_per_level_vs_best_single_geomean"] == pytest.approx((30 / 25) ** 0.5)  # the ceiling
    assert a["adaptive_vs_no_speculation"] == {1: pytest.approx(2.9), 8: pytest.approx(1.95)}
    assert a["targets"] == {
        "adaptive >= 0.95x best static at every level": True,
        "adaptive >= 1.10x best single static (geomean)": False,  # 1.06x
        "adaptive >= 0.95x no speculation at every level": True,
    }


def test_runs_are_interleaved_in_a_rotating_order(bench):
    names = ["none", "chain-2", "adaptive"]
    orders = [bench.run_order(names, turn) for turn in range(3)]
    assert all(sorted(o) == sorted(names) for o in orders)
    assert [o[0] for o in orders] == names  # each configuration runs first once in three rounds
