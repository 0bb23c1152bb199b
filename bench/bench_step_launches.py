#!/usr/bin/env python
"""What a DFLASH tree step costs the host against SGLang's own DFLASH chain step, on real SGLang servers (CPU, the
embedded tiny Kimi and its DFlash drafter).

    python bench/bench_step_launches.py                  # chain and trees of budget 8, 16, 32; concurrency 1 and 8
    python bench/bench_step_launches.py --budgets 8 --concurrency 1 --repeats 1 --tp2-budgets ""   # a quick look

For every configuration and concurrency level, with the servers side by side (idle ones sleep):
- **operators and host synchronisations per step** outside the target forward, per phase: SGLang's torch profiler
  (``/start_profile``, CPU activity) over ``--profile-steps`` decode steps; an operator is a top-level ``aten::`` call
  of the step's thread (one dispatch from Python: on a GPU, roughly a kernel launch), a synchronisation an operator
  that reads the device on the host or gives a shape that depends on data (``aten::_local_scalar_dense``: ``.item()``
  and ``bool()``, ``aten::nonzero``, boolean indexing, ``unique``). The step is the ``sglang_kimi.step`` range and the
  target forward the ``sglang_kimi.target_forward`` range (``sglang_kimi/speculative/step_phases.py``, for SGLang's
  chain worker and the plugin's tree worker alike); the tree worker's own phases split the rest, and SGLang's own
  ranges inside the step (its drafter's ``step[DRAFT]``) are phases ``sglang:...``. The profile is taken with Python
  stacks, and each synchronisation is listed with the Python function it runs in. On a CPU the device is the host:
  ``int(seq_lens_cpu.sum())``, a read of host metadata that costs a GPU step nothing, counts as one, and so do the
  CPU stand-ins of SGLang's kernels; the listing tells them apart.
- **host time per step**, without a profiler: the servers' step clock (``/server_info``'s ``spec_metrics``:
  ``host_ms_per_step``, the whole decode step on this CPU, and the part outside the target forward) over one pass of
  ``concurrency`` streaming requests of ``--max-new-tokens``, repeated ``--repeats`` times with the configurations
  interleaved; medians of the repeats, with tokens/s and tau.

Sampled decoding (``--sampled-temperature``, 0.7 by default) takes the tree worker's sampled verification (the
target's probabilities, the coins, the inverse-CDF bonus): each TP 1 configuration is profiled once more with
sampled requests, and its operators and synchronisations are shown apart, without targets.

``adaptive@chain`` is adaptive DFLASH chains (``--speculative-kimi-adaptive``) whose only width is the block's full
chain: every step is then SGLang's own chain step, called by the plugin's worker, and it should cost what SGLang's
chain server costs.

At tensor parallelism 2 (``--tp2-budgets``: the chain, adaptive@chain and trees of these budgets, ``-tp2`` in their
names) the same profile is taken, without the timed passes: the ranking then gathers the ranks' shard candidates,
and its operators and synchronisations are the ones to count (rank 0's trace).

Prints a table with every ratio against the chain at the same concurrency (and tensor parallelism): operators
outside the target forward (``ops x``) and outside both the target's and the drafter's forwards (``out x``: on a
GPU the drafter forward is one graph replay for chain and tree alike, so this is the work a tree step adds), writes
``bench/results/bench_step_launches.json`` and ``bench_step_launches.png``, and reports the targets (never tuned
for): no synchronisation in the tree worker's own device work (the ``draft_rank``, ``tree_build`` and
``verify_accept`` phases) on the greedy path; operators per tree step outside both forwards <= 1.25x the chain's at
budgets 8 and 16; tree step time at budget 8 <= 1.15x the chain's; adaptive@chain's operators and step time <= 1.05x
the chain's. The tree build is the torch reference here and one Triton kernel on a GPU: its operators are shown
apart.
"""

from __future__ import annotations

import argparse
import bisect
import json
import platform
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO / "scripts"))

