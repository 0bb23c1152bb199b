#!/usr/bin/env python
"""The one GPU run that decides whether the plugin's DFLASH tree beats SGLang's DFLASH chain, as a planned run.

Every step has an estimated and a hard time; the plan is printed first, and a plan whose estimate exceeds
``--budget-s`` (480 s: one command on a lent GPU, with time left to start the machine) is refused before anything
starts. The servers run side by side on the one device (the memory split between them), all with CUDA graphs:

1. **start**: autoregressive, SGLang's DFLASH chain, the plugin's trees of budget 8 and 16, adaptive trees (budget
   16), the EAGLE3 tree (the checkpoint's bf16), and a tree of budget 8 with ``SGLANG_KIMI_DRAFT_GRAPHS=check``;
2. **parity**: the demo's five GSM8K questions, greedy, on every server, token for token against autoregressive;
3. **rounds** (the deciding comparison, first): ``--rounds`` rounds over the concurrency levels; in each level every
   deciding server decodes for at least ``--level-s`` (clients keep sending requests until then), the servers'
   order rotating from level to level so drift between them does not read as speed. Per server and level: tokens/s,
   wall time per decode step, the plugin's step clock (host ms a step), tau, the latency of the slowest request, and
   where each step's draft came from (``draft_steps_by_source``: the drafter graph's captured tail, SGLang's
   in-graph argmax, eager, or SGLang's own chain step). The JSON is written after every round, so a run cut short
   still answers; medians and spread over the rounds, and the ratios to the chain, in ``summary``;
4. **side**: one pass of the levels on the EAGLE3 tree (its slowest requests and its log's recompilation, graph and
   allocator lines locate a stall) and on the check server (replayed drafts equal to eager ones:
   ``draft_replays_checked`` / ``draft_replays_differed``);
5. **profile**: one short trace window a server (SGLang's profiler): the GPU's idle share (the host's exposed part
   of a step), and for the plugin's steps each phase's host ms and kernel launches.

``--device cpu`` rehearses the same plan on CPU servers (shorter levels, fewer tokens, the same JSON schema):

    python scripts/gpu_decide.py --out /tmp/decide                   # on the GPU machine (docs/gpu.md)
    .venv/bin/python scripts/gpu_decide.py --device cpu --out /tmp/decide-cpu      # the rehearsal, <= 10 minutes
    .venv/bin/python scripts/gpu_decide.py --plan-only                # the plan and its estimate, nothing started
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import gpu_serve_check  # noqa: E402  (its request, trace and profile helpers)
from gpu_serve_check import generate  # noqa: E402  (greedy, ignore_eos)

SCHEMA = "sglang-kimi-gpu-decide/1"
CHAIN = "dflash-chain"
DECIDING = ("autoregressive", CHAIN, "dflash-tree-8", "dflash-tree-16", "adaptive")
EAGLE3, CHECK = "eagle3-tree", "dflash-tree-8-check"
TREES = ("dflash-tree-8", "dflash-tree-16")
# a server log's lines that locate a stall (the EAGLE3 tree's slow rows in an earlier run had no named cause)
LOG_SIGNALS = {
    "recompilation": r"[Rr]ecompil",
    "cuda_graph": r"[Cc]uda graph|CUDA graph",
    "out_of_memory": r"out of memory|OutOfMemory",
    "traceback": r"Traceback",
}


@dataclass(frozen=True)
class Settings:
    level_s: float  # decode time per server and level
    levels: tuple[int, ...]  # concurrency levels
    rounds: int
    max_new_tokens: int  # per request
    profile_steps: int
    start_s: float  # estimate: every server started side by side, graphs captured
    parity_s: float  # estimate: the five questions on every server, servers in parallel
    settle_s: float  # estimate: a level's last requests finishing and its metrics read, per server
    profile_s: float  # estimate: one trace window, per server


SETTINGS = {
    "cuda": Settings(level_s=5.0, levels=(1, 8, 32), rounds=3, max_new_tokens=96, profile_steps=20, start_s=150.0,
                     parity_s=15.0, settle_s=0.3, profile_s=5.0),
    "cpu": Settings(level_s=2.0, levels=(1, 4), rounds=3, max_new_tokens=24, profile_steps=4, start_s=200.0,
                    parity_s=160.0, settle_s=0.5, profile_s=8.0),
}  # fmt: skip


@dataclass
class Step:
    name: str
    estimate_s: float
    limit_s: float
    status: str = "planned"
    took_s: float | None = None


COMMAND_LIMIT_S = 600.0  # the most one command may run on a lent GPU: the hard limits together stay within it
BUDGETS = {"cuda": 480.0, "cpu": 600.0}  # the estimate's ceiling: one GPU command; the CPU rehearsal's 10 minutes


def plan(settings: Settings) -> list[Step]:
    """The run's steps, each with its estimate and hard limit (1.2x the estimate, the start 1.3x: together within
    one command's 600 s on the GPU)."""
    level = settings.level_s + settings.settle_s
    estimates = {
        "start": settings.start_s,
        "parity": settings.parity_s,
        "rounds": settings.rounds * len(settings.levels) * len(DECIDING) * level,
        "side": len(settings.levels) * 2 * level,  # the EAGLE3 tree and the check server, one pass each
        "profile": (len(DECIDING) + 1) * settings.profile_s,
    }
    return [Step(name, round(s, 1), round(s * (1.3 if name == "start" else 1.2), 1)) for name, s in estimates.items()]


