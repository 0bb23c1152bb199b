"""``sglang-kimi drafter compare``: two or more DFlash drafters of one target on the same prompts, and which tree
budget to serve each at each concurrency.

Each drafter is served in turn with the target as a DFlash tree of ``--budget`` nodes, with the tree worker's
acceptance trace on (``SGLANG_KIMI_ACCEPTANCE_TRACE``: the accepted path of every request's every decode step), and
every prompt set is answered greedily through ``/v1/chat/completions``. From the paths:

- **acceptance by tree budget**: a DDTree of budget ``b`` is the first ``b`` nodes of the wider one, so the nodes of a
  path numbered within ``b`` are what budget ``b`` accepts on that step (``speculators.policy.nodes_within``); tau(b)
  is one plus their mean (tokens a step commits, the bonus included);
- **acceptance by depth**: the share of steps whose accepted path reached depth ``d`` (the d-th draft token);
- **the best budget per concurrency** (with ``--step-costs``, a table of seconds per step by batch and budget, as
  the adaptive policy reads it): the budget with the most tokens per second, ``c x tau(b) / seconds(c, b)``.

Writes ``drafter_compare.json`` and ``drafter_compare.png`` to ``--out`` and prints the tables.
"""

from __future__ import annotations

import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from sglang_kimi.launcher.api_key import auth_headers
from sglang_kimi.speculators.policy import nodes_within

FORMAT = "sglang-kimi-drafter-compare/1"


class CompareError(RuntimeError):
    """A comparison that cannot run; the message names the fix."""


def budgets_up_to(budget: int) -> list[int]:
    """0, 1, 2, 4, ... up to ``budget`` (and ``budget`` itself)."""
    out, b = [0], 1
    while b < budget:
        out.append(b)
        b *= 2
    return sorted({*out, budget})


def acceptance(paths: list[list[int]], budget: int) -> dict:
    """Acceptance statistics of the accepted ``paths`` (one per decode step) of a tree of ``budget`` nodes."""
    if not paths:
        raise CompareError("no decode step was traced: the server drafted nothing (check its log)")
    steps = len(paths)
    by_budget = {b: 1.0 + sum(nodes_within(p, b) for p in paths) / steps for b in budgets_up_to(budget)}
    deepest = max((len(p) for p in paths), default=0)
    by_depth = [sum(len(p) >= d for p in paths) / steps for d in range(1, deepest + 1)]
    return {"steps": steps, "tau_by_budget": by_budget, "accepted_by_depth": by_depth}