import requests  # noqa: E402

PREFIX = "sglang_kimi."
STEP, TARGET = PREFIX + "step", PREFIX + "target_forward"
# operators that read the device on the host, or whose output shape depends on data
SYNC_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2", "aten::unique_dim",
            "aten::unique_consecutive", "aten::_unique"}  # fmt: skip
SERVER_ARGS = ["--attention-backend", "kimi_cpu", "--max-total-tokens", "16384"]


TP2 = "-tp2"  # the suffix of a configuration served at tensor parallelism 2 (profiled, not timed)
ADAPTIVE_CHAIN = "adaptive@chain"  # adaptive DFLASH chains held at the block's full chain
# the drafter forward's own range in a step: SGLang's DFLASH worker names it, for the chain and the tree worker alike
DRAFTER_FORWARD = "sglang:step[DRAFT]"
# SGLang's chain's argmax of its drafts (eager here: the ops its Python function runs, named as a phase)
CHAIN_ARGMAX, CHAIN_ARGMAX_FUNCTION = "sglang:draft_argmax", "_greedy_sample_from_vocab_parallel_head"
# What one drafter graph replay holds on a GPU: the drafter's forward and its captured tail, SGLang's argmax for the
# chain, the ranking and the tree build for a tree (drafter_graph.DraftTail, at TP 1 and TP > 1)
DRAFTER_GRAPH_PHASES = (DRAFTER_FORWARD, CHAIN_ARGMAX, "draft_rank", "tree_build")
# Reads a CPU makes of its own memory that a GPU step never makes: the ranking's check that every tie at the cut
# survived (speculators.trees.topk_lowest_index_ties reads it on a CPU only, to re-rank such rows exactly)
CPU_ONLY_SYNC_FUNCTIONS = ("topk_lowest_index_ties",)


def configurations(budgets: list[int], tp2_budgets: list[int] = (), folder: Path | None = None) -> dict[str, list[str]]:
    """The servers: SGLang's chain, the trees, and adaptive chains whose only width is the block's full chain (the
    step SGLang's chain step serves), each at TP 1 and, with ``tp2_budgets``, the chain, those trees and adaptive
    at TP 2. ``folder``: where adaptive's settings and cost profile are written."""
    from sglang_kimi.assets import TINY_DFLASH

    dflash = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(TINY_DFLASH)]
    folder = folder or Path(tempfile.mkdtemp(prefix="bench_step_launches-"))
    block = int(json.loads((TINY_DFLASH / "config.json").read_text())["block_size"])
    (folder / "adaptive-chain.json").write_text(json.dumps({"widths": [block - 1]}))

    def adaptive(suffix: str) -> list[str]:
        settings, profile = folder / "adaptive-chain.json", folder / f"adaptive-profile{suffix}.json"
        return ["--speculative-kimi-adaptive", "--speculative-kimi-adaptive-config", str(settings),
                "--speculative-kimi-adaptive-profile", str(profile)]  # fmt: skip

    configs = {"dflash-chain": dflash}
    for budget in budgets:
        configs[f"dflash-tree-{budget}"] = [*dflash, "--speculative-dflash-tree-budget", str(budget)]
    configs[ADAPTIVE_CHAIN] = [*dflash, *adaptive("")]
    if tp2_budgets:
        configs["dflash-chain" + TP2] = [*dflash, "--tp", "2"]
        configs[ADAPTIVE_CHAIN + TP2] = [*dflash, *adaptive(TP2), "--tp", "2"]
        for budget in tp2_budgets:
            configs[f"dflash-tree-{budget}{TP2}"] = [
                *dflash,
                "--speculative-dflash-tree-budget",
                str(budget),
                "--tp",
                "2",
            ]
    return configs


def chain_of(name: str) -> str:
    """The chain a configuration is compared with: SGLang's DFLASH chain at the same tensor parallelism."""
    return "dflash-chain" + (TP2 if name.endswith(TP2) else "")