def servers(device: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (SGLang arguments, extra environment) of every server of the run."""
    from sglang_kimi.cli.demo import mode_args

    demo = mode_args()
    dflash = demo["dflash-chain"]
    modes = {
        "autoregressive": demo["autoregressive"],
        CHAIN: dflash,
        "dflash-tree-8": [*dflash, "--speculative-dflash-tree-budget", "8"],
        "dflash-tree-16": [*dflash, "--speculative-dflash-tree-budget", "16"],
        "adaptive": [*dflash, "--speculative-dflash-tree-budget", "16", "--speculative-kimi-adaptive"],
        EAGLE3: demo["eagle3-tree"],
        CHECK: [*dflash, "--speculative-dflash-tree-budget", "8"],
    }
    if device == "cpu":
        common = ["--attention-backend", "kimi_cpu", "--max-total-tokens", "16384"]
    else:  # one device for all of them: its memory split, CUDA graphs up to the largest level
        share = 0.85 / len(modes)
        common = ["--attention-backend", "triton", "--sampling-backend", "pytorch",
                  "--mem-fraction-static", f"{share:.3f}", "--cuda-graph-max-bs-decode", "32"]  # fmt: skip
    env = {CHECK: {"SGLANG_KIMI_DRAFT_GRAPHS": "check"}}
    return {name: ([*common, *args], env.get(name, {})) for name, args in modes.items()}


# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Record:
    """The run's JSON, written atomically after every step and round (a run killed at any point leaves the last
    complete write)."""

    path: Path
    doc: dict = field(default_factory=dict)

    def save(self) -> None:
        self.doc["summary"] = summarise(self.doc.get("rounds", []))
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str))
        os.replace(tmp, self.path)


def spec_metrics(url: str) -> dict:
    from sglang_kimi.launcher.server import fetch_plugin_state

    return fetch_plugin_state(url).get("spec_metrics") or {}


def level(url: str, prompts: list[str], concurrency: int, seconds: float, max_new_tokens: int) -> dict:
    """``concurrency`` clients sending greedy requests until ``seconds`` have passed; what the server did meanwhile."""
    before = spec_metrics(url)
    deadline = time.perf_counter() + seconds

    def client(i: int) -> list[tuple[int, float]]:
        done, k = [], 0
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            out = generate(url, prompts[(i + k * concurrency) % len(prompts)], max_new_tokens)
            done.append((out["meta_info"]["completion_tokens"], time.perf_counter() - t))
            k += 1
        return done

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        finished = [r for rs in pool.map(client, range(concurrency)) for r in rs]
    wall = time.perf_counter() - start
    after = spec_metrics(url)
    return dict(_step_deltas(before, after, wall), wall_s=wall, requests=len(finished),
                tokens_per_s=sum(t for t, _ in finished) / wall,
                slowest_request_s=max((s for _, s in finished), default=None))  # fmt: skip


def _step_deltas(before: dict, after: dict, wall: float) -> dict:
    """The level's decode steps (the DFLASH step clock: per-step wall and host time, draft sources) and tau (the
    acceptance histogram: every speculative server)."""
    hist = [a - b for a, b in zip(after.get("accept_length_histogram", []), before.get("accept_length_histogram", []))]
    out = {"tau": 1 + sum(a * n for a, n in enumerate(hist)) / sum(hist) if sum(hist) else None}
    steps = int(after.get("decode_steps", 0)) - int(before.get("decode_steps", 0))
    out["decode_steps"] = max(steps, 0)
    if steps <= 0:  # no DFLASH step clock: autoregressive, EAGLE3
        return out
    host = (after["host_ms_per_step"] * after["decode_steps"] - before.get("host_ms_per_step", 0.0)
            * before.get("decode_steps", 0)) / steps  # fmt: skip
    sources = {k: v - (before.get("draft_steps_by_source") or {}).get(k, 0)
               for k, v in (after.get("draft_steps_by_source") or {}).items()}  # fmt: skip
    return dict(out, step_ms=1e3 * wall / steps, host_ms_per_step=host, draft_steps_by_source=sources)


def summarise(rounds: list[dict]) -> dict:
    """Per server and level: medians and spread over the rounds, and the ratios to SGLang's chain."""
    out: dict = {}
    for r in rounds:
        for c, by_server in r["levels"].items():
            for name, row in by_server.items():
                cell = out.setdefault(name, {}).setdefault(str(c), {"runs": []})
                cell["runs"].append(row)
    for name, by_level in out.items():
        for c, cell in by_level.items():
            for key in ("tokens_per_s", "step_ms", "host_ms_per_step", "tau", "slowest_request_s"):
                values = [run[key] for run in cell["runs"] if run.get(key) is not None]
                if values:
                    cell[key] = statistics.median(values)
                    cell[key + "_spread"] = [min(values), max(values)]
            del cell["runs"]
    for name, by_level in out.items():
        for c, cell in by_level.items():
            chain = out.get(CHAIN, {}).get(c, {})
            for key in ("tokens_per_s", "step_ms"):
                if cell.get(key) and chain.get(key):
                    cell[key + "_vs_chain"] = cell[key] / chain[key]
    return out


