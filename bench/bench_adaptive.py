#!/usr/bin/env python
"""Adaptive speculation against every static setting, on real SGLang servers (CPU, the embedded tiny Kimi).

    python bench/bench_adaptive.py               # concurrency 1,2,4,8,16; both drafters + EAGLE3; 3 repeats
    python bench/bench_adaptive.py --repeats 1   # one run of every configuration and level
    python bench/bench_adaptive.py --only eagle3 # the EAGLE3 group alone
    python bench/bench_adaptive.py --quick       # concurrency 1,8; matched drafter; chain 2 / tree 16 / adaptive
    python bench/bench_adaptive.py --analyse bench/results/bench_adaptive.json   # tables of a saved run again

Three groups of servers, each against its own non-speculative server (``none``):
- the matched DFlash drafter (``tiny-kimi-k2.6-dflash``) and the mismatched one (``tiny-kimi-k2.5-dflash``, trained
  for another checkpoint: ``scripts/make_mismatched_drafter.py``): static DFLASH chains of 2 and 7 drafts, static
  DDTree budgets 8, 16, 32, and adaptive (``--speculative-kimi-adaptive`` over tree budgets 0, 1, 2, 4, 8, 16, 32,
  i.e. no speculation, chains of 1-2 and trees);
- EAGLE3 chains (``tiny-kimi-k2.6-eagle3``, topk 1): static 3 steps, SGLang's own ``--speculative-adaptive`` (its
  default candidates 0, 1, 3, 5, 7) and the plugin's policy (``--speculative-kimi-adaptive``, steps 0..7).
Every level sends the same GSM8K test prompts (2 per slot, at least 4; 64 output tokens, one warm-up request)
through SGLang's own serving benchmark (``sglang-kimi bench``'s level runner).

A group's servers run side by side (idle ones sleep) for the whole group, and the runs are interleaved: for each
repeat and each level, every configuration runs that level once, in an order rotated from level to level, so a
slow spell of the machine (a shared 2-core machine drifts by tens of percent over minutes) lands on all the
configurations of a level alike. The table shows per level the median output tokens/s (and tau) of the repeats;
the JSON keeps every run in order. Adaptive servers keep what they learned from one run to the next, as a server
in service does; their first run of each level (the cold start: the policy has only its start-up profile and what
earlier levels taught it) is reported beside the medians. Each adaptive server profiles its costs at start-up
into a fresh file. Prints a table, writes ``bench/results/bench_adaptive.json`` and ``bench_adaptive.png`` (output
tokens/s by concurrency) and checks the targets (reported, never tuned for):
- adaptive >= 0.95x the best static configuration at every concurrency, for both drafters;
- adaptive >= 1.10x the best single static configuration (the one with the best geometric mean: what a sweep would
  pick) in the geometric mean over the grid;
- adaptive never more than 5% below no speculation;
- EAGLE3 chains: the plugin's policy >= SGLang's own adaptive at every concurrency.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from sglang_kimi.assets import TINY_DFLASH, TINY_EAGLE3, TINY_K25_DFLASH

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
DRAFTERS = {"matched": TINY_DFLASH, "mismatched": TINY_K25_DFLASH}
STATIC = {
    "chain-2": ["--speculative-num-draft-tokens", "3"],
    "chain-7": [],
    "tree-8": ["--speculative-dflash-tree-budget", "8"],
    "tree-16": ["--speculative-dflash-tree-budget", "16"],
    "tree-32": ["--speculative-dflash-tree-budget", "32"],
}
ADAPTIVE = ["--speculative-dflash-tree-budget", "32", "--speculative-kimi-adaptive"]
EAGLE3_DRAFTER = TINY_EAGLE3
EAGLE3 = {
    "eagle3-static-3": ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                        "--speculative-num-draft-tokens", "4"],
    "eagle3-sglang-adaptive": ["--speculative-adaptive"],
    "eagle3-kimi-adaptive": ["--speculative-kimi-adaptive"],
}  # fmt: skip


BENCH_SERVER_ARGS = ["--attention-backend", "kimi_cpu", "--max-total-tokens", "16384"]  # KV for 16 in flight


def start_servers(group: str, configs: dict[str, list[str]], out_dir: Path, stack: ExitStack) -> dict:
    """Every configuration's server, started one after the other (each stopped when ``stack`` closes)."""
    from sglang_kimi.evals.servers import probe
    from sglang_kimi.launcher.server import ANY_PORT, ServerProcess, launch_command

    servers = {}
    for name, args in configs.items():
        if "--speculative-kimi-adaptive" in args:  # a fresh profile per server
            args = args + ["--speculative-kimi-adaptive-profile", str(out_dir / f"profile-{group}-{name}.json")]
        server = ServerProcess(
            launch_command([*BENCH_SERVER_ARGS, *args], port=ANY_PORT), out_dir / f"{group}-{name}.log"
        )
        stack.callback(server.stop)
        started = time.monotonic()
        server.wait_ready(900)
        print(f"[{group}/{name}] ready in {time.monotonic() - started:.0f} s", flush=True)
        servers[name] = probe(server.base_url)
    return servers


