#!/usr/bin/env python
"""What a decode step costs by batch size B and draft width w, ``t(B, w)``, on real SGLang servers: the target's
verify, the drafter and the rest of the step, and the distinct experts each verify read against the expectation for
random routing.

    # one server per width, started here, each with the cost probe (models/cost_probe.py), one after the other
    # (--start-together: all at once, measured one at a time)
    python bench/bench_step_cost.py --model OUT/target --dflash OUT/dflash --eagle3 OUT/eagle3 \\
        --modes ar,chain-1,chain-7,tree-8,tree-16,tree-32,eagle3-3 --concurrency 1,2,4,8,16,32,64
    # a running server (started with SGLANG_KIMI_COST_PROBE=1 for the split and the expert counts)
    python bench/bench_step_cost.py --url http://127.0.0.1:30000 --concurrency 1,8

``OUT`` is what ``scripts/make_rank_shaped.py`` wrote (one rank of Kimi-K2.6, served with ``--load-format dummy``,
the default ``--server-args``). A mode fixes the width of every step: ``ar`` (no speculation, w = 0), ``chain-K``
(SGLang's DFLASH chain of K drafts), ``tree-N`` (the plugin's DFLASH tree of budget N), ``eagle3-S`` (EAGLE3 chain of
S steps, top-1). With random weights a drafter's tokens are never accepted, so every step of every request commits
one token, and all of a level's requests decode in lockstep: the batch stays B for the whole measurement.

Per mode and concurrency B: B streaming requests of ``--input-len`` random token ids and ``--output-len`` output
tokens (EOS ignored) sent at once, after one warm-up request per server. The step time is measured where all B
requests decode: from the last request's first output to the first request's last, each request's verify steps
(``spec_verify_ct``, or output tokens without speculation) over that window; the median over requests. The split
comes from the server's cost probe over the level: the target's decode or verify forwards (one per step) and the
drafter's forwards other than prefill, each timed between device synchronisations; the rest is the step minus both
(scheduling, sampling, verification, the drafter's readout through the target's head, the tree build). Routing:
random weights send every token to the same few experts (their router scores hardly differ), so launched servers run
SGLang's benchmark routing (``SGLANG_SIMULATE_UNIFORM_EXPERTS=1``: each token's experts at random, ``--routing``).
The probe's synchronisations serialise the host and the device around every forward; what that costs a step is in
``docs/kimi-scale.md``. Expert counts: per router call of the verify's token count, the mean distinct routed
experts and ``E (1 - (1 - k / E) ** T)``, their expectation when T tokens each pick k of E experts at random.

Prints the table, writes ``<out-dir>/<name>.json`` (every row, the servers' setups) after every mode,
``<name>.png`` (step time by concurrency per mode; measured against expected distinct experts) and
``<name>.step_costs.json``: the ``t(B, w)`` table in the format the adaptive policy's start-up profile accepts
(``--speculative-kimi-adaptive-config`` setting ``step_costs``; width 0 of each family is the ``ar`` server's step).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import signal
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from sglang_kimi.models import kimi_shapes as ks  # noqa: E402
from sglang_kimi.models.cost_probe import ENV as PROBE_ENV  # noqa: E402
from sglang_kimi.models.kimi_shapes import expected_distinct_experts  # noqa: E402
from sglang_kimi.speculative.adaptive.profile import StepCosts, server_cost_setup, write_step_costs  # noqa: E402

FAMILIES = {"chain": "chain", "tree": "tree", "eagle3": "eagle3-chain"}  # a mode's family: the profile key's mode
VERIFY_MODES = ("decode", "target_verify")  # the target's one forward per decode step
DEFAULT_SERVER_ARGS = "--load-format dummy"
UNIFORM_ROUTING_ENV = "SGLANG_SIMULATE_UNIFORM_EXPERTS"  # SGLang's benchmark routing: each token's experts at random
VOCAB_FOR_PROMPTS = 150000  # random prompt ids below Kimi's special tokens (163584 and up)


class BenchError(RuntimeError):
    """A measurement that cannot be made; the message names the fix."""


Mode = ks.StepMode


def parse_mode(name: str) -> Mode:
    try:
        return ks.parse_step_mode(name)
    except ValueError as exc:
        raise BenchError(str(exc)) from None


def mode_args(mode: Mode, dflash: str | None, eagle3: str | None) -> list[str]:
    """SGLang's flags that fix every step of a server at ``mode``'s width."""
    if mode.family == "ar":
        return []
    if mode.family in ("chain", "tree"):
        if not dflash:
            raise BenchError(
                f"mode {mode.name} drafts with DFlash: pass --dflash (scripts/make_rank_shaped.py writes one)"
            )
        args = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", dflash]
        if mode.family == "chain":
            return args + ["--speculative-num-draft-tokens", str(mode.window)]
        return args + ["--speculative-dflash-tree-budget", str(mode.width)]
    if not eagle3:
        raise BenchError(f"mode {mode.name} drafts with EAGLE3: pass --eagle3 (scripts/make_rank_shaped.py writes one)")
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", eagle3,
            "--speculative-num-steps", str(mode.width), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(mode.window)]  # fmt: skip


def mode_of_server(server_info: dict) -> Mode:
    """The fixed width a running server decodes with, from its ``/server_info``."""
    algorithm = (server_info.get("speculative_algorithm") or "").upper()
    if not algorithm:
        return parse_mode("ar")
    plugin = ((server_info.get("internal_states") or [{}])[0].get("sglang_kimi") or {}).get("args") or {}
    if algorithm == "DFLASH":
        if plugin.get("adaptive"):
            raise BenchError("the server chooses its widths (--speculative-kimi-adaptive): measure a static one")
        budget = plugin.get("dflash_tree_budget")
        if budget:
            return parse_mode(f"tree-{budget}")
        return parse_mode(f"chain-{int(server_info['speculative_num_draft_tokens']) - 1}")
    if algorithm == "EAGLE3" and int(server_info.get("speculative_eagle_topk") or 1) == 1:
        return parse_mode(f"eagle3-{int(server_info['speculative_num_steps'])}")
    raise BenchError(f"--speculative-algorithm {algorithm} (top-k > 1 or another drafter) has no single width here")


def prompt_ids(count: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, VOCAB_FOR_PROMPTS) for _ in range(length)] for _ in range(count)]


def stream_requests(url: str, prompts: list[list[int]], max_new_tokens: int) -> list[dict]:
    """The prompts as one streaming batch ``/generate``, so that the scheduler receives them together (separate
    connections can reach a loaded server far apart: one request may finish before the next arrives). Per prompt:
    ``trace``, (arrival seconds, verify steps so far) per chunk, ``meta``, the last ``meta_info``, and ``error`` if
    the request failed."""
    body = {"input_ids": prompts, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.0}}  # fmt: skip
    outs = [{"trace": [], "meta": {}} for _ in prompts]
    try:
        with requests.post(url + "/generate", json=body, stream=True, timeout=3600) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    raise ValueError(chunk["error"])
                out, meta = outs[int(chunk.get("index", 0))], chunk["meta_info"]
                tokens = int(meta["completion_tokens"])
                steps = int(meta["spec_verify_ct"]) if "spec_verify_ct" in meta else tokens - 1
                out["trace"].append((time.perf_counter(), steps))
                out["meta"] = meta
    except (requests.RequestException, ValueError, KeyError) as e:
        for out in outs:
            out["error"] = f"{type(e).__name__}: {e}"
    for out in outs:
        if not out["trace"] and "error" not in out:
            out["error"] = "the server streamed nothing for this prompt"
    return outs


def steps_at(trace: list[tuple[float, int]], t: float) -> tuple[float, int]:
    """The last chunk at or before ``t``: (its arrival, the steps it reports)."""
    last = trace[0]
    for point in trace:
        if point[0] > t:
            break
        last = point
    return last


def step_seconds(traces: list[list[tuple[float, int]]]) -> float:
    """Seconds per decode step while every request decodes: over the window from the last first chunk to the first
    last chunk, each request's chunk-to-chunk time over its steps in between; the median over requests."""
    start = max(trace[0][0] for trace in traces)
    end = min(trace[-1][0] for trace in traces)
    per_request = []
    for trace in traces:
        t0, s0 = steps_at(trace, start)
        t1, s1 = steps_at(trace, end)
        if s1 > s0:
            per_request.append((t1 - t0) / (s1 - s0))
    if not per_request:
        raise BenchError("no request decoded two steps while all decoded together: raise --output-len")
    return statistics.median(per_request)


