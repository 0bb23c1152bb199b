"""Benchmark: the batched DDTree build (``speculators/ddtree.py``) against the reference per-request heap
(``speculators/reference/heap.py``: each request ranked alone, then a Python heapq best-first loop).

For every batch size B and node budget: median wall time per call of both builders on the same random
draft logits [B, L, V] (Kimi: L = 7 drafted positions of a DFlash block of 8, V = 163840), the speedup
(heap / batched), and a check that both built the same trees. Prints a table and writes JSON and a PNG of the
speedups (``bench/results/bench_trees.{json,png}``).

    python bench/bench_trees.py            # B in {1, 16, 64}, budget in {16, 32, 64}, CPU (and CUDA if present)
    python bench/bench_trees.py --quick    # a short run
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import platform
import statistics
import time

import torch

from sglang_kimi.speculators.ddtree import build_ddtree
from sglang_kimi.speculators.reference.heap import ddtree_heap
from sglang_kimi.speculators.trees import DraftTree

RESULTS = pathlib.Path(__file__).parent / "results" / "bench_trees.json"


def median_seconds(fns, repeats: int, device: torch.device) -> list[float]:
    """Median wall time of each function; calls are interleaved so load from other processes hits all alike."""
    times = [[] for _ in fns]
    for fn in fns:
        fn()  # warm-up
    for _ in range(repeats):
        for fn, samples in zip(fns, times):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


def same_tree(a: DraftTree, b: DraftTree) -> bool:
    """The same set of token paths per request (node order too, when the builds agree exactly: they sum the same
    float32 scores in the same order, so they should)."""

    def paths(tree: DraftTree) -> list[set[tuple[int, ...]]]:
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        out = []
        for toks, pars in zip(tokens, parents):
            path_of = {0: ()}
            for i in range(1, len(toks)):
                path_of[i] = path_of[pars[i]] + (toks[i],)
            out.append(set(path_of.values()))
        return out

    return paths(a) == paths(b)


def plot(rows: list[dict], path: pathlib.Path) -> None:
    """Speedup (heap / batched) against batch size, one line per device and budget; 1.0 marks parity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for device, budget in sorted({(r["device"], r["budget"]) for r in rows}):
        points = sorted((r["batch_size"], r["speedup"]) for r in rows if (r["device"], r["budget"]) == (device, budget))
        ax.plot(*zip(*points), marker="o", label=f"{device}, budget {budget}")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("speedup of the batched build (heap ms / batched ms)")
    ax.set_title("DDTree build: batched vs per-request heap")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,16,64", help="comma-separated B values")
    parser.add_argument("--budgets", default="16,32,64", help="comma-separated node budgets (non-root nodes)")
    parser.add_argument("--length", type=int, default=7, help="drafted positions L")
    parser.add_argument("--vocab", type=int, default=163840, help="vocabulary size V")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per measurement (median reported)")
    parser.add_argument("--devices", default=None, help="comma-separated; default cpu, plus cuda when available")
    parser.add_argument("--quick", action="store_true", help="B in {1, 16}, budgets {16, 64}, 2 repeats")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--output", type=pathlib.Path, default=RESULTS, help="JSON file to write")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batch_sizes = [1, 16] if args.quick else [int(x) for x in args.batch_sizes.split(",")]
    budgets = [16, 64] if args.quick else [int(x) for x in args.budgets.split(",")]
    repeats = 2 if args.quick else args.repeats
    devices = args.devices.split(",") if args.devices else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

    rows = []
    header = f"{'device':<6} {'B':>4} {'budget':>6} {'batched ms':>11} {'heap ms':>10} {'speedup':>8} {'same':>5}"
    print(
        f"build_ddtree, L={args.length}, V={args.vocab}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(header)
    for device_name in devices:
        device = torch.device(device_name)
        for batch in batch_sizes:
            gen = torch.Generator(device=device).manual_seed(batch)
            logits = torch.randn((batch, args.length, args.vocab), generator=gen, device=device) * 3  # [B, L, V]
            root = torch.arange(batch, device=device)
            for budget in budgets:
                batched, heap = median_seconds(
                    [
                        functools.partial(build_ddtree, root, logits, budget),
                        functools.partial(ddtree_heap, root, logits, budget),
                    ],
                    repeats,
                    device,
                )
                same = same_tree(build_ddtree(root, logits, budget), ddtree_heap(root, logits, budget))
                rows.append(
                    {
                        "device": device_name,
                        "batch_size": batch,
                        "budget": budget,
                        "batched_median_ms": batched * 1e3,
                        "heap_median_ms": heap * 1e3,
                        "speedup": heap / batched,
                        "same_trees": same,
                    }
                )
                print(
                    f"{device_name:<6} {batch:>4} {budget:>6} {batched * 1e3:>11.2f} {heap * 1e3:>10.2f} "
                    f"{heap / batched:>7.2f}x {same!s:>5}"
                )
    report = {
        "benchmark": "DDTree: batched build vs reference per-request heap",
        "length": args.length,
        "vocab": args.vocab,
        "repeats": repeats,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],  # other work on a shared machine inflates the CPU times
        "cuda_device": torch.cuda.get_device_name() if "cuda" in devices else None,
        "results": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    plot(rows, args.output.with_suffix(".png"))
    print(f"wrote {args.output} and {args.output.with_suffix('.png')}")


if __name__ == "__main__":
    main()
