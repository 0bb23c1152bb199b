"""Benchmark: the batched DDTree build (``speculators/ddtree.py``) against the reference per-request heap
(``speculators/reference/heap.py``: each request ranked alone, then a Python heapq best-first loop).

For every batch size B and node budget: median wall time per call of both builders on the same random
draft logits [B, L, V] (Kimi: L = 7 drafted positions of a DFlash block of 8, V = 163840), the speedup
(heap / batched), and a check that both built the same trees. Prints a table and writes JSON and a PNG of the
speedups (``bench/results/bench_trees.{json,png}``).

Then the ranking alone (``speculators.ddtree.rank_draft_logits``: each position's best K tokens and its log-sum-exp)
on bf16-rounded logits [B, L, V] (ties as a bf16 LM head makes them), for B in ``--rank-batch-sizes`` and K in
``--rank-budgets``, as the tree step calls it (``overwrite=True`` on its own copy of the LM head's output), against
``torch.topk(K) + torch.logsumexp`` over the same rows in the same run (what a ranking cannot do with less), and
against the whole-row integer keys the ranking used before (``trees._keyed_topk``), each timed from a fresh copy of
the logits; the peak bytes each allocates beyond its input (torch's profiler), the ranking also without overwrite;
and whether its ids equal the whole-row keys' (the tie rule). Plot: ``bench_trees_ranking.png``.

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

from sglang_kimi.speculators.ddtree import build_ddtree, rank_draft_logits
from sglang_kimi.speculators.reference.heap import ddtree_heap
from sglang_kimi.speculators.trees import DraftTree, _keyed_topk

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


def peak_bytes(fn) -> int:
    """Peak bytes ``fn`` holds allocated beyond what existed before it, from torch's profiler: each operator's own
    allocations counted at its start, its own frees at its end."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities, profile_memory=True) as prof:
        fn()
    marks = []
    for event in prof.events():
        size = event.self_cpu_memory_usage + getattr(event, "self_device_memory_usage", 0)
        if size:
            marks.append((event.time_range.start if size > 0 else event.time_range.end, size))
    held = peak = 0
    for _, size in sorted(marks):
        held += size
        peak = max(peak, held)
    return peak


def plain_top_k(logits: torch.Tensor, k: int):
    """The floor: torch.topk and torch.logsumexp over the same rows, no tie rule."""
    return logits.topk(k, dim=-1), torch.logsumexp(logits, dim=-1)


def whole_row_keys(logits: torch.Tensor, k: int):
    """The ranking as it was: int64 keys over every row's whole vocabulary, then torch.logsumexp."""
    rows = logits.reshape(-1, logits.shape[-1])
    return _keyed_topk(rows, k), torch.logsumexp(rows, dim=-1)


def overwriting(logits: torch.Tensor, k: int):
    """The ranking as the tree step calls it, on its own copy of the LM head's output (the copy is not counted)."""
    scratch = logits.clone()
    return lambda: rank_draft_logits(scratch, k, overwrite=True)