def probe(url: str) -> dict:
    info = requests.get(url + "/server_info", timeout=60).json()
    return ((info.get("internal_states") or [{}])[0].get("sglang_kimi") or {}).get("cost_probe") or {}


def probe_delta(before: dict, after: dict) -> dict:
    """The probe's sums over a level (after minus before)."""
    forwards = {}
    for role, modes in (after.get("forwards") or {}).items():
        for mode, cell in modes.items():
            prev = ((before.get("forwards") or {}).get(role) or {}).get(mode) or {"count": 0, "seconds": 0.0}
            count = cell["count"] - prev["count"]
            if count:
                forwards.setdefault(role, {})[mode] = {"count": count, "seconds": cell["seconds"] - prev["seconds"]}
    experts = dict(after.get("experts") or {})
    rows = {}
    for key, cell in (experts.get("by_rows") or {}).items():
        prev = ((before.get("experts") or {}).get("by_rows") or {}).get(key) or {}
        delta = {k: v - prev.get(k, 0) for k, v in cell.items()}
        if delta["calls"]:
            rows[int(key)] = delta
    experts["by_rows"] = rows
    return {"forwards": forwards, "experts": experts}


def split(step_s: float, delta: dict) -> dict:
    """Per step: the target's forward, the drafter's forwards (prefill aside) and the rest, in seconds."""
    target = delta["forwards"].get("target", {})
    verify = [target[m] for m in VERIFY_MODES if m in target]
    steps = sum(c["count"] for c in verify)
    if not steps:
        return {"steps": 0}
    draft = [c for m, c in delta["forwards"].get("draft", {}).items() if m != "extend"]
    target_s = sum(c["seconds"] for c in verify) / steps
    draft_s = sum(c["seconds"] for c in draft) / steps
    return {
        "steps": steps,
        "target_s": target_s,
        "draft_s": draft_s,
        "draft_forwards_per_step": sum(c["count"] for c in draft) / steps,
        "rest_s": max(0.0, step_s - target_s - draft_s),
    }


