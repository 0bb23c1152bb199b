#!/usr/bin/env python
"""Benchmark the verify kernels on a CUDA or ROCm GPU; print a table and write JSON to bench/results/.

Sections (``--sections``):

- ``copy``: device-to-device copy of 1 GiB, bytes read + written: the bandwidth ceiling the others are compared to.
- ``attention``: tree MLA attention (bf16, Kimi widths 512 + 64) at TP8/TP4/TP1 head counts, tree sizes 1..64,
  prefixes 1k..32k, batch 1..64. Floor = the bytes it must move: every request's latent KV rows once
  (prefix + N rows of 576 bf16), q, out and the req_to_token entries. Reports achieved GB/s, the fraction of the
  measured copy bandwidth, the ratio to the torch twin, and to SGLang's Triton MLA *decode* kernel run on the same
  work as B*N independent decode queries (what verify costs without a tree kernel: the prefix read N times). The
  default tile is compared with the fused single pass, the HIP tile and a 32x32 tile that does not spill.
- ``ddtree``: batched DDTree build, bs 64, budget 64, depth 7, Kimi vocab: ranking (top-K) and the build kernel,
  against ``speculators.ddtree.build_ddtree`` (batched torch) and the per-request reference heap
  (``speculators.reference.heap.ddtree_heap``: what a CPU heap per request costs, ranking and device copies included).
- ``verify``: tree verification at Kimi vocab, greedy (from logits: argmax only at visited nodes) and sampled,
  against the torch twin (greedy: plus torch.argmax over every node).
- ``moe``: SGLang's fused-MoE Triton kernel at verify M = batch x draft tokens with the plugin's table for this
  device against SGLang's own choice (its table, else its default tiles), for every plugin table of the device.

Timing (``docs/kernels.md``): CUDA events around each call, warm-up first, median of repeats, inputs (the KV cache
included) rotated among enough copies to exceed twice the L2 cache; each kernel timed twice (``ms`` and
``ms_again``) so the spread is visible. Attention also reports ``ms_graph`` (one CUDA-graph replay: the device's time
alone, from which GB/s is computed) and ``host_ms`` (the host's time to issue one call). Never zeros: inputs are
random. Writes ``kernels-<device>-<time>.json`` and, with an attention section, a PNG of the attention times;
``--replot FILE`` redraws the PNG of an existing JSON.

``--interpret-smoke`` runs tiny shapes on the CPU through Triton's interpreter to prove the script end to end;
its timings mean nothing and nothing is written to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SECTIONS = ("copy", "attention", "ddtree", "verify", "moe")
KIMI_VOCAB = 163840


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {SECTIONS}")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="fewer shapes")
    p.add_argument("--interpret-smoke", action="store_true", help="tiny shapes on CPU under Triton's interpreter")
    p.add_argument("--replot", type=Path, help="only redraw the PNG of an existing results JSON (no GPU needed)")
    return p.parse_args(argv)


def plot_attention(rows, meta, path: Path) -> None:
    """Device time of each attention implementation per shape (log scale), from a results file's rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    att = [r for r in rows if r["section"] == "attention" and (r.get("ms_device") or r.get("ms"))]
    cases = list(dict.fromkeys(r["case"] for r in att))
    impls = list(dict.fromkeys(r["impl"] for r in att))
    fig, ax = plt.subplots(figsize=(max(8, 1.9 * len(cases)), 4.8))
    width = 0.8 / max(1, len(impls))
    for i, impl in enumerate(impls):
        xs, ys = [], []
        for j, case in enumerate(cases):
            hit = [r for r in att if r["case"] == case and r["impl"] == impl]
            if hit:
                xs.append(j + (i - (len(impls) - 1) / 2) * width)
                ys.append(hit[0].get("ms_device") or hit[0]["ms"])
        ax.bar(xs, ys, width, label=impl)
    ax.set_xticks(range(len(cases)), [c.replace(" prefix", "\nprefix") for c in cases], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms (CUDA-graph replay; eager where not captured)")
    ax.set_title(f"Tree MLA attention, {meta.get('device')} (torch {meta.get('torch')}, triton {meta.get('triton')})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------------


class Timer:
    """Median milliseconds of ``fn(args)`` over ``reps`` calls, cycling through ``arg_sets``."""

    def __init__(self, torch, device, warmup: int, reps: int):
        self.torch, self.device, self.warmup, self.reps = torch, device, warmup, reps

    def __call__(self, fn, arg_sets) -> float:
        torch = self.torch
        for i in range(self.warmup):
            fn(*arg_sets[i % len(arg_sets)])
        times = []
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            for i in range(self.reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                args = arg_sets[i % len(arg_sets)]
                start.record()
                fn(*args)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
        else:
            for i in range(self.reps):
                args = arg_sets[i % len(arg_sets)]
                t0 = time.perf_counter()
                fn(*args)
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def graph(self, fn, arg_sets) -> float | None:
        """Median milliseconds of one CUDA-graph replay of ``fn(args)`` (one graph per argument set): the device's
        time alone, as a server that captures the step sees it. None off CUDA or where capture fails."""
        torch = self.torch
        if self.device.type != "cuda":
            return None
        try:
            for args in arg_sets:
                fn(*args)  # compile and warm the allocator outside the capture
            torch.cuda.synchronize()
            pool = torch.cuda.graph_pool_handle()
            graphs = []
            for args in arg_sets:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    fn(*args)
                graphs.append(g)
        except Exception:  # noqa: BLE001 - a host synchronisation inside fn: not capturable
            torch.cuda.synchronize()
            return None
        return self(lambda g: g.replay(), [(g,) for g in graphs])

    def host(self, fn, arg_sets) -> float:
        """Median milliseconds the host spends issuing ``fn(args)`` (no wait for the device, idle before each call):
        what an eager caller pays per call however small the work."""
        torch = self.torch
        for i in range(self.warmup):
            fn(*arg_sets[i % len(arg_sets)])
        times = []
        for i in range(self.reps):
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn(*arg_sets[i % len(arg_sets)])
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def copies_for_cache(torch, device, nbytes: int) -> int:
    """How many input copies to rotate among so that together they exceed twice the L2 cache."""
    if device.type != "cuda":
        return 1
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20) or (50 << 20)
    return max(1, min(8, -(-2 * l2 // max(1, nbytes))))


# ---------------------------------------------------------------------------------------------------------------


def bench_copy(ctx):
    torch, device = ctx["torch"], ctx["device"]
    n = (1 << 29) if device.type == "cuda" else (1 << 16)  # 1 GiB of bf16 on the GPU
    x = torch.randn(n, device=device, dtype=torch.float32).to(torch.bfloat16)
    y = torch.empty_like(x)
    ms = ctx["timer"](lambda a, b: b.copy_(a), [(x, y)])
    gbs = 2 * x.numel() * x.element_size() / ms / 1e6
    ctx["copy_gbs"] = gbs
    case = f"{x.numel() * x.element_size() / 2**20:.3g} MiB bf16"
    return [{"section": "copy", "case": case, "impl": "torch copy_", "ms": ms, "GB/s": gbs}]


def _attention_case(torch, device, batch, nodes, heads, prefix, gen):
    from sglang_kimi.speculators.trees import DraftTree

    prefix_lens = torch.randint(max(1, prefix // 2), prefix + 1, (batch,), generator=gen).to(torch.int32)
    lengths = (prefix_lens + nodes).tolist()
    total = sum(lengths)
    slots = torch.randperm(total, generator=gen).to(torch.int32)
    req_to_token = torch.zeros(batch, max(lengths) + 8, dtype=torch.int32)
    start = 0
    for b, n in enumerate(lengths):
        req_to_token[b, :n] = slots[start : start + n]
        start += n
    parents = torch.full((batch, nodes), -1, dtype=torch.long)
    for i in range(1, nodes):
        parents[:, i] = torch.randint(i, (batch,), generator=gen)
    mask = DraftTree.from_parents(torch.zeros(batch, nodes, dtype=torch.long), parents).ancestor_mask()
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    q = torch.randn(batch * nodes, heads, 576, generator=gen).to(dt)
    kv = torch.randn(total, 1, 576, generator=gen).to(dt)
    to = lambda t: t.to(device)  # noqa: E731
    return dict(
        q=to(q),
        kv=to(kv),
        r2t=to(req_to_token),
        pool=to(torch.arange(batch)),
        prefix=to(prefix_lens),
        mask=to(mask),
        lengths=lengths,
    )


def _sglang_decode_baseline(torch, case, heads, nodes, scale):
    """SGLang's Triton MLA decode kernel on the same work as B*N decode queries, each over its request's prefix
    plus the tree slots it sees (its ancestors). Returns a callable, or the reason it cannot run."""
    try:
        from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    except Exception as exc:  # noqa: BLE001
        return f"unavailable: {type(exc).__name__}: {exc}"
    device = case["q"].device
    mask = case["mask"]
    r2t = case["r2t"]
    pieces, counts = [], []
    for b, length in enumerate(case["lengths"]):
        prefix = length - nodes
        row = r2t[b]
        for i in range(nodes):
            seen = row[prefix : prefix + nodes][mask[b, i]]
            pieces += [row[:prefix], seen]
            counts.append(prefix + seen.numel())
    kv_indices = torch.cat(pieces).to(torch.int32)
    kv_indptr = torch.zeros(len(counts) + 1, dtype=torch.int32, device=device)
    kv_indptr[1:] = torch.tensor(counts, device=device).cumsum(0)
    queries = len(counts)
    # SGLang's split workspace is [queries, heads, splits, 512] fp32: keep it under 2 GiB
    max_splits = max(1, min(16, (1 << 31) // (queries * heads * 512 * 4)))
    logits = torch.empty(queries, heads, max_splits, 512, dtype=torch.float32, device=device)
    lse = torch.empty(queries, heads, max_splits, dtype=torch.float32, device=device)
    splits = torch.full((queries,), max_splits, dtype=torch.int32, device=device)
    out = torch.empty(queries, heads, 512, dtype=case["q"].dtype, device=device)

    def run(q, kv):
        decode_attention_fwd(
            q,
            kv,
            kv[..., :512],
            out,
            kv_indptr,
            kv_indices,
            logits,
            lse,
            splits,
            max_splits,
            scale,
            1.0,
            1.0,
            has_mla=True,
        )
        return out

    return run


def _attention_floor_and_inputs(torch, device, case) -> tuple[int, list[tuple]]:
    """The bytes an attention call must move (every request's latent KV rows once, q, out, the req_to_token
    entries), and (q, kv) copies to rotate among: the cache rotated too, so it is not served from L2."""
    elem = case["kv"].element_size()
    kv_rows = sum(case["lengths"])
    floor_bytes = kv_rows * 576 * elem + 2 * case["q"].numel() * elem + kv_rows * 4
    n_copies = copies_for_cache(torch, device, kv_rows * 576 * elem)
    return floor_bytes, [(case["q"].clone(), case["kv"].clone()) for _ in range(n_copies)]


def _timings(ctx, fn, arg_sets, floor_bytes) -> dict:
    """Eager time (events around each call, twice), CUDA-graph replay time, host issue time; bandwidth from the
    device's time (graph replay where it captures, else eager)."""
    timer = ctx["timer"]
    ms, ms2 = timer(fn, arg_sets), timer(fn, arg_sets)
    graph_ms = timer.graph(fn, arg_sets)
    device_ms = graph_ms if graph_ms is not None else ms
    gbs = floor_bytes / device_ms / 1e6
    return {
        "ms": ms,
        "ms_again": ms2,
        "ms_graph": graph_ms,
        "host_ms": timer.host(fn, arg_sets),
        "ms_device": device_ms,
        "GB/s": gbs,
        "of_copy": gbs / ctx["copy_gbs"] if ctx.get("copy_gbs") else None,
    }


def bench_attention(ctx):
    torch, device, timer = ctx["torch"], ctx["device"], ctx["timer"]
    from sglang_kimi.kernels import tree_mla_attention as tm

    if ctx["smoke"]:
        shapes = [(2, 4, 2, 40)]
    elif ctx["quick"]:
        shapes = [(1, 8, 8, 32768), (16, 8, 8, 4096), (64, 16, 8, 1024), (8, 8, 64, 8192), (16, 64, 8, 4096)]
    else:
        shapes = [
            (b, n, h, p)
            for h in (8, 16, 64)
            for n in (1, 4, 8, 16, 32, 64)
            for (b, p) in ((1, 32768), (8, 8192), (64, 1024), (16, 4096))
            if b * n * h * (p + n) <= (1 << 31)  # keep the twin's score tensor bounded
        ]
    scale = tm.mla_sm_scale(128, 64)
    rows = []
    gen = torch.Generator().manual_seed(0)
    for batch, nodes, heads, prefix in shapes:
        case = _attention_case(torch, device, batch, nodes, heads, prefix, gen)
        floor_bytes, qs = _attention_floor_and_inputs(torch, device, case)
        name = f"B={batch} N={nodes} H={heads} prefix<={prefix}"
        common = (case["r2t"], case["pool"], case["prefix"], case["mask"], scale)
        row = {"section": "attention", "case": name, "bytes": floor_bytes}
        variants = [("tree kernel", {}), ("tree kernel fused", {"num_kv_splits": 1})]
        if not ctx["smoke"]:  # the tiles compared in docs/kernels.md: the HIP tile, and one that does not spill
            variants += [
                ("tree kernel 16x16 tile, 1 stage", tm.HIP_TILE),
                ("tree kernel 32x32 tile, 8 warps", {**tm.CUDA_TILE, "block_n": 32, "num_warps": 8}),
            ]
        kernel_ms = None
        for impl, kw in variants:
            fn = lambda q, kv, kw=kw: tm.tree_mla_attention(q, kv, *common, **kw)  # noqa: E731
            rows.append({**row, "impl": impl, **_timings(ctx, fn, qs, floor_bytes)})
            kernel_ms = kernel_ms or rows[-1]["ms_device"]
        ref_ms = (
            timer(lambda q, kv: tm.tree_mla_attention_ref(q, kv, *common), qs[:1])
            if batch * nodes * heads <= 8192
            else None
        )
        rows.append({**row, "impl": "torch twin", "ms": ref_ms, "x_vs_kernel": ref_ms / kernel_ms if ref_ms else None})
        base = _sglang_decode_baseline(torch, case, heads, nodes, scale)
        if callable(base):
            mine = tm.tree_mla_attention(case["q"], case["kv"], *common).float()
            err = float((base(case["q"], case["kv"]).float() - mine).norm() / mine.norm())  # the same, computed twice
            t = _timings(ctx, base, qs, floor_bytes)
            t.pop("ms_again")
            note = f"rel. diff vs tree kernel {err:.1e}"
            rows.append(
                {
                    **row,
                    "impl": "SGLang MLA decode (B*N queries)",
                    **t,
                    "x_vs_kernel": t["ms_device"] / kernel_ms,
                    "note": note,
                }
            )
        else:
            rows.append({**row, "impl": "SGLang MLA decode (B*N queries)", "note": base})
    return rows


def bench_ddtree(ctx):
    torch, device, timer = ctx["torch"], ctx["device"], ctx["timer"]
    from sglang_kimi.kernels import ddtree_build as dd
    from sglang_kimi.speculators.ddtree import build_ddtree, rank_draft_logits
    from sglang_kimi.speculators.reference.heap import ddtree_heap

    batch, length, budget, vocab = (2, 3, 6, 50) if ctx["smoke"] else (64, 7, 64, KIMI_VOCAB)
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(batch, length, vocab, generator=gen) * 3).to(device)
    root = torch.randint(vocab, (batch,), generator=gen).to(device)
    lp, ids = rank_draft_logits(logits, budget)
    same = torch.equal(dd.ddtree_build(root, lp, ids, budget).parents, build_ddtree(root, logits, budget).parents)
    case = f"B={batch} L={length} budget={budget} V={vocab}"
    row = {"section": "ddtree", "case": case, "same_tree": same}
    kernel_ms = timer(lambda: dd.ddtree_build(root, lp, ids, budget), [()])
    kernel_ms2 = timer(lambda: dd.ddtree_build(root, lp, ids, budget), [()])
    rank_ms = timer(lambda: rank_draft_logits(logits, budget), [()])
    torch_ms = timer(lambda: build_ddtree(root, logits, budget), [()])
    heap_timer = Timer(torch, device, 1, 3)
    heap_ms = heap_timer(lambda: ddtree_heap(root, logits, budget), [()])
    return [
        {**row, "impl": "rank (top-K of logits - log-sum-exp)", "ms": rank_ms},
        {**row, "impl": "build kernel", "ms": kernel_ms, "ms_again": kernel_ms2},
        {
            **row,
            "impl": "build_ddtree (torch, incl. ranking)",
            "ms": torch_ms,
            "x_vs_kernel": torch_ms / (kernel_ms + rank_ms),
        },
        {
            **row,
            "impl": "reference heap per request (incl. ranking)",
            "ms": heap_ms,
            "x_vs_kernel": heap_ms / (kernel_ms + rank_ms),
        },
    ]


def _random_tree(torch, device, batch, nodes, vocab, gen):
    from sglang_kimi.speculators.trees import DraftTree

    parents = torch.full((batch, nodes), -1, dtype=torch.long)
    for i in range(1, nodes):
        parents[:, i] = torch.randint(i, (batch,), generator=gen)
    tokens = torch.randint(vocab, (batch, nodes), generator=gen)
    tokens[:, 1:] = torch.randperm(vocab, generator=gen)[: nodes - 1]
    return DraftTree.from_parents(tokens.to(device), parents.to(device))


def bench_verify(ctx):
    torch, device, timer = ctx["torch"], ctx["device"], ctx["timer"]
    from sglang_kimi.kernels import tree_verify as tv
    from sglang_kimi.speculators.verify import Coins, walk_tree

    shapes = [(2, 4, 40)] if ctx["smoke"] else [(64, 16, KIMI_VOCAB), (16, 64, KIMI_VOCAB)]
    rows = []
    gen = torch.Generator().manual_seed(2)
    for batch, nodes, vocab in shapes:
        tree = _random_tree(torch, device, batch, nodes, vocab, gen)
        args = (tree.tokens, tree.retrieve_index(), tree.retrieve_next_token(), tree.retrieve_next_sibling())
        logits = torch.randn(batch, nodes, vocab, generator=gen).to(device)
        probs = torch.softmax(logits, -1)
        coins = torch.rand(batch, nodes, generator=gen).to(device)
        final = torch.rand(batch, generator=gen).to(device)
        spec = tree.max_depth + 1
        block_v = 16 if ctx["smoke"] else None
        case = f"B={batch} N={nodes} V={vocab}"
        g_ms = timer(lambda: tv.tree_verify(*args, num_spec_tokens=spec, target_logits=logits, block_v=block_v), [()])
        g_ref = timer(lambda: walk_tree(tree, target_logits=logits), [()])
        s_kw = dict(
            num_spec_tokens=spec, target_probs=probs, uniform_samples=coins, uniform_samples_for_final_sampling=final
        )
        s_ms = timer(lambda: tv.tree_verify(*args, block_v=block_v, **s_kw), [()])
        twin_coins = Coins(coins, final[:, None].expand(batch, nodes))
        s_ref = timer(lambda: walk_tree(tree, target_probs=probs, coins=twin_coins), [()])
        rows += [
            {"section": "verify", "case": case, "impl": "greedy kernel (logits)", "ms": g_ms},
            {
                "section": "verify",
                "case": case,
                "impl": "greedy torch twin (argmax all nodes)",
                "ms": g_ref,
                "x_vs_kernel": g_ref / g_ms,
            },
            {"section": "verify", "case": case, "impl": "sampled kernel", "ms": s_ms},
            {"section": "verify", "case": case, "impl": "sampled torch twin", "ms": s_ref, "x_vs_kernel": s_ref / s_ms},
        ]
    return rows


def bench_moe(ctx):
    torch, device = ctx["torch"], ctx["device"]
    if device.type != "cuda":
        return [{"section": "moe", "case": "-", "impl": "-", "note": "GPU only (SGLang's fused-MoE Triton kernel)"}]
    from sglang_kimi.kernels import moe_configs as mt
    from sglang_kimi.kernels import moe_tuner as tuner

    try:
        from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return [{"section": "moe", "case": "-", "impl": "-", "note": f"SGLang fused MoE unavailable: {exc}"}]
    device_name = torch.cuda.get_device_name(device).replace(" ", "_")
    tables = mt.tables_for_device(device_name)
    if not tables:
        return [{"section": "moe", "case": device_name, "impl": "-", "note": "no plugin table for this device"}]
    rows = []
    with tuner.sglang_exec_context():
        for name, path in tables:
            info = mt.parse_config_file_name(name)
            if info["down_moe"] or info["dtype"] not in (None, "fp8_w8a8"):
                continue
            try:
                rows += _bench_moe_table(ctx, name, info, mt.read_table(path))
            except Exception as exc:  # noqa: BLE001 - one table's failure is reported, the others still run
                note = f"{type(exc).__name__}: {str(exc)[:200]}"
                rows.append({"section": "moe", "case": name[:-5], "impl": "-", "note": note})
    return rows


def _bench_moe_table(ctx, name, info, plugin):
    """SGLang's fused MoE at each verify M with the plugin's table row against SGLang's own choice."""
    torch, device, timer = ctx["torch"], ctx["device"], ctx["timer"]
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils import override_config
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import (
        get_default_config,
        get_moe_configs,
    )

    from sglang_kimi.kernels import moe_configs as mt
    from sglang_kimi.kernels import moe_tuner as tuner

    original = getattr(get_moe_configs, "__wrapped__", get_moe_configs)  # SGLang's own lookup, even if hooked
    m_values = [4, 8, 16, 32, 64, 128, 256, 512] if not ctx["quick"] else [8, 64, 256]
    gen = torch.Generator(device=device).manual_seed(3)
    dtype = "bf16" if info["dtype"] is None else info["dtype"]
    block = info["block_shape"]
    sglang_table = original(info["E"], info["N"], info["dtype"], *(block or (0, 0)))
    runner = MoeRunnerConfig(inplace=False)
    rows = []
    for M in m_values:
        x, w1, w2, topk_out, kw = tuner._make_moe_inputs(
            info["E"], info["N"], mt.KIMI_HIDDEN, mt.KIMI_TOPK, dtype, block, 32, M, device, gen
        )
        choices = {
            "plugin table": plugin[min(plugin, key=lambda m: abs(m - M))],
            "SGLang choice": sglang_table[min(sglang_table, key=lambda m: abs(m - M))]
            if sglang_table
            else get_default_config(M, info["E"], info["N"], mt.KIMI_HIDDEN, mt.KIMI_TOPK, info["dtype"], False, block),
        }
        results = {}
        for impl, cfg in choices.items():
            with override_config(cfg):
                results[impl] = timer(lambda: fused_experts(x, w1, w2, topk_out, runner, **kw), [()])
        for impl, ms in results.items():
            rows.append(
                {
                    "section": "moe",
                    "case": f"{name[:-5]} M={M}",
                    "impl": impl,
                    "ms": ms,
                    "x_vs_sglang": results["SGLang choice"] / ms,
                }
            )
    return rows


# ---------------------------------------------------------------------------------------------------------------


def print_table(rows):
    cols = [
        "section",
        "case",
        "impl",
        "ms",
        "ms_again",
        "ms_graph",
        "host_ms",
        "GB/s",
        "of_copy",
        "x_vs_kernel",
        "x_vs_sglang",
        "same_tree",
        "note",
    ]
    cols = [c for c in cols if any(r.get(c) is not None for r in rows)]

    def fmt(v):
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    widths = {c: max(len(c), *(len(fmt(r.get(c))) for r in rows)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(fmt(r.get(c)).ljust(widths[c]) for c in cols))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        data = json.loads(args.replot.read_text())
        plot_attention(data["rows"], data["meta"], args.replot.with_suffix(".png"))
        print(f"wrote {args.replot.with_suffix('.png')}")
        return 0
    if args.interpret_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before torch/triton import: Triton decides when kernels are decorated
    import torch

    if not args.interpret_smoke and not torch.cuda.is_available():
        print(
            "bench_kernels.py needs a CUDA or ROCm GPU (torch.cuda.is_available() is False). "
            "Use --interpret-smoke for a tiny CPU run that only proves the script works.",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cpu") if args.interpret_smoke else torch.device("cuda", torch.cuda.current_device())
    warmup, reps = (0, 1) if args.interpret_smoke else (args.warmup, args.reps)
    ctx = {
        "torch": torch,
        "device": device,
        "timer": Timer(torch, device, warmup, reps),
        "smoke": args.interpret_smoke,
        "quick": args.quick,
    }
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        print(f"unknown sections: {sorted(unknown)}", file=sys.stderr)
        return 2
    if "copy" not in sections and device.type == "cuda":
        sections.insert(0, "copy")  # every bandwidth figure is compared with this run's copy
    rows = []
    for section in SECTIONS:
        if section in sections:
            rows += globals()[f"bench_{section}"](ctx)
    print_table(rows)
    if args.interpret_smoke:
        print("\n(interpret smoke: CPU interpreter timings are meaningless; nothing written)")
        return 0
    import triton

    meta = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "hip": torch.version.hip,
        "copy_GBps": ctx.get("copy_gbs"),
        "warmup": warmup,
        "reps": reps,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = args.out_dir / f"kernels-{meta['device'].replace(' ', '_')}-{stamp}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\nwrote {path}")
    if any(r["section"] == "attention" for r in rows):
        plot_attention(rows, meta, path.with_suffix(".png"))
        print(f"wrote {path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