def run_order(names: list[str], turn: int) -> list[str]:
    """The order of the configurations in the ``turn``-th (repeat, level) round: rotated by one each round, so no
    configuration always runs first (right after another level's load) or last."""
    shift = turn % len(names)
    return names[shift:] + names[:shift]


def run_group(group: str, configs: dict[str, list[str]], cfg, repeats: int, out_dir: Path) -> dict[str, list]:
    """{configuration: [[level dict per level] per repeat]}: the servers side by side, runs interleaved (see the
    module docstring)."""
    from sglang_kimi.evals.bench import gsm8k_questions, sweep

    questions = gsm8k_questions(cfg.data_dir)  # once for the group (the levels pick from them by seed)
    names = list(configs)
    runs: dict[str, list[list[dict]]] = {name: [[] for _ in range(repeats)] for name in names}
    with ExitStack() as stack:
        servers = start_servers(group, configs, out_dir, stack)
        started = time.monotonic()
        for r in range(repeats):
            for i, c in enumerate(cfg.concurrency):
                for name in run_order(names, r * len(cfg.concurrency) + i):
                    one = dataclasses.replace(cfg, concurrency=[c])
                    runs[name][r].extend(sweep(servers[name], one, out_dir, f"{group}-{name}-r{r}", questions))
                print(
                    f"  [{group}] repeat {r + 1}/{repeats}, c={c} done ({time.monotonic() - started:.0f} s)", flush=True
                )
    return runs


def geomean(xs):
    return statistics.geometric_mean(xs) if xs else None


def analyse(results: dict, levels: list[int]) -> dict:
    """Ratios and targets per drafter: adaptive vs the best static per level, vs the best single static, vs none
    (each drafter's group against its own non-speculative server)."""
    out = {}
    for drafter, configs in results["drafters"].items():
        tput = {name: {lv["concurrency"]: lv["output_throughput"] for lv in runs} for name, runs in configs.items()}
        none = tput["none"]
        statics = {n: t for n, t in tput.items() if n != "adaptive"}
        adaptive = tput["adaptive"]
        best_static = {c: max(statics, key=lambda n: statics[n][c]) for c in levels}
        single = max(statics, key=lambda n: geomean([statics[n][c] for c in levels]))
        vs_best = {c: adaptive[c] / statics[best_static[c]][c] for c in levels}
        vs_single = geomean([adaptive[c] / statics[single][c] for c in levels])
        # what the per-level best static (an oracle's pick, known only after the sweep) gains over the single best:
        # the most that choosing among these configurations per level could gain, the ceiling of the 1.10x target
        oracle = geomean([statics[best_static[c]][c] / statics[single][c] for c in levels])
        vs_none = {c: adaptive[c] / none[c] for c in levels}
        first = {lv["concurrency"]: lv["output_throughput_runs"][0] for lv in configs["adaptive"]}
        chosen = {lv["concurrency"]: lv.get("chosen_width") for lv in configs["adaptive"]}
        out[drafter] = {
            "best_static_per_level": best_static,
            "adaptive_vs_best_static": vs_best,
            "best_single_static": single,
            "adaptive_vs_best_single_geomean": vs_single,
            "best_static_per_level_vs_best_single_geomean": oracle,
            "adaptive_vs_no_speculation": vs_none,
            # the adaptive server's first run of each level (cold) against the statics' medians
            "adaptive_first_run_vs_best_static": {c: first[c] / statics[best_static[c]][c] for c in levels},
            "chosen_width": chosen,
            "targets": {
                "adaptive >= 0.95x best static at every level": min(vs_best.values()) >= 0.95,
                "adaptive >= 1.10x best single static (geomean)": vs_single >= 1.10,
                "adaptive >= 0.95x no speculation at every level": min(vs_none.values()) >= 0.95,
            },
        }
    return out