def verify_experts(delta: dict, tokens: int) -> dict | None:
    """The router calls of the step's forward (``tokens`` rows, or the smallest padded size above): mean distinct
    experts against the random-routing expectation for the tokens that routed."""
    experts = delta["experts"]
    rows = experts.get("by_rows") or {}
    sizes = sorted(r for r in rows if r >= tokens)
    if not sizes or not experts.get("routed_experts"):
        return None
    cell = rows[sizes[0]]
    mean_tokens = cell["tokens_sum"] / cell["calls"]
    return {
        "rows": sizes[0],
        "calls": cell["calls"],
        "mean_tokens": mean_tokens,
        "mean_distinct": cell["distinct_sum"] / cell["calls"],
        "expected_random": expected_distinct_experts(experts["routed_experts"], experts["top_k"], mean_tokens),
        "routed_experts": experts["routed_experts"],
        "top_k": experts["top_k"],
    }


def measure_level(url: str, mode: Mode, concurrency: int, opts, seed: int) -> dict:
    prompts = prompt_ids(concurrency, opts.input_len, seed)
    before = probe(url)
    sent = time.perf_counter()
    outs = stream_requests(url, prompts, opts.output_len)
    wall_s = time.perf_counter() - sent
    errors = [o["error"] for o in outs if "error" in o]
    if errors:
        raise BenchError(f"{mode.name} at concurrency {concurrency}: {errors[0]}")
    after = probe(url)
    step_s = step_seconds([o["trace"] for o in outs])
    delta = probe_delta(before, after)
    tokens = sum(int(o["meta"]["completion_tokens"]) for o in outs)
    verify_steps = [int(o["meta"].get("spec_verify_ct", 0)) for o in outs]
    row = {
        "mode": mode.name,
        "family": mode.family,
        "width": mode.width,
        "concurrency": concurrency,
        "step_s": step_s,
        "wall_s": wall_s,  # the level's batch, sent to last chunk: every forward the probe counts lies within
        "output_tokens": tokens,
        # after each request's first token (the prefill's), every verify step commits its accepted drafts and one more
        "tokens_per_step": (tokens - concurrency) / sum(verify_steps) if all(verify_steps) else 1.0,
        **split(step_s, delta),
        "experts": verify_experts(delta, concurrency * mode.window),
        "probe": delta,
    }
    return row