def bench_ranking(devices, batch_sizes, budgets, length, vocab, repeats) -> list[dict]:
    rows = []
    print(f"\nrank_draft_logits, L={length}, V={vocab}: against torch.topk + logsumexp over the same rows")
    print(
        f"{'device':<6} {'B':>4} {'K':>4} {'floor ms':>9} {'ranking ms':>11} {'ratio':>6} {'keys ms':>8} "
        f"{'floor B/el':>10} {'ranking B/el':>12} {'in place':>9} {'keys B/el':>9} {'same ids':>8}"
    )
    for device_name in devices:
        device = torch.device(device_name)
        for batch in batch_sizes:
            gen = torch.Generator(device=device).manual_seed(100 + batch)
            logits = (torch.randn((batch, length, vocab), generator=gen, device=device) * 3).bfloat16().float()
            for k in budgets:
                # each from a fresh copy of the logits, as the LM head writes them every step (the step's ranking
                # overwrites its copy; the copy is common to all three)
                scratch = [torch.empty_like(logits) for _ in range(3)]
                floor, ranking, keys = median_seconds(
                    [
                        lambda: plain_top_k(scratch[0].copy_(logits), k),
                        lambda: rank_draft_logits(scratch[1].copy_(logits), k, overwrite=True),
                        lambda: whole_row_keys(scratch[2].copy_(logits), k),
                    ],
                    repeats,
                    device,
                )
                per_element = logits.numel()
                peaks = [
                    peak_bytes(functools.partial(plain_top_k, logits, k)) / per_element,
                    peak_bytes(functools.partial(rank_draft_logits, logits, k)) / per_element,
                    peak_bytes(overwriting(logits, k)) / per_element,
                    peak_bytes(functools.partial(whole_row_keys, logits, k)) / per_element,
                ]
                ids = rank_draft_logits(logits, k)[1].reshape(-1, k)
                same = bool(torch.equal(ids, whole_row_keys(logits, k)[0][1]))
                rows.append(
                    {
                        "device": device_name,
                        "batch_size": batch,
                        "k": k,
                        "floor_topk_logsumexp_median_ms": floor * 1e3,
                        "ranking_median_ms": ranking * 1e3,
                        "ratio_to_floor": ranking / floor,
                        "whole_row_keys_median_ms": keys * 1e3,
                        "peak_bytes_per_logit": dict(zip(("floor", "ranking", "ranking_overwrite", "keys"), peaks)),
                        "same_ids_as_whole_row_keys": same,
                    }
                )
                print(
                    f"{device_name:<6} {batch:>4} {k:>4} {floor * 1e3:>9.2f} {ranking * 1e3:>11.2f} "
                    f"{ranking / floor:>5.2f}x {keys * 1e3:>8.2f} {peaks[0]:>10.2f} {peaks[1]:>12.2f} "
                    f"{peaks[2]:>9.2f} {peaks[3]:>9.2f} {same!s:>8}"
                )
    return rows


def plot_ranking(rows: list[dict], path: pathlib.Path) -> None:
    """The ranking's time over the floor's (torch.topk + logsumexp), and the whole-row keys' before it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for device, k in sorted({(r["device"], r["k"]) for r in rows}):
        mine = sorted((r["batch_size"], r) for r in rows if (r["device"], r["k"]) == (device, k))
        batches = [b for b, _ in mine]
        ax.plot(batches, [r["ratio_to_floor"] for _, r in mine], marker="o", label=f"{device}, K {k}: ranking")
        ax.plot(
            batches,
            [r["whole_row_keys_median_ms"] / r["floor_topk_logsumexp_median_ms"] for _, r in mine],
            marker="x",
            linestyle=":",
            label=f"{device}, K {k}: whole-row keys (before)",
        )
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.axhline(1.1, color="red", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("time / (torch.topk + logsumexp)")
    ax.set_title("DDTree ranking at the cost of one top-k")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


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
    parser.add_argument("--rank-batch-sizes", default="1,16,64", help="comma-separated B values of the ranking")
    parser.add_argument("--rank-budgets", default="8,16,32", help="comma-separated K values of the ranking")
    parser.add_argument("--rank-vocab", type=int, default=None, help="the ranking's vocabulary (default: --vocab)")
    parser.add_argument(
        "--quick", action="store_true", help="B in {1, 16}, budgets {16, 64}, ranking K {8, 32}, 2 repeats"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--output", type=pathlib.Path, default=RESULTS, help="JSON file to write")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batch_sizes = [1, 16] if args.quick else [int(x) for x in args.batch_sizes.split(",")]
    budgets = [16, 64] if args.quick else [int(x) for x in args.budgets.split(",")]
    rank_batch_sizes = [1, 16] if args.quick else [int(x) for x in args.rank_batch_sizes.split(",")]
    rank_budgets = [8, 32] if args.quick else [int(x) for x in args.rank_budgets.split(",")]
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
    rank_vocab = args.rank_vocab or args.vocab
    ranking = bench_ranking(devices, rank_batch_sizes, rank_budgets, args.length, rank_vocab, repeats)
    report = {
        "benchmark": "DDTree: batched build vs reference per-request heap; the ranking vs torch.topk + logsumexp",
        "length": args.length,
        "vocab": args.vocab,
        "rank_vocab": rank_vocab,
        "repeats": repeats,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],  # other work on a shared machine inflates the CPU times
        "cuda_device": torch.cuda.get_device_name() if "cuda" in devices else None,
        "results": rows,
        "ranking": ranking,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    plot(rows, args.output.with_suffix(".png"))
    ranking_png = args.output.with_name(args.output.stem + "_ranking.png")
    plot_ranking(ranking, ranking_png)
    print(f"wrote {args.output}, {args.output.with_suffix('.png')} and {ranking_png}")


if __name__ == "__main__":
    main()