def run_rounds(record: Record, urls: dict[str, str], settings: Settings, prompts: list[str], limit_s: float,
               measure=level) -> None:  # fmt: skip
    """The deciding comparison: rounds over the levels, the servers' order rotating; saved after every round."""
    record.doc.setdefault("rounds", [])
    names = [n for n in DECIDING if n in urls]
    started = time.perf_counter()
    for r in range(settings.rounds):
        row = {"round": r + 1, "levels": {}}
        for i, c in enumerate(settings.levels):
            shift = (r * len(settings.levels) + i) % len(names)
            for name in names[shift:] + names[:shift]:
                if time.perf_counter() - started > limit_s:
                    row["stopped"] = f"the step's limit of {limit_s:.0f} s"
                    break
                row["levels"].setdefault(str(c), {})[name] = measure(
                    urls[name], prompts, c, settings.level_s, settings.max_new_tokens
                )
        record.doc["rounds"].append(row)
        record.save()
        print(f"  round {r + 1}/{settings.rounds} ({time.perf_counter() - started:.0f} s)", flush=True)
        if "stopped" in row:
            return


def log_signals(log: Path) -> dict:
    text = log.read_text(errors="replace") if log.exists() else ""
    return {name: len(re.findall(pattern, text)) for name, pattern in LOG_SIGNALS.items()}