def measure_server(url: str, mode: Mode, opts) -> tuple[dict, list[dict]]:
    """(the server's setup, one row per concurrency level)."""
    info = requests.get(url + "/server_info", timeout=60).json()
    keys = ("model_path", "tp_size", "ep_size", "moe_a2a_backend", "dtype", "quantization", "attention_backend",
            "speculative_draft_model_path", "load_format")  # fmt: skip
    setup = {key: info.get(key) for key in keys}
    (warm,) = stream_requests(url, prompt_ids(1, opts.input_len, 0), 2)  # the first request's one-time costs
    if "error" in warm:
        raise BenchError(f"{mode.name}: the warm-up request failed ({warm['error']})")
    rows = []
    for i, concurrency in enumerate(opts.concurrency):
        row = measure_level(url, mode, concurrency, opts, seed=1000 + i)
        rows.append(row)
        print(format_row(row), flush=True)
    setup["device"] = probe(url).get("device")
    setup["cost_probe"] = bool(probe(url).get("enabled"))
    return setup, rows


def format_row(row: dict) -> str:
    ms = {
        k: (f"{1e3 * row[k]:9.2f}" if row.get(k) is not None else "        —")
        for k in ("target_s", "draft_s", "rest_s")
    }
    e = row.get("experts")
    experts = f"{e['mean_distinct']:7.1f} / {e['expected_random']:7.1f}" if e else "      — /       —"
    return (f"{row['mode']:<10} {row['concurrency']:>4} {1e3 * row['step_s']:9.2f} {ms['target_s']} {ms['draft_s']} "
            f"{ms['rest_s']} {row['tokens_per_step']:6.2f}  {experts}")  # fmt: skip


HEADER = (f"{'mode':<10} {'B':>4} {'step ms':>9} {'target ms':>9} {'draft ms':>9} {'rest ms':>9} {'tok/st':>6}  "
          "experts: measured / random")  # fmt: skip


