#!/usr/bin/env python
"""Adaptive speculation against every static setting, on real SGLang servers (CPU, the embedded tiny Kimi).

    python bench/bench_adaptive.py               # concurrency 1,2,4,8,16; both drafters; ~25 min on 2 cores
    python bench/bench_adaptive.py --quick       # concurrency 1,8; matched drafter; chain 2 / tree 16 / adaptive

For the matched drafter (``tiny-kimi-k2.6-dflash``) and the mismatched one (``tiny-kimi-k2.5-dflash``, trained for
another checkpoint: ``scripts/make_mismatched_drafter.py``): no speculation; static DFLASH chains of 2 and 7
drafts; static DDTree budgets 8, 16, 32; and adaptive (``--speculative-kimi-adaptive`` over tree budgets
0, 1, 2, 4, 8, 16, 32, i.e. no speculation, chains of 1-2 and trees). Every level sends the same GSM8K test prompts
(2 per slot, at least 4; 64 output tokens) through SGLang's own serving benchmark (``sglang-kimi bench``'s sweep).
Each adaptive server profiles its costs at start-up into a fresh file. Prints a table, writes
``bench/results/bench_adaptive.json`` and ``bench_adaptive.png`` (output tokens/s by concurrency) and checks the
targets (reported, never tuned for):
- adaptive >= 0.95x the best static configuration at every concurrency, for both drafters;
- adaptive >= 1.10x the best single static configuration (the one with the best geometric mean: what a sweep would
  pick) in the geometric mean over the grid;
- adaptive never more than 5% below no speculation.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
ASSETS = REPO / "sglang_kimi" / "assets"
DRAFTERS = {"matched": ASSETS / "tiny-kimi-k2.6-dflash", "mismatched": ASSETS / "tiny-kimi-k2.5-dflash"}
STATIC = {
    "chain-2": ["--speculative-num-draft-tokens", "3"],
    "chain-7": [],
    "tree-8": ["--speculative-dflash-tree-budget", "8"],
    "tree-16": ["--speculative-dflash-tree-budget", "16"],
    "tree-32": ["--speculative-dflash-tree-budget", "32"],
}
ADAPTIVE = ["--speculative-dflash-tree-budget", "32", "--speculative-kimi-adaptive"]


def run_server(name: str, args: list[str], cfg, out_dir: Path) -> list[dict]:
    from sglang_kimi.evals.bench import sweep
    from sglang_kimi.evals.servers import probe
    from sglang_kimi.server import ServerProcess, free_port, launch_command

    spec = launch_command(["--attention-backend", "kimi_cpu", *args], port=free_port())
    server = ServerProcess(spec, out_dir / f"{name}.log")
    started = time.monotonic()
    try:
        server.wait_ready(900)
        print(f"[{name}] ready in {time.monotonic() - started:.0f} s", flush=True)
        return sweep(probe(server.base_url), cfg, out_dir, name)
    finally:
        server.stop()


def geomean(xs):
    return statistics.geometric_mean(xs) if xs else None


def analyse(results: dict, levels: list[int]) -> dict:
    """Ratios and targets per drafter: adaptive vs the best static per level, vs the best single static, vs none."""
    none = {lv["concurrency"]: lv["output_throughput"] for lv in results["none"]}
    out = {}
    for drafter, configs in results["drafters"].items():
        tput = {name: {lv["concurrency"]: lv["output_throughput"] for lv in runs} for name, runs in configs.items()}
        statics = {n: t for n, t in tput.items() if n != "adaptive"} | {"none": none}
        adaptive = tput["adaptive"]
        best_static = {c: max(statics, key=lambda n: statics[n][c]) for c in levels}
        single = max(statics, key=lambda n: geomean([statics[n][c] for c in levels]))
        vs_best = {c: adaptive[c] / statics[best_static[c]][c] for c in levels}
        vs_single = geomean([adaptive[c] / statics[single][c] for c in levels])
        vs_none = {c: adaptive[c] / none[c] for c in levels}
        chosen = {lv["concurrency"]: lv.get("chosen_width") for lv in configs["adaptive"]}
        out[drafter] = {
            "best_static_per_level": best_static,
            "adaptive_vs_best_static": vs_best,
            "best_single_static": single,
            "adaptive_vs_best_single_geomean": vs_single,
            "adaptive_vs_no_speculation": vs_none,
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
        rows = {"none": results["none"], **configs}
        for name, runs in rows.items():
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
        lines.append(
            f"best single static: {a['best_single_static']}; adaptive / it (geomean) "
            f"{a['adaptive_vs_best_single_geomean']:.2f}x"
        )
        for target, ok in a["targets"].items():
            lines.append(f"  {'met ' if ok else 'MISSED'} {target}")
    return "\n".join(lines)


def plot(results: dict, levels: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drafters = list(results["drafters"])
    fig, axes = plt.subplots(1, len(drafters), figsize=(6 * len(drafters), 4.5), squeeze=False)
    for ax, drafter in zip(axes[0], drafters):
        rows = {"none": results["none"], **results["drafters"][drafter]}
        for name, runs in rows.items():
            by = {lv["concurrency"]: lv["output_throughput"] for lv in runs}
            style = (
                dict(lw=2.5, color="black") if name == "adaptive" else dict(lw=1, ls="--" if name == "none" else "-")
            )
            ax.plot(levels, [by[c] for c in levels], marker="o", label=name, **style)
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"{drafter} drafter (tiny Kimi, CPU)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="concurrency 1,8; matched drafter; chain-2, tree-16")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_adaptive.json")
    args = ap.parse_args()

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
    started = time.monotonic()
    results = {"none": run_server("none", [], cfg, work), "drafters": {}}
    for drafter, path in drafters.items():
        spec = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(path)]
        runs = {}
        for name, extra in static.items():
            runs[name] = run_server(f"{drafter}-{name}", spec + extra, cfg, work)
        profile = ["--speculative-kimi-adaptive-profile", str(work / f"profile-{drafter}.json")]
        runs["adaptive"] = run_server(f"{drafter}-adaptive", spec + ADAPTIVE + profile, cfg, work)
        results["drafters"][drafter] = runs
    analysis = analyse(results, levels)
    print(table(results, analysis, levels))
    data = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": sys.version.split()[0],
        },
        "config": {"levels": levels, "output_len": args.output_len, "static": static, "adaptive": ADAPTIVE},
        "minutes": round((time.monotonic() - started) / 60, 1),
        "results": results,
        "analysis": analysis,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    png = args.out.with_suffix(".png")
    plot(results, levels, png)
    print(f"results: {args.out}  plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