def parity(urls: dict[str, str], prompts: list[str], max_new_tokens: int) -> dict:
    def outputs(url):
        return [generate(url, p, max_new_tokens)["output_ids"] for p in prompts]

    with ThreadPoolExecutor(len(urls)) as pool:
        got = dict(zip(urls, pool.map(outputs, urls.values())))
    reference = got.get("autoregressive")
    out = {}
    for name, ids in got.items():
        if name == "autoregressive" or reference is None:
            continue
        diverged = [i for i, (a, b) in enumerate(zip(ids, reference)) if a[: len(b)] != b]
        out[name] = {"equal": not diverged, "diverged_questions": diverged}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=sorted(SETTINGS), default="cuda", help="cuda (the run) or cpu (its rehearsal)")
    p.add_argument("--out", type=Path, help="folder for the JSON, the server logs and the traces")
    p.add_argument("--budget-s", type=float, help="refuse a plan estimated above this (cuda 480, cpu 600)")
    p.add_argument("--level-s", type=float, help="decode seconds per server and level (cuda 5, cpu 2)")
    p.add_argument("--rounds", type=int, help="rounds of the deciding comparison (default 3)")
    p.add_argument("--plan-only", action="store_true", help="print the plan and its estimate, start nothing")
    opts = p.parse_args(argv)
    settings = SETTINGS[opts.device]
    overrides = {k: v for k, v in (("level_s", opts.level_s), ("rounds", opts.rounds)) if v is not None}
    settings = Settings(**{**asdict(settings), **overrides})
    steps = plan(settings)
    total, limits = sum(s.estimate_s for s in steps), sum(s.limit_s for s in steps)
    budget = opts.budget_s if opts.budget_s is not None else BUDGETS[opts.device]
    levels = f"levels {list(settings.levels)}, {settings.level_s:g} s each, {settings.rounds} rounds"
    print(f"plan on {opts.device} ({levels}):")
    for s in steps:
        print(f"  {s.name:<8} estimate {s.estimate_s:6.1f} s   limit {s.limit_s:6.1f} s")
    print(f"  total    estimate {total:6.1f} s   limit {limits:6.1f} s   budget {budget:.0f} s")
    opts.budget_s = budget
    if total > opts.budget_s:
        print(f"gpu_decide: the plan's estimate {total:.0f} s exceeds --budget-s {opts.budget_s:.0f}: shorten "
              "--level-s or --rounds, or raise the budget", file=sys.stderr)  # fmt: skip
        return 2
    if opts.plan_only:
        return 0
    if opts.out is None:
        p.error("--out is required unless --plan-only")
    return run(opts, settings, steps)