def table(results: dict, analysis: dict, levels: list[int]) -> str:
    lines = []
    for drafter, configs in results["drafters"].items():
        a = analysis[drafter]
        lines.append(f"\n{drafter} drafter: output tokens/s (tau)")
        lines.append("config      " + "".join(f"{'c=' + str(c):>16}" for c in levels))
        for name, runs in configs.items():
            by = {lv["concurrency"]: lv for lv in runs}
            cells = []
            for c in levels:
                lv = by[c]
                tau = f" ({lv['tau']:.2f})" if lv.get("tau") else ""
                cells.append(f"{lv['output_throughput']:.1f}{tau}")
            lines.append(f"{name:<12}" + "".join(f"{x:>16}" for x in cells))
        lines.append("chosen width" + "".join(f"{str(a['chosen_width'][c]):>16}" for c in levels))
        lines.append("vs best     " + "".join(f"{a['adaptive_vs_best_static'][c]:>15.2f}x" for c in levels))
        lines.append("vs none     " + "".join(f"{a['adaptive_vs_no_speculation'][c]:>15.2f}x" for c in levels))
        cold = a["adaptive_first_run_vs_best_static"]
        lines.append("1st vs best " + "".join(f"{cold[c]:>15.2f}x" for c in levels))
        lines.append(
            f"best single static: {a['best_single_static']}; adaptive / it (geomean) "
            f"{a['adaptive_vs_best_single_geomean']:.2f}x; the best static of each level / it (geomean) "
            f"{a['best_static_per_level_vs_best_single_geomean']:.2f}x"
        )
        for target, ok in a["targets"].items():
            lines.append(f"  {'met ' if ok else 'MISSED'} {target}")
    return "\n".join(lines)


