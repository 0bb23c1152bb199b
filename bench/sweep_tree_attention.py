#!/usr/bin/env python
"""Sweep the launch parameters of the tree MLA attention kernel on a GPU; print a table, write JSON.

For each shape (batch B, tree nodes N, heads H, longest prefix) every candidate configuration (query tile BLOCK_M,
key block BLOCK_N, warps, software-pipelining stages, key-tile layout, prefix splits relative to
``default_config``) is run on the same random inputs as ``bench/bench_kernels.py``, checked against the default
configuration's output (relative norm error under 1e-2, bf16), and timed with CUDA events (median; the KV cache and
q are rotated among copies that exceed twice the L2 cache). A configuration that does not compile or does not fit
is listed with its error. Phases run in order, each within ``--budget-s`` seconds of the start:

1. layout x stages x BLOCK_N at the default tile and warps;
2. tiles and warps at the best layout and stages of phase 1;
3. prefix splits (x0.5 .. x4 of the default) at the best configuration so far.

The best configuration per shape and the one best over all shapes (geometric mean of time relative to each
shape's best) end the table; ``kernels/tree_mla_attention.py``'s ``default_config`` is where a winner goes.

    python bench/sweep_tree_attention.py --out-dir bench/results
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernels import RESULTS, Timer, _attention_case, _attention_floor_and_inputs  # noqa: E402

SHAPES = [(1, 8, 8, 32768), (16, 8, 8, 4096), (64, 16, 8, 1024), (8, 8, 64, 8192)]  # (B, N, H, prefix<=)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--budget-s", type=float, default=240.0, help="stop starting new configurations after this")
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        print("sweep_tree_attention.py needs a CUDA or ROCm GPU", file=sys.stderr)
        return 2
    from sglang_kimi.kernels import tree_mla_attention as tm

    t_start = time.monotonic()
    device = torch.device("cuda", torch.cuda.current_device())
    timer = Timer(torch, device, 5, args.reps)
    scale = tm.mla_sm_scale(128, 64)
    gen = torch.Generator().manual_seed(0)
    cases = []
    for B, N, H, P in SHAPES:
        case = _attention_case(torch, device, B, N, H, P, gen)
        floor, sets = _attention_floor_and_inputs(torch, device, case)
        default = tm.default_config(N, H, B, case["r2t"].shape[1], device)
        ref = tm.tree_mla_attention(
            case["q"], case["kv"], case["r2t"], case["pool"], case["prefix"], case["mask"], scale
        )
        cases.append(
            dict(name=f"B={B} N={N} H={H} prefix<={P}", case=case, sets=sets, default=default, ref=ref, floor=floor)
        )

    rows = []

    def run(cfg: dict) -> list[dict]:
        out = []
        for c in cases:
            full = {**c["default"], **cfg}
            if "splits_x" in cfg:
                full["num_kv_splits"] = max(1, round(c["default"]["num_kv_splits"] * cfg["splits_x"]))
                del full["splits_x"]
            kw = {k: full[k] for k in ("block_m", "block_n", "num_warps", "num_stages", "k_rows", "num_kv_splits")}
            cs = c["case"]
            common = (cs["r2t"], cs["pool"], cs["prefix"], cs["mask"], scale)
            row = {"case": c["name"], **full}
            try:
                got = tm.tree_mla_attention(cs["q"], cs["kv"], *common, **kw)
                err = float((got.float() - c["ref"].float()).norm() / c["ref"].float().norm())
                ms = timer(lambda q, kv: tm.tree_mla_attention(q, kv, *common, **kw), c["sets"])
                row.update(ms=ms, rel_err=err, GBps=c["floor"] / ms / 1e6, ok=err < 1e-2)
            except Exception as exc:  # noqa: BLE001 - out of shared memory, compile failure: listed
                row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:160]}")
            out.append(row)
            print(
                f"{row['case']:28s} m{full['block_m']:<3d} n{full['block_n']:<3d} w{full['num_warps']} "
                f"s{full['num_stages']} rows{int(bool(full['k_rows']))} splits{full['num_kv_splits']:<3d} "
                + (
                    f"{row['ms']:.4f} ms {row['GBps']:.0f} GB/s err {row['rel_err']:.1e}"
                    if "ms" in row
                    else row["error"]
                ),
                flush=True,
            )
        rows.extend(out)
        return out

    def score(cfg_rows):
        if not all(r.get("ok") for r in cfg_rows):
            return math.inf
        return sum(math.log(r["ms"]) for r in cfg_rows)

    def in_budget():
        return time.monotonic() - t_start < args.budget_s

    best_cfg, best_score = {}, math.inf
    for k_rows, stages, block_n in itertools.product((False, True), (1, 2, 3), (16, 32)):
        if not in_budget():
            break
        cfg = {"k_rows": k_rows, "num_stages": stages, "block_n": block_n}
        s = score(run(cfg))
        if s < best_score:
            best_cfg, best_score = cfg, s
    for block_m, block_n, warps in itertools.product((16, 32, 64), (16, 32, 64), (4, 8)):
        cfg = {**best_cfg, "block_m": block_m, "block_n": block_n, "num_warps": warps}
        if not in_budget() or all(cfg.get(k) == best_cfg.get(k) for k in cfg):
            continue
        s = score(run(cfg))
        if s < best_score:
            best_cfg, best_score = cfg, s
    for splits_x in (0.5, 2, 4):
        if not in_budget():
            break
        cfg = {**best_cfg, "splits_x": splits_x}
        s = score(run(cfg))
        if s < best_score:
            best_cfg, best_score = cfg, s

    print(f"\nbest over all shapes: {best_cfg} (geometric-mean score {best_score:.3f})")
    for c in cases:
        mine = [r for r in rows if r["case"] == c["name"] and r.get("ok")]
        if mine:
            b = min(mine, key=lambda r: r["ms"])
            print(f"best for {c['name']}: {b['ms']:.4f} ms, {b['GBps']:.0f} GB/s: {b}")
    meta = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "reps": args.reps,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "best_over_shapes": best_cfg,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = (
        args.out_dir / f"sweep_tree_attention-{meta['device'].replace(' ', '_')}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