def budget_of(name: str) -> int | None:
    """A tree configuration's budget; None for adaptive chains."""
    base = name.removesuffix(TP2)
    return None if base == ADAPTIVE_CHAIN else int(base.rsplit("-", 1)[1])


# ---------------------------------------------------------------------------------------------------------------
# The trace: operators and synchronisations per step, per phase


def _phase_name(span: str) -> str:
    """A phase's label: the plugin's ranges without their prefix; SGLang's own (its DFLASH worker's
    ``step[DRAFT bs=8]``) as ``sglang:`` and the name without the batch size."""
    if span.startswith(PREFIX):
        return span[len(PREFIX) :]
    return "sglang:" + re.sub(r"\s*bs=\d+", "", span)


def step_operators(events: list[dict]) -> dict:
    """Per decode step (the ``sglang_kimi.step`` ranges of a trace's events): top-level operators and
    synchronisations outside the target forward, per phase (the innermost range of the step that holds the
    operator; ``other`` for what none holds), averaged over the steps."""
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    steps = [e for e in spans if e.get("name") == STEP]
    if not steps:
        return {"steps": 0}
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    calls = _python_calls(events)
    per_phase: dict[str, float] = {}
    syncs_per_phase: dict[str, float] = {}
    sync_sites: dict[str, float] = {}
    for step in steps:
        key, start, end = (step.get("pid"), step.get("tid")), step["ts"], step["ts"] + step.get("dur", 0)
        inside = [e for e in spans if (e.get("pid"), e.get("tid")) == key and start <= e["ts"] <= end]
        targets = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in inside if e["name"] == TARGET]
        phases = [(e["ts"], e["ts"] + e.get("dur", 0), _phase_name(e["name"])) for e in inside
                  if e["name"] not in (STEP, TARGET)]  # fmt: skip
        thread = sorted(
            (e for e in ops if (e.get("pid"), e.get("tid")) == key and start <= e["ts"] <= end), key=lambda e: e["ts"]
        )
        open_until = -1.0  # the end of the top-level operator containing the events that follow
        for e in thread:
            ts = e["ts"]
            if any(a <= ts <= b for a, b in targets):
                continue
            holding = [p for p in phases if p[0] <= ts <= p[1]]
            phase = max(holding)[2] if holding else "other"  # the innermost: the latest to start
            if phase == "other" and _inside(calls, ts, CHAIN_ARGMAX_FUNCTION):
                phase = CHAIN_ARGMAX
            if e["name"] in SYNC_OPS:
                syncs_per_phase[phase] = syncs_per_phase.get(phase, 0) + 1
                site = f"{phase}: {e['name']} in {_caller(calls, ts)}"
                sync_sites[site] = sync_sites.get(site, 0) + 1
            if ts >= open_until:  # a top-level operator
                per_phase[phase] = per_phase.get(phase, 0) + 1
                open_until = ts + e.get("dur", 0)
    n = len(steps)
    return {
        "steps": n,
        "operators_per_step": sum(per_phase.values()) / n,
        # outside what a GPU's drafter graph replay holds too (the drafter's forward and its captured tail)
        "operators_outside_forwards": (sum(per_phase.values()) - sum(per_phase.get(p, 0) for p in DRAFTER_GRAPH_PHASES))
        / n,
        "syncs_per_step": sum(syncs_per_phase.values()) / n,
        "operators_per_phase": {k: round(v / n, 2) for k, v in sorted(per_phase.items())},
        "syncs_per_phase": {k: round(v / n, 2) for k, v in sorted(syncs_per_phase.items())},
        "sync_sites": {k: round(v / n, 2) for k, v in sorted(sync_sites.items())},
    }


