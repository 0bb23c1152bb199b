#!/usr/bin/env python
"""Sampled tree verification at Kimi-K2.6's vocabulary (163,840 tokens): the target's probabilities as the
non-speculative sampler draws from them (``speculators.verify.process_logits``) and the sampled walk over them
(``walk_tree``), against one softmax pass over the same rows, and against the same code at an earlier revision.

    python bench/bench_sampled_verify.py                          # bs 1 / 8 / 32, N 9 / 17, top-p 0.95 and top-k 50
    python bench/bench_sampled_verify.py --before 268e251~1      # the revision to compare with (default: none)
    python bench/bench_sampled_verify.py --batches 1 --nodes 9 --repeats 3   # a quick look

For each batch size B and window N (rows R = B * N), each filter (``top-p 0.95`` alone, as chat clients send it,
and ``top-k 50``) and each kind of logits:
- ``peaked``: N(0, 5^2) logits: a nucleus of tens to hundreds of tokens, as a language model's usually is;
- ``flat``: N(0, 1) logits: a nucleus of most of the vocabulary (the worst case of any partial selection).

Columns: the median time of ``softmax`` (one pass, the unit), of ``process_logits`` alone and of the whole sampled
verify (``process_logits`` + the walk with its bonus draw), as ratios to the softmax; and the extra peak bytes of the
sampled verify over the probabilities' own ``R * V * 4`` bytes (the peak of the tensors the call creates that are
alive at once, counted by a torch dispatch mode). Timings on one CPU thread, repeats interleaved
(before / after / softmax in turn). Writes ``bench/results/bench_sampled_verify.json`` and ``.png``; the targets
(time <= 2x one softmax pass, extra peak bytes <= 2x the probabilities') are reported, never tuned for.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
VOCAB = 163_840
FILTERS = {"top-p 0.95": dict(top_k=0, top_p=0.95), "top-k 50": dict(top_k=50, top_p=1.0)}
LOGITS = {"peaked": 5.0, "flat": 1.0}


def load_verify(revision: str | None):
    """``speculators.verify`` of the working tree, or of ``revision`` (its ``verify.py`` and ``trees.py`` from git,
    imported as a package of their own)."""
    if revision is None:
        from sglang_kimi.speculators import verify

        return verify
    folder = Path(tempfile.mkdtemp()) / "speculators_before"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for name in ("verify.py", "trees.py"):
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{revision}:speculators/{name}"], check=True,
                              capture_output=True, text=True).stdout  # fmt: skip
        (folder / name).write_text(text)
    sys.path.insert(0, str(folder.parent))
    return importlib.import_module("speculators_before.verify")


def case(batch: int, nodes: int, kind: str, seed: int = 0):
    """Logits [B, N, V], a chain of N - 1 drafts per request (each the row's most likely token, so the walk goes
    deep), and coins."""
    from sglang_kimi.speculators.trees import build_chain
    from sglang_kimi.speculators.verify import random_coins

    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((batch, nodes, VOCAB), generator=gen).mul_(LOGITS[kind])  # no temporary
    tree = build_chain(logits[:, 0].argmax(-1), logits[:, :-1].argmax(-1))
    return logits, tree, random_coins(batch, nodes, generator=gen)


def sampled_verify(module, logits, tree, coins, top_k: int, top_p: float):
    """What the tree worker runs for a sampled step: the processed probabilities, then the walk."""
    batch, nodes, vocab = logits.shape
    max_top_k = top_k if top_k > 0 else None
    probs = module.process_logits(logits.view(-1, vocab), 1.0, top_k, top_p, max_top_k=max_top_k)
    return module.walk_tree(tree, target_probs=probs.view(batch, nodes, vocab), coins=coins)


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


class _LiveBytes(TorchDispatchMode):
    """The peak bytes of the tensors created under it and alive at once (each storage counted once, freed when
    its last tensor is collected)."""

    def __init__(self, existing: tuple[torch.Tensor, ...]):
        super().__init__()
        self.live = self.peak = 0
        self._seen = set()
        self._existing = {t.untyped_storage().data_ptr() for t in existing}  # inputs an op may return as they are

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self._seen and key not in self._existing and storage.nbytes():
                    self._seen.add(key)
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, key, storage.nbytes())
        return out

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes


def peak_extra_bytes(fn, probs_bytes: int, inputs: tuple[torch.Tensor, ...]) -> int:
    """Peak bytes of the tensors ``fn`` allocates (``inputs`` not counted), beyond the probabilities' own
    ``probs_bytes``."""
    with _LiveBytes(inputs) as mode:
        fn()
    return mode.peak - probs_bytes


def run(args) -> list[dict]:
    torch.set_num_threads(1)
    after = load_verify(None)
    before = load_verify(args.before) if args.before else None
    rows = []
    print(f"{'B':>3} {'N':>3} {'logits':<7} {'filter':<11} {'softmax ms':>10} {'process x':>9} {'verify x':>8} "
          f"{'before x':>8} {'extra/probs':>11} {'before':>7}")  # fmt: skip
    for batch in args.batches:
        for nodes in args.nodes:
            for kind in LOGITS:
                logits, tree, coins = case(batch, nodes, kind)
                flat = logits.view(-1, VOCAB)
                for filt, params in FILTERS.items():
                    max_top_k = params["top_k"] or None
                    fns = {
                        "softmax": lambda: torch.softmax(flat, dim=-1),
                        "process_logits": lambda: after.process_logits(flat, 1.0, max_top_k=max_top_k, **params),
                        "sampled_verify": lambda: sampled_verify(after, logits, tree, coins, **params),
                    }
                    if before is not None:
                        fns["before"] = lambda: sampled_verify(before, logits, tree, coins, **params)
                    times = {name: [] for name in fns}
                    for _ in range(args.repeats):  # interleaved
                        for name, fn in fns.items():
                            times[name] += timed(fn, 1)
                    med = {name: statistics.median(ts) for name, ts in times.items()}
                    probs_bytes = batch * nodes * VOCAB * 4
                    inputs = (
                        logits,
                        tree.tokens,
                        tree.parents,
                        tree.depths,
                        tree.num_nodes,
                        coins.uniform,
                        coins.final,
                    )
                    extra = peak_extra_bytes(fns["sampled_verify"], probs_bytes, inputs) if args.memory else None
                    extra_before = peak_extra_bytes(fns["before"], probs_bytes, inputs) if (
                        args.memory and before is not None) else None  # fmt: skip
                    row = {
                        "batch_size": batch, "nodes": nodes, "rows": batch * nodes, "logits": kind, "filter": filt,
                        "median_ms": {name: value * 1e3 for name, value in med.items()},
                        "process_over_softmax": med["process_logits"] / med["softmax"],
                        "verify_over_softmax": med["sampled_verify"] / med["softmax"],
                        "before_over_softmax": med["before"] / med["softmax"] if before is not None else None,
                        "extra_peak_over_probs": extra / probs_bytes if extra is not None else None,
                        "before_extra_peak_over_probs": extra_before / probs_bytes if extra_before is not None
                        else None,
                    }  # fmt: skip
                    rows.append(row)

                    def show(value, width):
                        return f"{value:>{width}.2f}" if value is not None else f"{'-':>{width}}"

                    print(f"{batch:>3} {nodes:>3} {kind:<7} {filt:<11} {med['softmax'] * 1e3:>10.2f} "
                          f"{show(row['process_over_softmax'], 9)} {show(row['verify_over_softmax'], 8)} "
                          f"{show(row['before_over_softmax'], 8)} {show(row['extra_peak_over_probs'], 11)} "
                          f"{show(row['before_extra_peak_over_probs'], 7)}", flush=True)  # fmt: skip
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = [f"{r['batch_size']}x{r['nodes']}\n{r['logits']}\n{r['filter']}" for r in rows]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["verify_over_softmax"] for r in rows], width=0.4, label="sampled verify (now)")
    if any(r["before_over_softmax"] is not None for r in rows):
        ax.bar([i + 0.2 for i in x], [r["before_over_softmax"] or 0 for r in rows], width=0.4, label="before")
    ax.axhline(2.0, color="red", linestyle=":", linewidth=1, label="target: 2x one softmax")
    ax.set_yscale("log")
    ax.set_xticks(list(x), labels, fontsize=6)
    ax.set_ylabel("time / one softmax pass over the rows")
    ax.set_title(f"Sampled verify at V = {VOCAB} (one CPU thread)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--nodes", type=int, nargs="+", default=[9, 17])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", help="a git revision whose speculators/verify.py to time beside (e.g. HEAD~1)")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory count")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_sampled_verify.json")
    args = parser.parse_args()
    rows = run(args)
    targets = []
    for r in rows:
        name = f"B {r['batch_size']} N {r['nodes']} {r['logits']} {r['filter']}"
        met = "met" if r["verify_over_softmax"] <= 2.0 else "MISSED"
        targets.append(f"{name}: sampled verify {r['verify_over_softmax']:.2f}x one softmax (target <= 2x): {met}")
        if r["extra_peak_over_probs"] is not None:
            met = "met" if r["extra_peak_over_probs"] <= 2.0 else "MISSED"
            targets.append(f"{name}: extra peak {r['extra_peak_over_probs']:.2f}x the probabilities (target <= 2x): "
                           f"{met}")  # fmt: skip
    print("\n".join(targets))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data = {"vocab": VOCAB, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "rows": rows, "targets": targets}  # fmt: skip
    args.out.write_text(json.dumps(data, indent=1))
    plot(rows, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