def step_costs(result: dict) -> StepCosts | None:
    """The ``t(B, w)`` table of a run's rows, per family, width 0 from the ``ar`` rows; None when the servers' model
    config is not on this machine (its shape cannot be recorded)."""
    servers = result["servers"]
    if not servers:
        return None
    first = next(iter(servers.values()))
    config = Path(str(first.get("model_path") or "")).expanduser() / "config.json"
    if not config.is_file():
        return None
    tp, shape = server_cost_setup(
        json.loads(config.read_text()), int(first.get("tp_size") or 1), int(first.get("ep_size") or 1),
        first.get("moe_a2a_backend"),
    )  # fmt: skip
    seconds: dict[str, dict[int, dict[int, float]]] = {}
    ar = [r for r in result["rows"] if r["family"] == "ar"]
    for row in result["rows"]:
        if row["family"] != "ar":
            family = FAMILIES[row["family"]]
            seconds.setdefault(family, {}).setdefault(row["concurrency"], {})[row["width"]] = row["step_s"]
    for family in seconds or {f: None for f in FAMILIES.values()}:
        for row in ar:
            seconds.setdefault(family, {}).setdefault(row["concurrency"], {})[0] = row["step_s"]
    return StepCosts(str(first.get("device")), tp, shape, seconds, source="bench/bench_step_cost.py (measured)")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == name]
        ax.plot([r["concurrency"] for r in mine], [1e3 * r["step_s"] for r in mine], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrency B")
    ax.set_ylabel("ms per decode step")
    ax.set_title(f"t(B, w) on {result.get('device') or 'the server'}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    counted = [r for r in rows if r.get("experts")]
    if counted:
        tokens = [r["experts"]["mean_tokens"] for r in counted]
        bx.scatter(tokens, [r["experts"]["mean_distinct"] for r in counted], label="measured", zorder=3)
        e, k = counted[0]["experts"]["routed_experts"], counted[0]["experts"]["top_k"]
        grid = sorted({1, *tokens, max(tokens) * 2})
        bx.plot(
            grid, [expected_distinct_experts(e, k, t) for t in grid], color="black", label=f"random, top-{k} of {e}"
        )
        bx.set_xscale("log", base=2)
        bx.set_xlabel("tokens in the forward (B x (w + 1))")
        bx.set_ylabel("distinct routed experts per MoE layer")
        bx.legend(fontsize=8)
        bx.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_results(result: dict, out_dir: Path, name: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{name}.json"}
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    costs = step_costs(result)
    if costs is not None:
        paths["step_costs"] = out_dir / f"{name}.step_costs.json"
        write_step_costs(paths["step_costs"], costs)
    if result["rows"]:
        paths["png"] = out_dir / f"{name}.png"
        plot(result, paths["png"])
    return paths


def launch(mode: Mode, opts, log: Path, wait: bool = True):
    """The mode's server, started (with ``wait``: ready to serve; stopped if it is not)."""
    from sglang_kimi.launcher.server import ANY_PORT, ServerProcess, launch_command

    args = ["--model-path", opts.model, *shlex.split(opts.server_args), *mode_args(mode, opts.dflash, opts.eagle3)]
    args += ["--max-running-requests", str(max(opts.concurrency))]
    spec = launch_command(args, port=ANY_PORT)
    spec.env[PROBE_ENV] = "1"
    if opts.routing == "uniform":  # random weights route every token alike; SGLang's benchmark routing does not
        spec.env[UNIFORM_ROUTING_ENV] = "1"
    server = ServerProcess(spec, log)
    return wait_ready(server, opts) if wait else server


def wait_ready(server, opts):
    try:
        server.wait_ready(opts.start_timeout)
    except BaseException:
        server.stop()
        raise
    return server


def run(opts) -> dict:
    result = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()},
              "servers": {}, "rows": [], "skipped": []}  # fmt: skip
    started = time.monotonic()
    print(HEADER, flush=True)
    if opts.url:
        mode = mode_of_server(requests.get(opts.url + "/server_info", timeout=60).json())
        result["servers"][mode.name], result["rows"] = measure_server(opts.url, mode, opts)
    names = [] if opts.url else opts.modes
    log_dir = opts.log_dir or opts.out_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    # --start-together: every mode's server starts now, and all are ready (idle) before the first is measured
    waiting = {name: launch(parse_mode(name), opts, log_dir / f"{opts.name}-{name}.log", wait=False)
               for name in (names if opts.start_together else [])}  # fmt: skip
    try:
        for name in list(waiting):
            waiting[name] = wait_ready(waiting[name], opts)
        for name in names:
            mode = parse_mode(name)
            left = opts.deadline_s - (time.monotonic() - started) if opts.deadline_s else None
            if left is not None and left < opts.min_left_s:
                result["skipped"].append({"mode": name, "why": f"{left:.0f} s left of --deadline-s"})
                print(f"{name}: skipped, {left:.0f} s left of the deadline", flush=True)
                continue
            t0 = time.monotonic()
            if name in waiting:
                server = waiting.pop(name)
            else:
                server = launch(mode, opts, log_dir / f"{opts.name}-{name}.log")
            try:
                setup, rows = measure_server(server.base_url, mode, opts)
            finally:
                server.stop()
            setup["seconds"] = time.monotonic() - t0
            result["servers"][name] = setup
            result["rows"] += rows
            result["device"] = setup.get("device")
            write_results(result, opts.out_dir, opts.name)
    finally:
        for server in waiting.values():
            server.stop()
    result["device"] = next((s.get("device") for s in result["servers"].values()), None)
    return result


def options(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The command line's parser and options."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="measure this running server (its own fixed width) instead of launching")
    parser.add_argument("--model", help="the target to launch (scripts/make_rank_shaped.py's OUT/target)")
    parser.add_argument("--dflash", help="the DFlash drafter of the chain and tree modes")
    parser.add_argument("--eagle3", help="the EAGLE3 drafter of the eagle3 modes")
    parser.add_argument(
        "--modes", default="ar,chain-1,chain-7,tree-8,tree-16,tree-32,eagle3-3",
        help="comma-separated: ar, chain-K, tree-N, eagle3-S (one server each, in this order)",
    )  # fmt: skip
    parser.add_argument("--concurrency", default="1,2,4,8,16,32,64", help="batch sizes B, comma-separated")
    parser.add_argument("--input-len", type=int, default=64, help="prompt tokens per request")
    parser.add_argument("--output-len", type=int, default=48, help="output tokens per request (EOS ignored)")
    parser.add_argument("--server-args", default=DEFAULT_SERVER_ARGS, help="SGLang flags of every launched server")
    parser.add_argument(
        "--routing", choices=("uniform", "model"), default="uniform",
        help="uniform: SGLang's simulated random routing (random weights send every token to the same experts); "
        "model: the router's own choice (real weights)",
    )  # fmt: skip
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds a server may take to start")
    parser.add_argument(
        "--start-together", action="store_true",
        help="start every mode's server at once, then measure them one at a time while the others wait idle: less "
        "start-up time where the device holds them all (CPU; a GPU holds one Kimi rank's server at a time)",
    )  # fmt: skip
    parser.add_argument("--deadline-s", type=float, default=0.0, help="start no mode after this many seconds (0: none)")
    parser.add_argument("--min-left-s", type=float, default=60.0, help="with --deadline-s: seconds a mode needs")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where the JSON, PNG and step costs go")
    parser.add_argument("--name", default="bench_step_cost", help="file name stem of the results")
    parser.add_argument("--log-dir", type=Path, help="where the servers' logs go (default: --out-dir)")
    opts = parser.parse_args(argv)
    opts.concurrency = [int(c) for c in opts.concurrency.split(",") if c]
    opts.modes = [m for m in opts.modes.split(",") if m]
    if not opts.url and not opts.model:
        parser.error("give --model (servers launched here) or --url (a running server)")
    if opts.url:
        opts.url = opts.url.rstrip("/")
    return parser, opts


def main(argv: list[str] | None = None) -> int:
    parser, opts = options(argv)
    try:
        for name in [] if opts.url else opts.modes:
            mode_args(parse_mode(name), opts.dflash, opts.eagle3)  # every mode's flags, before any server starts
        result = run(opts)
    except BenchError as e:
        parser.exit(2, f"bench_step_cost: {e}\n")
    paths = write_results(result, opts.out_dir, opts.name)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    # a time limit's SIGTERM ends the run like an exception: the running server is stopped, the JSON so far is kept
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sys.exit(main())