def _python_calls(events: list[dict]) -> list[tuple[float, float, str]]:
    """The trace's Python functions outside torch and builtins (a profile taken ``with_stack``), as (start, end,
    "file(line of its def): name") sorted by start; empty without stacks."""
    calls = [(e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
             if e.get("cat") == "python_function" and e.get("ph") == "X" and "torch/" not in e["name"]
             and not e["name"].startswith("<built-in")]  # fmt: skip
    return sorted(calls)


def _inside(calls: list[tuple[float, float, str]], ts: float, function: str) -> bool:
    """Whether a Python function named ``function`` is running at ``ts`` (a profile taken with stacks)."""
    return any(c[1] >= ts and function in c[2] for c in calls[: bisect.bisect_right(calls, (ts, float("inf"), ""))])


def _caller(calls: list[tuple[float, float, str]], ts: float) -> str:
    """The innermost Python call outside torch running at ``ts``, from ``site-packages`` or the repository on."""
    holding = [c for c in calls[: bisect.bisect_right(calls, (ts, float("inf"), ""))] if c[1] >= ts]
    if not holding:
        return "?"
    name = max(holding)[2]
    for root in ("site-packages/", str(REPO) + "/"):
        name = name.split(root, 1)[-1]
    return name


def profile_level(
    base_url: str, prompts: list[str], folder: Path, steps: int, concurrency: int, temperature: float = 0.0
) -> dict:
    check = _gpu_serve_check()
    result = check.profile(
        base_url, prompts, folder, steps, concurrency, check.PROFILE_MAX_NEW_TOKENS, True, temperature
    )
    return step_operators(check.trace_events(folder.parent / result["trace"]))  # the path is relative to the parent


def _gpu_serve_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_serve_check", REPO / "scripts" / "gpu_serve_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------------------------
# Host time per step, without a profiler


def spec_metrics(base_url: str) -> dict:
    from sglang_kimi.launcher.server import fetch_plugin_state

    return fetch_plugin_state(base_url).get("spec_metrics") or {}


def timed_level(base_url: str, prompts: list[str], concurrency: int, max_new_tokens: int) -> dict:
    """One pass of ``concurrency`` greedy requests; the step clock's and the acceptance counters' change."""
    before = spec_metrics(base_url)
    body = {"sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}

    def one(i: int) -> int:
        r = requests.post(base_url + "/generate", json={"text": prompts[i % len(prompts)], **body}, timeout=900)
        r.raise_for_status()
        return r.json()["meta_info"]["completion_tokens"]

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(one, range(concurrency)))
    seconds = time.perf_counter() - started
    after = spec_metrics(base_url)
    steps = after.get("decode_steps", 0) - before.get("decode_steps", 0)
    if steps <= 0:
        raise RuntimeError(f"{base_url}: no DFLASH decode step was timed (the step clock did not advance)")

    def per_step(key: str) -> float:  # the mean over this pass's steps, from the running means before and after
        total = after[key] * after["decode_steps"] - before.get(key, 0.0) * before.get("decode_steps", 0)
        return total / steps

    hist = [a - b for a, b in zip(after.get("accept_length_histogram", []), before.get("accept_length_histogram", []))]
    request_steps = sum(hist)
    tau = 1 + sum(a * n for a, n in enumerate(hist)) / request_steps if request_steps else None
    return {
        "tokens_per_s": tokens / seconds,
        "tau": tau,
        "decode_steps": steps,
        "host_ms_per_step": per_step("host_ms_per_step"),
        "host_ms_outside_target_forward": per_step("host_ms_per_step_outside_target_forward"),
    }


# ---------------------------------------------------------------------------------------------------------------


def run(args) -> dict:
    from sglang_kimi.cli.demo import gsm8k_prompt, load_questions
    from sglang_kimi.launcher.server import ANY_PORT, ServerProcess, launch_command

    prompts = [gsm8k_prompt(q) for q in load_questions()]
    out_dir = Path(tempfile.mkdtemp(prefix="bench_step_launches-"))
    configs = configurations(args.budgets, args.tp2_budgets, out_dir)
    rows: dict[str, dict[int, dict]] = {name: {c: {"timed": []} for c in args.concurrency} for name in configs}
    with ExitStack() as stack:
        servers = {}
        for name, config_args in configs.items():
            server = ServerProcess(launch_command([*SERVER_ARGS, *config_args], port=ANY_PORT), out_dir / f"{name}.log")
            stack.callback(server.stop)
            started = time.monotonic()
            server.wait_ready(900)
            print(f"[{name}] ready in {time.monotonic() - started:.0f} s", flush=True)
            servers[name] = server.base_url
            timed_level(server.base_url, prompts, 1, 16)  # warm-up: the first requests of a server run slower
        names = [name for name in configs if not name.endswith(TP2)]  # timed; TP 2 is profiled only
        for r in range(args.repeats):
            for i, c in enumerate(args.concurrency):
                shift = (r * len(args.concurrency) + i) % len(names)  # rotate the order from round to round
                for name in names[shift:] + names[:shift]:
                    rows[name][c]["timed"].append(timed_level(servers[name], prompts, c, args.max_new_tokens))
                print(f"  repeat {r + 1}/{args.repeats}, c={c} timed", flush=True)
        for name in configs:
            for c in args.concurrency:
                folder = out_dir / f"profile-{name}-c{c}"
                rows[name][c]["profile"] = profile_level(servers[name], prompts, folder, args.profile_steps, c)
                if args.sampled_temperature > 0 and not name.endswith(TP2):
                    rows[name][c]["profile_sampled"] = profile_level(
                        servers[name], prompts, folder.with_name(folder.name + "-sampled"), args.profile_steps, c,
                        args.sampled_temperature,
                    )  # fmt: skip
                print(f"  [{name}] c={c} profiled", flush=True)
    for name in rows:
        for c, row in rows[name].items():
            timed = row["timed"]
            for key in ("tokens_per_s", "tau", "host_ms_per_step", "host_ms_outside_target_forward"):
                values = [t[key] for t in timed if t[key] is not None]
                row[key] = statistics.median(values) if values else None
    return {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "python": sys.version},
        "args": dict(vars(args)),
        "rows": rows,
    }


