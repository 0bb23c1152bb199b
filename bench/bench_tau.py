#!/usr/bin/env python
"""tau (mean tokens per target forward) of the embedded tiny drafters on GSM8K, in the reference decode loop.

    python bench/bench_tau.py                 # 100 GSM8K test questions x 128 greedy tokens, every method
    python bench/bench_tau.py --limit 5       # a quick run
    python bench/bench_tau.py --temperature 1 # sampled decoding (target-only verification), bench_tau_t1.json

Target: the embedded tiny Kimi-K2.6 (compact implementation with a prefix KV cache, float64 by default; equal to
the HF reference, ``tests/unit/test_dflash.py``). Prompts ``"Question: {q}\\nAnswer:"``, greedy, ``--new-tokens``.
Methods: DFlash chain (block 8: 7 drafts), DDTree budgets 8/16/32/64 over the same DFlash pass, EAGLE3 chain
(3 steps, topk 1, 4 tokens), EAGLE3 tree (5 steps, topk 4, 16 tokens). Every speculative output is asserted
equal to the autoregressive greedy output (a mismatch is reported in the JSON, then raised).

With ``--temperature T > 0`` every method decodes sampled (seed = prompt index; lossless by construction, checked
statistically by the tests, not here): the tiny target's greedy continuations are very repetitive, sampled ones
are not, so the sampled run is the one where draft trees have alternatives to offer.

Reports per method: tau = tokens per decode step (accepted + bonus), the accept histogram, per-position
acceptance (share of steps that accepted at least k drafts), target forwards; plus the targets
(DFlash chain tau >= 2.5; DDTree(32) >= 1.35 x DFlash chain; EAGLE3 tree >= EAGLE3 chain). tau does not depend on
the hardware; the seconds are CPU wall time, for orientation only. Writes ``bench/results/bench_tau.json`` and
``bench/results/bench_tau_acceptance.png``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import _drafter_common as common

from sglang_kimi.assets import TINY_DFLASH, TINY_EAGLE3
from sglang_kimi.models import tiny
from sglang_kimi.speculative import acceptance_rates
from sglang_kimi.speculators.reference.deepseek_v3 import CompactDeepseekV3
from sglang_kimi.speculators.reference.dflash import DFlashDrafter
from sglang_kimi.speculators.reference.eagle3 import Eagle3Drafter
from sglang_kimi.speculators.reference.loop import ChainProposer, DDTreeProposer, EagleProposer, generate

RESULTS = REPO / "bench" / "results"
METHODS = ["dflash_chain", "ddtree_8", "ddtree_16", "ddtree_32", "ddtree_64", "eagle3_chain", "eagle3_tree"]


def make_proposers(dflash: DFlashDrafter, eagle: Eagle3Drafter, block: int) -> dict:
    """name -> (factory of a fresh proposer, capture layers, description)."""
    d_layers = dflash.config.resolve_target_layer_ids()
    e_layers = eagle.config.resolve_target_layer_ids(tiny.TEXT_CONFIG["num_hidden_layers"])
    out = {
        "dflash_chain": (lambda: ChainProposer(drafter=dflash.block_drafter(), num_draft_tokens=block - 1), d_layers,
                         f"DFlash chain, block {block} ({block - 1} drafts)"),
        "eagle3_chain": (lambda: EagleProposer(drafter=eagle.step_drafter(), num_steps=3, topk=1, num_draft_tokens=4),
                         e_layers, "EAGLE3 chain: 3 steps, topk 1, 4 draft tokens"),
        "eagle3_tree": (lambda: EagleProposer(drafter=eagle.step_drafter(), num_steps=5, topk=4, num_draft_tokens=16),
                        e_layers, "EAGLE3 tree: 5 steps, topk 4, 16 draft tokens"),
    }  # fmt: skip
    for budget in (8, 16, 32, 64):
        out[f"ddtree_{budget}"] = (
            lambda b=budget: DDTreeProposer(drafter=dflash.block_drafter(), num_positions=block - 1, budget=b),
            d_layers,
            f"DDTree over one DFlash block ({block - 1} positions), node budget {budget}",
        )
    return out


def display(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def summarize(histogram: list[int]) -> dict:
    steps = sum(histogram)
    at_least = [sum(histogram[k:]) / max(steps, 1) for k in range(1, len(histogram))]
    return {
        "tau": acceptance_rates.tau(histogram),
        "decode_steps": steps,
        "accept_histogram": histogram,
        "acceptance_by_position": at_least,  # [k-1]: share of steps that accepted >= k drafts
    }


def plot(results: dict, path: Path, decoding: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, r in results.items():
        acc = r["acceptance_by_position"]
        ax.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{name} (tau {r['tau']:.2f})")
    ax.set_xlabel("draft position k (tree depth)")
    ax.set_ylabel("share of steps accepting >= k drafts")
    ax.set_title(f"Tiny Kimi-K2.6 drafters on GSM8K ({decoding}): per-position acceptance")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=100, help="first N GSM8K test questions")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: sampled (top-p 1)")
    ap.add_argument("--dflash", type=Path, default=TINY_DFLASH)
    ap.add_argument("--eagle3", type=Path, default=TINY_EAGLE3)
    ap.add_argument("--out", type=Path, help="default bench/results/bench_tau.json (bench_tau_t{T}.json sampled)")
    ap.add_argument("--png", type=Path, help="default: the --out path with _acceptance.png")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: OpenMP threads stall on a busy CPU)")
    args = ap.parse_args()
    suffix = "" if args.temperature <= 0 else f"_t{args.temperature:g}"
    args.out = args.out or RESULTS / f"bench_tau{suffix}.json"
    args.png = args.png or args.out.with_name(args.out.stem + "_acceptance.png")

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    model = CompactDeepseekV3.from_pretrained(tiny.TINY_MODEL, dtype=dtype)
    dflash = DFlashDrafter.from_pretrained(args.dflash, dtype=dtype)
    dflash.attach_target(model.embed_tokens.weight, model.lm_head.weight)
    eagle = Eagle3Drafter.from_pretrained(args.eagle3, dtype=dtype)
    eagle.attach_target(model.embed_tokens.weight)
    proposers = make_proposers(dflash, eagle, dflash.config.block_size)
    prompts = common.gsm8k_prompts("test", args.limit)

    hist: dict[str, list[int]] = {m: [] for m in args.methods}
    forwards = {m: 0 for m in args.methods}
    seconds = {m: 0.0 for m in [*args.methods, "autoregressive"]}
    mismatches = []
    start = time.time()
    for i, prompt in enumerate(prompts):
        t0 = time.time()
        sampling = {"temperature": args.temperature, "seed": i}
        ar = generate(common.CachedTarget(model), prompt, args.new_tokens, **sampling).tokens
        seconds["autoregressive"] += time.time() - t0
        line = []
        for name in args.methods:
            factory, layers, _ = proposers[name]
            t0 = time.time()
            out = generate(common.CachedTarget(model, layers), prompt, args.new_tokens, proposer=factory(), **sampling)
            seconds[name] += time.time() - t0
            forwards[name] += out.num_target_forwards
            h = hist[name]
            h += [0] * (len(out.accept_histogram) - len(h))
            for k, n in enumerate(out.accept_histogram):
                h[k] += n
            if args.temperature <= 0 and out.tokens != ar:
                first = next(j for j, (a, b) in enumerate(zip(out.tokens, ar)) if a != b)
                mismatches.append({"prompt": i, "method": name, "first_diff": first})
            line.append(f"{name} {out.tau:.2f}")
        print(f"[{i + 1}/{len(prompts)} {time.time() - start:.0f}s] " + " ".join(line), flush=True)

    results = {}
    for name in args.methods:
        r = summarize(hist[name])
        r.update(description=proposers[name][2], target_forwards=forwards[name], cpu_seconds=round(seconds[name], 1))
        results[name] = r
    targets = {}
    if "dflash_chain" in results:
        targets["dflash_chain_tau >= 2.5"] = results["dflash_chain"]["tau"] >= 2.5
        if "ddtree_32" in results:
            ratio = results["ddtree_32"]["tau"] / results["dflash_chain"]["tau"]
            targets[f"ddtree_32 / dflash_chain >= 1.35 (is {ratio:.3f})"] = ratio >= 1.35
    if "eagle3_chain" in results and "eagle3_tree" in results:
        targets["eagle3_tree_tau >= eagle3_chain_tau"] = results["eagle3_tree"]["tau"] >= results["eagle3_chain"]["tau"]
    report = {
        "benchmark": "tau of the tiny Kimi-K2.6 drafters, GSM8K test, reference decode loop",
        "decoding": "greedy" if args.temperature <= 0 else f"sampled, temperature {args.temperature:g}, top-p 1",
        "prompts": len(prompts),
        "new_tokens": args.new_tokens,
        "prompt_format": common.PROMPT_FORMAT,
        "target": f"sglang_kimi/assets/tiny-kimi-k2.6 (compact, {args.dtype}, prefix KV cache)",
        "drafters": {"dflash": display(args.dflash), "eagle3": display(args.eagle3)},
        "lossless": not mismatches,
        "mismatches": mismatches,
        "targets": targets,
        "results": results,
        "autoregressive_cpu_seconds": round(seconds["autoregressive"], 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "torch_threads": args.threads},
        "wall_seconds": round(time.time() - start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    plot(results, args.png, report["decoding"])
    print(f"\n{'method':14s} {'tau':>6s}  acceptance by position")
    for name, r in results.items():
        print(f"{name:14s} {r['tau']:6.3f}  " + " ".join(f"{a:.2f}" for a in r["acceptance_by_position"]))
    for t, ok in targets.items():
        print(f"target {t}: {'met' if ok else 'NOT met'}")
    print(f"wrote {args.out} and {args.png}")
    assert not mismatches, f"speculative output differs from autoregressive greedy output: {mismatches}"


if __name__ == "__main__":
    main()