def plot(results: dict, levels: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = {f"{d} DFlash drafter": rows for d, rows in results["drafters"].items()}
    if results.get("eagle3"):
        panels["EAGLE3 chains"] = results["eagle3"]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (title, configs) in zip(axes[0], panels.items()):
        for name, runs in configs.items():
            by = {lv["concurrency"]: lv["output_throughput"] for lv in runs}
            bold = name in ("adaptive", "eagle3-kimi-adaptive")
            style = dict(lw=2.5, color="black") if bold else dict(lw=1, ls="--" if name == "none" else "-")
            ax.plot(levels, [by[c] for c in levels], marker="o", label=name, **style)
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tokens/s (median of repeats)")
        ax.set_title(f"{title} (tiny Kimi, CPU)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def median_runs(repeats: list[list[dict]]) -> list[dict]:
    """One configuration's repeats folded per level: the median output tokens/s and tau, every run kept."""
    out = []
    for levels in zip(*repeats):
        merged = dict(levels[-1])  # the last run's other fields (chosen width, latencies)
        merged["output_throughput"] = statistics.median(lv["output_throughput"] for lv in levels)
        taus = [lv["tau"] for lv in levels if lv.get("tau")]
        merged["tau"] = statistics.median(taus) if taus else None
        merged["output_throughput_runs"] = [lv["output_throughput"] for lv in levels]
        out.append(merged)
    return out


def analyse_eagle(runs: dict, levels: list[int]) -> dict:
    tput = {name: {lv["concurrency"]: lv["output_throughput"] for lv in r} for name, r in runs.items()}
    ratio = {c: tput["eagle3-kimi-adaptive"][c] / tput["eagle3-sglang-adaptive"][c] for c in levels}
    return {
        "kimi_vs_sglang_adaptive": ratio,
        "chosen_width": {lv["concurrency"]: lv.get("chosen_width") for lv in runs["eagle3-kimi-adaptive"]},
        "targets": {"plugin policy >= SGLang's adaptive at every level (EAGLE3)": min(ratio.values()) >= 1.0},
    }


def eagle_table(runs: dict, analysis: dict, levels: list[int]) -> str:
    lines = ["\nEAGLE3 chains (topk 1): output tokens/s (tau)"]
    lines.append("config                 " + "".join(f"{'c=' + str(c):>16}" for c in levels))
    for name, r in runs.items():
        by = {lv["concurrency"]: lv for lv in r}
        cells = [
            f"{by[c]['output_throughput']:.1f}" + (f" ({by[c]['tau']:.2f})" if by[c].get("tau") else "") for c in levels
        ]
        lines.append(f"{name:<23}" + "".join(f"{x:>16}" for x in cells))
    lines.append("kimi chosen steps      " + "".join(f"{str(analysis['chosen_width'][c]):>16}" for c in levels))
    lines.append(
        "kimi / sglang adaptive " + "".join(f"{analysis['kimi_vs_sglang_adaptive'][c]:>15.2f}x" for c in levels)
    )
    for target, ok in analysis["targets"].items():
        lines.append(f"  {'met ' if ok else 'MISSED'} {target}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="concurrency 1,8; matched drafter; chain-2, tree-16")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="runs of every configuration and level, interleaved")
    ap.add_argument("--only", choices=("dflash", "eagle3"), help="run one part of the grid")
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_adaptive.json")
    ap.add_argument(
        "--analyse",
        type=Path,
        metavar="JSON",
        help="no servers: re-derive the analysis, table and plot of an earlier run's JSON (written to --out)",
    )
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.analyse:
        data = json.loads(args.analyse.read_text())
        return report(data, data["results"], data["config"]["levels"], args.out)

    from sglang_kimi.evals.bench import BenchConfig, parse_concurrency

    levels = [1, 8] if args.quick else parse_concurrency(args.concurrency)
    drafters = {"matched": DRAFTERS["matched"]} if args.quick else DRAFTERS
    static = {k: STATIC[k] for k in ("chain-2", "tree-16")} if args.quick else STATIC
    cfg = BenchConfig(
        concurrency=levels, dataset="gsm8k", input_len=0, output_len=args.output_len, num_prompts=None,
        prompts_per_slot=2, warmup_requests=1, data_dir=str(REPO / "data" / "gsm8k"), tokenizer=None, seed=1, cpu=True,
    )  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="bench_adaptive_"))
    print(f"server logs and SGLang's raw results: {work}", flush=True)

    groups: dict[str, dict[str, list[str]]] = {}
    if args.only != "eagle3":
        for drafter, path in drafters.items():
            spec = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(path)]
            groups[drafter] = {"none": []} | {name: spec + extra for name, extra in static.items()}
            groups[drafter]["adaptive"] = spec + ADAPTIVE
    if args.only != "dflash" and not args.quick:
        spec = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(EAGLE3_DRAFTER)]
        groups["eagle3"] = {"none": []} | {name: spec + extra for name, extra in EAGLE3.items()}
    started = time.monotonic()
    results: dict = {"drafters": {}, "eagle3": {}}
    for group, configs in groups.items():
        runs = run_group(group, configs, cfg, args.repeats, work)
        folded = {name: median_runs(reps) for name, reps in runs.items()}
        if group == "eagle3":
            results["eagle3"] = folded
        else:
            results["drafters"][group] = folded
        print(f"  ({time.monotonic() - started:.0f} s so far)", flush=True)

    data = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "config": {
            "levels": levels,
            "output_len": args.output_len,
            "repeats": args.repeats,
            "server_args": BENCH_SERVER_ARGS,
            "static": static,
            "adaptive": ADAPTIVE,
            "eagle3": EAGLE3,
        },
        "minutes": round((time.monotonic() - started) / 60, 1),
        "results": results,
    }
    return report(data, results, levels, args.out)


def report(data: dict, results: dict, levels: list[int], out: Path) -> int:
    """Analyses ``results``, prints the tables, writes ``data`` with the analysis as JSON to ``out`` and the plot
    beside it."""
    data["analysis"] = analyse(results, levels) if results["drafters"] else {}
    if results["drafters"]:
        print(table(results, data["analysis"], levels))
    data["analysis_eagle3"] = None
    if results["eagle3"]:
        data["analysis_eagle3"] = analyse_eagle(results["eagle3"], levels)
        print(eagle_table(results["eagle3"], data["analysis_eagle3"], levels))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    png = out.with_suffix(".png")
    plot(results, levels, png)
    print(f"results: {out}  plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