def ratios(results: dict) -> dict:
    """Every tree configuration against the chain at the same concurrency and tensor parallelism (a ratio of a
    quantity not measured, the TP 2 configurations' times, is None)."""
    rows = results["rows"]

    def ratio(a, b):
        return None if a is None or b is None else a / b

    out = {}
    for name, levels in rows.items():
        if name == chain_of(name):
            continue
        for c, row in levels.items():
            ref = rows[chain_of(name)][c]
            out.setdefault(name, {})[c] = {
                "operators": row["profile"]["operators_per_step"] / ref["profile"]["operators_per_step"],
                "operators_outside_forwards": ratio(
                    row["profile"].get("operators_outside_forwards"), ref["profile"].get("operators_outside_forwards")
                ),
                **{
                    key: ratio(row.get(key), ref.get(key))
                    for key in ("host_ms_per_step", "host_ms_outside_target_forward", "tokens_per_s")
                },
                "operators_sampled": ratio(
                    row.get("profile_sampled", {}).get("operators_per_step"),
                    ref.get("profile_sampled", {}).get("operators_per_step"),
                ),
            }
    return out


# the tree worker's own device work: the draft ranking, the tree build, verification and commit
DEVICE_PHASES = ("draft_rank", "tree_build", "verify_accept")


def device_phase_syncs(profile: dict) -> tuple[float, float]:
    """Synchronisations per step in the tree worker's own device phases: (those a GPU makes too, those a CPU only
    makes: :data:`CPU_ONLY_SYNC_FUNCTIONS`), from the listing of each one's Python function."""
    total = sum(profile.get("syncs_per_phase", {}).get(phase, 0) for phase in DEVICE_PHASES)
    cpu_only = sum(count for site, count in profile.get("sync_sites", {}).items()
                   if site.split(":", 1)[0] in DEVICE_PHASES
                   and any(f"): {fn}" in site for fn in CPU_ONLY_SYNC_FUNCTIONS))  # fmt: skip
    return total - cpu_only, cpu_only