def run(opts, settings: Settings, steps: list[Step]) -> int:
    from contextlib import ExitStack

    from sglang_kimi.cli.demo import gsm8k_prompt, load_questions
    from sglang_kimi.launcher.server import ANY_PORT, ServerProcess, launch_command

    opts.out.mkdir(parents=True, exist_ok=True)
    prompts = [gsm8k_prompt(q) for q in load_questions()]
    record = Record(opts.out / f"gpu_decide-{opts.device}.json")
    record.doc.update(schema=SCHEMA, device=_device_name(opts.device), settings=asdict(settings),
                      plan=[asdict(s) for s in steps], started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      servers={}, complete=False)  # fmt: skip
    by_name = {s.name: s for s in steps}

    def finish(step: Step, t0: float, status: str = "done") -> None:
        step.took_s, step.status = round(time.perf_counter() - t0, 1), status
        record.doc["plan"] = [asdict(s) for s in steps]
        record.save()
        print(f"[{step.name}] {status} in {step.took_s:.0f} s (estimate {step.estimate_s:.0f})", flush=True)

    with ExitStack() as stack:
        t0 = time.perf_counter()
        procs = {}
        for name, (args, env) in servers(opts.device).items():
            spec = launch_command(args, cpu=opts.device == "cpu", port=ANY_PORT)
            spec.env.update(env)
            procs[name] = ServerProcess(spec, opts.out / f"{name}.log")
            stack.callback(procs[name].stop)
        urls = {}
        for name, proc in procs.items():
            left = by_name["start"].limit_s - (time.perf_counter() - t0)
            try:
                proc.wait_ready(max(left, 1.0))
                urls[name] = proc.base_url
                record.doc["servers"][name] = {"ready_s": round(time.perf_counter() - t0, 1)}
            except Exception as exc:  # a server that does not start is a result; the others still answer
                record.doc["servers"][name] = {"error": f"{type(exc).__name__}: {str(exc)[-600:]}"}
        finish(by_name["start"], t0)
        if "autoregressive" not in urls or CHAIN not in urls:
            record.save()
            return 1

        t0 = time.perf_counter()
        record.doc["parity"] = parity(urls, prompts, settings.max_new_tokens)
        finish(by_name["parity"], t0)

        t0 = time.perf_counter()
        run_rounds(record, urls, settings, prompts, by_name["rounds"].limit_s)
        finish(by_name["rounds"], t0)

        t0 = time.perf_counter()
        side = {}
        for name in (EAGLE3, CHECK):
            if time.perf_counter() - t0 > by_name["side"].limit_s:
                side[name] = {"skipped": "the step's limit"}
            elif name in urls:
                side[name] = {str(c): level(urls[name], prompts, c, settings.level_s, settings.max_new_tokens)
                              for c in settings.levels}  # fmt: skip
                metrics = spec_metrics(urls[name])
                side[name]["replays"] = {k: metrics.get(k) for k in ("draft_replays_checked", "draft_replays_differed")}
        record.doc["side"] = side
        finish(by_name["side"], t0)

        t0 = time.perf_counter()
        record.doc["profile"] = profiles(urls, prompts, opts.out, settings, by_name["profile"].limit_s)
        finish(by_name["profile"], t0)
        for name in record.doc["servers"]:
            record.doc["servers"][name]["log_signals"] = log_signals(opts.out / f"{name}.log")
    record.doc["complete"] = True
    record.save()
    print_summary(record.doc)
    print(f"wrote {record.path}")
    unequal = [n for n, v in record.doc.get("parity", {}).items() if not v["equal"]]
    return 1 if unequal else 0


def profiles(urls: dict[str, str], prompts: list[str], out: Path, settings: Settings, limit_s: float) -> dict:
    """One short trace window a deciding server and the EAGLE3 tree (``gpu_serve_check.profile``)."""
    result, started = {}, time.perf_counter()
    for name in [n for n in (*DECIDING, EAGLE3) if n in urls]:
        if time.perf_counter() - started > limit_s:
            result[name] = {"skipped": "the step's limit"}
            continue
        try:
            result[name] = gpu_serve_check.profile(urls[name], prompts, out / f"profile-{name}", settings.profile_steps,
                                                   8, gpu_serve_check.PROFILE_MAX_NEW_TOKENS)  # fmt: skip
        except Exception as exc:  # the comparison stands without it
            result[name] = {"error": f"{type(exc).__name__}: {str(exc)[-300:]}"}
    return result


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else device


def print_summary(doc: dict) -> None:
    print(f"\n{'server':<18}{'c':>4}{'tok/s':>10}{'x chain':>9}{'step ms':>9}{'x chain':>9}{'tau':>6}")
    for name, by_level in doc["summary"].items():
        for c, cell in by_level.items():

            def fmt(key, digits=2):
                value = cell.get(key)
                return "-" if value is None else f"{value:.{digits}f}"

            print(f"{name:<18}{c:>4}{fmt('tokens_per_s', 1):>10}{fmt('tokens_per_s_vs_chain'):>9}"
                  f"{fmt('step_ms'):>9}{fmt('step_ms_vs_chain'):>9}{fmt('tau'):>6}")  # fmt: skip
    for name, result in doc.get("parity", {}).items():
        print(f"parity {name}: {'equal' if result['equal'] else 'DIFFERS at ' + str(result['diverged_questions'])}")


if __name__ == "__main__":
    sys.exit(main())