def read_trace(path: Path, rids: set[str]) -> list[list[int]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("rid") in rids:
            out.append([int(n) for n in row["path"]])
    return out


def best_budgets(tau_by_budget: dict[int, float], seconds: dict[int, dict[int, float]]) -> dict[int, dict]:
    """Per batch of the cost table: the budget with the most tokens per second, among those both know."""
    out = {}
    for batch, row in sorted(seconds.items()):
        rates = {b: batch * tau_by_budget[b] / s for b, s in row.items() if b in tau_by_budget and s > 0}
        if not rates:
            continue
        best = max(rates, key=rates.get)
        base = rates.get(0)
        out[batch] = {"budget": best, "tokens_per_s": rates[best], "speedup": rates[best] / base if base else None}
    return out


def serve_and_trace(target: str, drafter: str, budget: int, prompt_sets: dict[str, list[str]], max_tokens: int,
                    concurrency: int, server_args: list[str], log_dir: Path) -> dict[str, list[list[int]]]:  # fmt: skip
    """Each prompt set's traced paths, from one server of ``target`` with ``drafter`` as a tree of ``budget``."""
    from sglang_kimi.launcher.server import ANY_PORT, ServerProcess, launch_command
    from sglang_kimi.settings import ACCEPTANCE_TRACE_ENV

    trace = log_dir / f"trace-{Path(drafter).name}.jsonl"
    trace.unlink(missing_ok=True)
    args = ["--model-path", target, "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drafter,
            "--speculative-dflash-tree-budget", str(budget), *server_args]  # fmt: skip
    spec = launch_command(args, port=ANY_PORT)
    spec.env[ACCEPTANCE_TRACE_ENV] = str(trace)
    with ServerProcess(spec, log_dir / f"server-{Path(drafter).name}.log") as server:
        server.wait_ready(1800)
        model = requests.get(server.base_url + "/v1/models", timeout=60, headers=auth_headers()).json()["data"][0]["id"]

        def ask(job):
            rid, prompt = job
            body = {"model": model, "rid": rid, "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens, "temperature": 0}  # fmt: skip
            response = requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=1800,
                                     headers=auth_headers())  # fmt: skip
            if response.status_code != 200:
                raise CompareError(f"{drafter}: the server answered HTTP {response.status_code}: {response.text[:300]}")

        rids = {}
        with ThreadPoolExecutor(concurrency) as pool:
            for name, prompts in prompt_sets.items():
                jobs = [(f"compare-{name}-{i}", p) for i, p in enumerate(prompts)]
                rids[name] = {rid for rid, _ in jobs}
                list(pool.map(ask, jobs))
    return {name: read_trace(trace, ids) for name, ids in rids.items()}


def refuse_chain_only(name: str, path: str) -> None:
    """A DFlash2 drafter is served as chains only (its selector's scores are conditional on the previous draft):
    the comparison, which measures DDTree budgets, cannot serve it."""
    from sglang_kimi.speculators.configs import DFlashConfig, DrafterConfigError

    try:
        config = DFlashConfig.from_pretrained(path)
    except (DrafterConfigError, OSError, ValueError):
        return  # the server's start-up names what is wrong with it
    if config.has_selector:
        raise CompareError(
            f"--drafter {name}={path} is a DFlash2 drafter ({', '.join(config.architectures)}), served as chains "
            "only: the comparison measures DDTree budgets. Compare its chains with `sglang-kimi bench` against a "
            "server started with --speculative-kimi-adaptive"
        )


def compare(target: str, drafters: dict[str, str], prompt_sets: dict[str, list[str]], *, budget: int = 16,
            max_tokens: int = 128, concurrency: int = 4, server_args: list[str] = (),
            step_costs: dict[int, dict[int, float]] | None = None, log_dir: Path | None = None) -> dict:  # fmt: skip
    for name, path in drafters.items():
        refuse_chain_only(name, path)
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="drafter-compare-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, path in drafters.items():
        traced = serve_and_trace(target, path, budget, prompt_sets, max_tokens, concurrency, list(server_args),
                                 log_dir)  # fmt: skip
        sets = {s: acceptance(paths, budget) for s, paths in traced.items()}
        everything = acceptance([p for paths in traced.values() for p in paths], budget)
        entry = {"path": path, "prompt_sets": sets, "all": everything}
        if step_costs:
            entry["best_budget_by_concurrency"] = best_budgets(everything["tau_by_budget"], step_costs)
        results[name] = entry
    prompts = {k: len(v) for k, v in prompt_sets.items()}
    return {"format": FORMAT, "target": target, "budget": budget, "max_tokens": max_tokens, "prompts": prompts,
            "drafters": results, "logs": str(log_dir)}  # fmt: skip


def print_tables(data: dict) -> None:
    budgets = budgets_up_to(data["budget"])
    print(f"\ntau (tokens per step) by tree budget, target {data['target']}")
    print("drafter".ljust(24) + "prompts".ljust(10) + "".join(f"b={b}".rjust(8) for b in budgets))
    for name, entry in data["drafters"].items():
        for set_name, stats in [*entry["prompt_sets"].items(), ("all", entry["all"])]:
            taus = stats["tau_by_budget"]
            row = "".join(f"{taus[b]:8.2f}" for b in budgets)
            print(f"{name[:23].ljust(24)}{set_name[:9].ljust(10)}{row}")
    print("\naccepted by depth of the path (share of steps reaching the d-th draft), all prompts")
    for name, entry in data["drafters"].items():
        shown = " ".join(f"{x:.2f}" for x in entry["all"]["accepted_by_depth"][:8])
        print(f"{name[:23].ljust(24)}{shown}")
    if any("best_budget_by_concurrency" in e for e in data["drafters"].values()):
        print("\nbest tree budget per concurrency (the step costs' tokens per second; speedup over no drafts)")
        for name, entry in data["drafters"].items():
            cells = [f"c={c}: {v['budget']} ({v['speedup']:.2f}x)" if v["speedup"] else f"c={c}: {v['budget']}"
                     for c, v in entry.get("best_budget_by_concurrency", {}).items()]  # fmt: skip
            print(f"{name[:23].ljust(24)}" + ", ".join(cells))


def plot(data: dict, path: Path) -> Path:
    from sglang_kimi.evals.plots import _pyplot, _save

    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, entry in data["drafters"].items():
        taus = entry["all"]["tau_by_budget"]
        budgets = sorted(int(b) for b in taus)
        left.plot(budgets, [taus[b] for b in budgets], marker="o", label=name)
        depth = entry["all"]["accepted_by_depth"]
        right.plot(range(1, len(depth) + 1), depth, marker="o", label=name)
    left.set_xscale("symlog", base=2, linthresh=1)
    left.set(xlabel="tree budget (nodes)", ylabel="tau (tokens per step)", title="acceptance by tree budget")
    right.set(xlabel="depth of the accepted path", ylabel="share of steps", title="acceptance by depth", ylim=(0, 1))
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend()
    return _save(plt, fig, path)


def write(data: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "drafter_compare.json"
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    return [json_path, plot(data, out_dir / "drafter_compare.png")]


def load_prompt_set(path: Path, limit: int | None) -> list[str]:
    """The first user turn of every row of a prompts file (the forms ``drafter regenerate`` reads)."""
    from sglang_kimi.drafters.regenerate import read_rows, turns

    prompts = []
    for row in read_rows(path):
        messages, _ = turns(row)
        first = next((m["content"] for m in messages or [] if m["role"] == "user"), None)
        if first:
            prompts.append(first)
    if not prompts:
        raise CompareError(f"{path}: no row with a user turn")
    return prompts[:limit]