def targets(results: dict) -> list[str]:
    lines = []
    for name, levels in results["ratios"].items():
        budget = budget_of(name)
        for c, r in levels.items():
            if budget is None:  # adaptive held at the full chain: SGLang's chain step itself
                for key in ("operators", "host_ms_per_step"):
                    if r.get(key) is not None:
                        ok = r[key] <= 1.05
                        lines.append(f"{name} c={c}: {key} {r[key]:.2f}x the chain's (target <= 1.05x): "
                                     f"{'met' if ok else 'MISSED'}")  # fmt: skip
                continue
            profile = results["rows"][name][c]["profile"]
            own, cpu_only = device_phase_syncs(profile)
            lines.append(f"{name} c={c}: syncs/step in {', '.join(DEVICE_PHASES)} {own:.2f} (target 0; and "
                         f"{cpu_only:.2f} a CPU makes only): {'met' if own == 0 else 'MISSED'}")  # fmt: skip
            if budget in (8, 16) and r.get("operators_outside_forwards") is not None:
                ok = r["operators_outside_forwards"] <= 1.25
                lines.append(f"{name} c={c}: operators outside both forwards {r['operators_outside_forwards']:.2f}x "
                             f"the chain's (target <= 1.25x): {'met' if ok else 'MISSED'}")  # fmt: skip
            if budget == 8 and r.get("host_ms_per_step") is not None:
                ok = r["host_ms_per_step"] <= 1.15
                lines.append(f"{name} c={c}: step time {r['host_ms_per_step']:.2f}x the chain's (target <= 1.15x): "
                             f"{'met' if ok else 'MISSED'}")  # fmt: skip
    return lines


def _cell(value, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def print_table(results: dict) -> None:
    print(f"\n{'config':<20} {'c':>3} {'tau':>5} {'tok/s':>8} {'ms/step':>8} {'ms out':>7} {'ops/step':>9} "
          f"{'syncs':>6} {'ops x':>6} {'out x':>6} {'ms x':>5}  ops per phase")  # fmt: skip
    for name, levels in results["rows"].items():
        for c, row in levels.items():
            prof = row["profile"]
            same = {"operators": 1.0, "operators_outside_forwards": 1.0, "host_ms_per_step": 1.0}
            r = results["ratios"].get(name, {}).get(c, same)
            cells = [f"{name:<20}", f"{c:>3}", _cell(row.get("tau"), 5, 2), _cell(row.get("tokens_per_s"), 8, 1),
                     _cell(row.get("host_ms_per_step"), 8, 2), _cell(row.get("host_ms_outside_target_forward"), 7, 2),
                     _cell(prof["operators_per_step"], 9, 1), _cell(prof["syncs_per_step"], 6, 2),
                     _cell(r.get("operators"), 6, 2), _cell(r.get("operators_outside_forwards"), 6, 2),
                     _cell(r.get("host_ms_per_step"), 5, 2)]  # fmt: skip
            print(" ".join(cells), f" {prof['operators_per_phase']}")
    sampled = [(name, c, row) for name, levels in results["rows"].items() for c, row in levels.items()
               if "profile_sampled" in row]  # fmt: skip
    if sampled:
        print(f"\nsampled at temperature {results['args']['sampled_temperature']} (profiled only):")
        for name, c, row in sampled:
            prof = row["profile_sampled"]
            r = results["ratios"].get(name, {}).get(c, {"operators_sampled": 1.0})
            print(f"{name:<20} {c:>3} {_cell(prof['operators_per_step'], 9, 1)} {_cell(prof['syncs_per_step'], 6, 2)} "
                  f"{_cell(r.get('operators_sampled'), 6, 2)}  {prof['operators_per_phase']}")  # fmt: skip
    print("\nsynchronisations per step and where (the innermost Python function outside torch):")
    for name, levels in results["rows"].items():
        for c, row in levels.items():
            for kind in ("profile", "profile_sampled"):
                for site, count in row.get(kind, {}).get("sync_sites", {}).items():
                    label = "" if kind == "profile" else " sampled"
                    print(f"  {name} c={c}{label}  {count:.2f}  {site}")
    print()
    for line in results["targets"]:
        print(line)


def reread(out: Path, folder: Path) -> dict:
    """The run in ``out`` with every profile read again from its traces in ``folder`` (a change of how a trace is
    read needs no new servers)."""
    check = _gpu_serve_check()
    results = json.loads(out.read_text())
    results["rows"] = {name: {int(c): row for c, row in levels.items()} for name, levels in results["rows"].items()}
    for name, levels in results["rows"].items():
        for c, row in levels.items():
            for kind, suffix in (("profile", ""), ("profile_sampled", "-sampled")):
                traces = sorted((folder / f"profile-{name}-c{c}{suffix}").glob("*.trace.json*"))
                if kind in row and traces:
                    row[kind] = step_operators(check.trace_events(traces[0]))
    results["ratios"] = ratios(results)
    results["targets"] = targets(results)
    return results


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["rows"])
    timed = [n for n in names if not n.endswith(TP2)]
    levels = results["args"]["concurrency"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(levels)
    for j, c in enumerate(levels):
        xs = [i + j * width for i in range(len(names))]
        axes[0].bar(xs, [results["rows"][n][c]["profile"]["operators_per_step"] for n in names], width, label=f"c={c}")
        xs = [i + j * width for i in range(len(timed))]
        axes[1].bar(xs, [results["rows"][n][c]["host_ms_per_step"] for n in timed], width, label=f"c={c}")
    for ax, title, shown in zip(
        axes, ("operators per step outside the target forward", "host ms per step (median, TP 1)"), (names, timed)
    ):
        ax.set_xticks([i + width * (len(levels) - 1) / 2 for i in range(len(shown))], shown, rotation=20, ha="right")
        ax.set_title(title, fontsize=10)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 32],
                        help="DDTree budgets to compare with the chain (default 8,16,32)")  # fmt: skip
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8],
                        help="concurrent requests per level (default 1,8)")  # fmt: skip
    parser.add_argument("--tp2-budgets", type=lambda s: [int(x) for x in s.split(",") if x], default=[8],
                        help="DDTree budgets also profiled at tensor parallelism 2, with the chain; '' for none "
                             "(default 8)")  # fmt: skip
    parser.add_argument("--sampled-temperature", type=float, default=0.7,
                        help="also profile each TP 1 configuration's sampled step at this temperature, shown apart "
                             "(0: greedy only; default 0.7)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per level, interleaved (default 3)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="tokens per timed request (default 96)")
    parser.add_argument("--profile-steps", type=int, default=8, help="scheduler steps profiled per level (default 8)")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_step_launches.json")
    parser.add_argument("--reread", type=Path, metavar="DIR",
                        help="no servers: read the profiles again from the traces an earlier run left in DIR (the "
                             "folder it printed), keeping its timed rows in --out")  # fmt: skip
    args = parser.parse_args(argv)
    if args.reread:
        results = reread(args.out, args.reread)
        print_table(results)
        args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
        plot(results, args.out.with_suffix(".png"))
        print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")
        return 0
    if (
        any(b < 1 or b > 63 for b in args.budgets + args.tp2_budgets)
        or any(c < 1 for c in args.concurrency)
        or args.repeats < 1
    ):
        parser.error("budgets must be in 1..63, concurrency levels and --repeats at least 1")
    results = run(args)
    results["args"]["out"] = str(args.out)
    results["ratios"] = ratios(results)
    results["targets"] = targets(results)
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    plot(results, args.out.with_suffix(".png"))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
