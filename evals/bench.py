"""``sglang-kimi bench``: a concurrency sweep against an SGLang server, optionally side by side with a baseline.

Per level (concurrency c): ``num_prompts`` requests with ``c`` in flight, after ``--warmup-requests`` that are
not measured, through SGLang's own benchmark (:mod:`sglang_kimi.evals.sglang_bench`). Outputs have a fixed
length (EOS ignored), so throughput compares like with like. Reported per level: output throughput (tok/s),
TTFT, TPOT (per request: (latency - TTFT) / (output tokens - 1)), ITL (gaps between streamed chunks, split
evenly over the tokens of a chunk) as mean / p50 / p95 / p99 in ms, tau and acceptance per draft position
(:mod:`sglang_kimi.evals.acceptance`). Writes ``bench.json``, ``throughput.png``, ``tpot.png``,
``acceptance.png``; SGLang's raw per-level results go to ``sglang_bench_serving.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_kimi.evals import acceptance
from sglang_kimi.evals.errors import EvalError
from sglang_kimi.evals.hub_data import load_gsm8k, why_not_loaded
from sglang_kimi.evals.servers import (
    LAUNCH_TIMEOUT,
    Server,
    check_generation_room,
    check_same_model,
    launch_pair,
    probe,
    split_args,
)
from sglang_kimi.launcher.dp_reports import merged_report

# The published Kimi-K2.6 speculative-decoding runs.
PRESETS = {
    "long": {"dataset": "random", "input_len": 10240, "output_len": 512},
    "gsm8k": {"dataset": "gsm8k", "output_len": 512},
}
GPU_DEFAULTS = {"concurrency": [1, 8, 32, 64], "input_len": 1024, "output_len": 512, "prompts_per_slot": 4}
CPU_DEFAULTS = {"concurrency": [1, 2, 4], "input_len": 128, "output_len": 32, "prompts_per_slot": 2}
MIN_PROMPTS = 4
STAT_KEYS = {"mean": "mean", "p50": "median", "p95": "p95", "p99": "p99"}  # ours -> SGLang's key prefix


@dataclass
class BenchConfig:
    concurrency: list[int]
    dataset: str  # "gsm8k" | "random"
    input_len: int  # random only
    output_len: int
    num_prompts: int | None  # per level; None: max(MIN_PROMPTS, prompts_per_slot * c)
    prompts_per_slot: int
    warmup_requests: int
    data_dir: str | None
    tokenizer: str | None
    seed: int
    cpu: bool

    def prompts_for(self, concurrency: int) -> int:
        return self.num_prompts or max(MIN_PROMPTS, self.prompts_per_slot * concurrency)


def parse_concurrency(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise EvalError(f"--concurrency {text}: give comma-separated positive integers, e.g. 1,8,32,64") from None
    if not levels or any(c < 1 for c in levels):
        raise EvalError(f"--concurrency {text}: give comma-separated positive integers, e.g. 1,8,32,64")
    repeated = sorted({c for c in levels if levels.count(c) > 1})
    if repeated:
        raise EvalError(
            f"--concurrency {text}: {', '.join(map(str, repeated))} given more than once; give each level once"
        )
    return sorted(levels)


def check_load(input_len: int | None, output_len: int | None, num_prompts: int | None, warmup: int | None) -> None:
    """The load flags' values (None: not given), checked before any server starts and again once resolved."""
    for flag, value in (("--input-len", input_len), ("--output-len", output_len), ("--num-prompts", num_prompts)):
        if value is not None and value < 1:
            raise EvalError(f"{flag} {value}: give 1 or more")
    if output_len is not None and output_len < 2:
        raise EvalError(f"--output-len {output_len}: TPOT needs at least 2 output tokens")
    if warmup is not None and warmup < 0:
        raise EvalError(f"--warmup-requests {warmup}: give 0 or more")


def _dataset(args: argparse.Namespace) -> str:
    """The prompts' data set: the flag, else the preset's, else GSM8K."""
    return args.dataset or PRESETS.get(args.preset or "", {}).get("dataset", "gsm8k")


def resolve_config(args: argparse.Namespace, server: Server) -> BenchConfig:
    """Flags > preset > device defaults (CPU when the server reports ``device: cpu``)."""
    cpu = server.device == "cpu"
    defaults = CPU_DEFAULTS if cpu else GPU_DEFAULTS
    preset = PRESETS.get(args.preset or "", {})
    pick = lambda flag, key: flag if flag is not None else preset.get(key, defaults.get(key))  # noqa: E731
    cfg = BenchConfig(
        concurrency=parse_concurrency(args.concurrency) if args.concurrency else list(defaults["concurrency"]),
        dataset=_dataset(args),
        input_len=pick(args.input_len, "input_len"),
        output_len=pick(args.output_len, "output_len"),
        num_prompts=args.num_prompts,
        prompts_per_slot=defaults["prompts_per_slot"],
        warmup_requests=args.warmup_requests,
        data_dir=args.data_dir,
        tokenizer=args.tokenizer,
        seed=args.seed,
        cpu=cpu,
    )
    check_load(cfg.input_len, cfg.output_len, cfg.num_prompts, cfg.warmup_requests)
    if cfg.dataset == "random" and server.max_model_len and cfg.input_len + cfg.output_len > server.max_model_len:
        raise EvalError(
            f"--input-len {cfg.input_len} + --output-len {cfg.output_len} exceed the model's context "
            f"({server.max_model_len} tokens) on {server.url}"
        )
    if cfg.dataset == "random" and server.max_input_len and cfg.input_len > server.max_input_len:
        raise EvalError(
            f"--input-len {cfg.input_len} exceeds the longest prompt {server.url} admits ({server.max_input_len} "
            "tokens: its KV pool or context): lower --input-len"
        )
    check_generation_room("--output-len", cfg.output_len, server)
    return cfg


def check_rows_fit(rows, output_len: int, server: Server) -> None:
    """Refuse a level whose longest prompt and the output length exceed the server's context: SGLang's server
    refuses such a request with HTTP 400, and its benchmark client counts it as completed with the whole output."""
    if not rows:
        return
    longest = max(r.prompt_len for r in rows)
    if server.max_input_len and longest > server.max_input_len:
        raise EvalError(
            f"prompts of up to {longest} tokens exceed the longest prompt {server.url} admits ({server.max_input_len} "
            "tokens: its KV pool or context): lower --input-len, or serve with a larger pool"
        )
    if server.max_model_len and longest + output_len > server.max_model_len:
        raise EvalError(
            f"--output-len {output_len}: prompts of up to {longest} tokens + {output_len} exceed the model's context "
            f"({server.max_model_len} tokens) on {server.url}: lower --output-len to at most "
            f"{server.max_model_len - longest}"
        )


# -- prompts ---------------------------------------------------------------------------------------------


def gsm8k_questions(data_dir: str | None) -> list[str]:
    """GSM8K test questions from ``data_dir/test.jsonl``, else from the hub's ``openai/gsm8k``."""
    if data_dir:
        path = Path(data_dir).expanduser() / "test.jsonl"
        if not path.is_file():
            raise EvalError(f"--data-dir {data_dir} has no test.jsonl: point it at a GSM8K folder")
        return [json.loads(line)["question"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        return list(load_gsm8k("test")["question"])
    except Exception as exc:
        raise EvalError(
            f"cannot load openai/gsm8k ({why_not_loaded(exc)}): pass --data-dir with GSM8K's test.jsonl"
        ) from None


def gsm8k_prompt(question: str) -> str:
    """lm-eval's gsm8k prompt format, zero-shot."""
    return f"Question: {question}\nAnswer:"


def make_rows(serving, tokenizer, cfg: BenchConfig, concurrency: int, questions: list[str] | None):
    from sglang_kimi.evals import sglang_bench

    n = cfg.prompts_for(concurrency)
    if cfg.dataset == "random":
        import numpy as np

        np.random.seed(cfg.seed + concurrency)
        return sglang_bench.random_rows(
            serving, tokenizer, input_len=cfg.input_len, output_len=cfg.output_len, num_prompts=n
        )
    rng = random.Random(cfg.seed + concurrency)
    picked = [questions[rng.randrange(len(questions))] for _ in range(n)]
    return sglang_bench.text_rows(serving, tokenizer, [gsm8k_prompt(q) for q in picked], cfg.output_len)


# -- one sweep -------------------------------------------------------------------------------------------


def _stats(result: dict, metric: str) -> dict:
    return {ours: float(result[f"{theirs}_{metric}_ms"]) for ours, theirs in STAT_KEYS.items()}


def adaptive_steps(info: dict) -> dict[str, int] | None:
    """Steps per draft width of an adaptive server (``--speculative-kimi-adaptive``), None for any other."""
    state = merged_report(info).get("adaptive")
    return dict(state["steps_by_width"]) if state else None


def widths_run(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int] | None:
    """Steps each width ran between two snapshots (the widths the policy chose for this level)."""
    if after is None:
        return None
    steps = {w: n - (before or {}).get(w, 0) for w, n in after.items()}
    return {w: n for w, n in steps.items() if n > 0}


def silent_failures(result: dict) -> int:
    """Requests SGLang's client counted as completed though no token arrived: a streamed request the server refuses
    gets HTTP 200 with one error event, which the client reads as success with the whole requested output."""
    errors, texts, ttfts = result.get("errors") or [], result.get("generated_texts") or [], result.get("ttfts") or []
    return sum(1 for error, text, ttft in zip(errors, texts, ttfts) if not error and not text and not ttft)


def summarize_level(
    concurrency: int, rows: int, result: dict, before: dict, after: dict, widths: dict[str, int] | None = None
) -> dict:
    """Our record of one level from SGLang's result dict and two acceptance snapshots."""
    errors = [e for e in result.get("errors", []) if e]
    acc = acceptance.level_acceptance(before, after)
    return {
        "concurrency": concurrency,
        "requests": rows,
        "completed": int(result["completed"]),
        "failed": len(errors),
        "duration_s": float(result["duration"]),
        "output_tokens": int(result["total_output_tokens"]),
        "input_tokens": int(result["total_input_tokens"]),
        "output_throughput": float(result["output_throughput"]),  # tok/s, all requests together
        "request_throughput": float(result["request_throughput"]),  # req/s
        "ttft_ms": _stats(result, "ttft"),
        "tpot_ms": _stats(result, "tpot"),
        "itl_ms": _stats(result, "itl"),
        "e2e_ms": _stats(result, "e2e_latency"),
        # tau of this level from the plugin's counters, else SGLang's lifetime average (None without speculation)
        "tau": acc["tau_level"] if acc and acc["tau_level"] is not None else after["tau"],
        "tau_sglang_lifetime": after["tau"],  # avg_spec_accept_length: since start-up, updated at SGLang's log steps
        "acceptance": acc,
        # adaptive servers: steps per draft width at this level, and the width most steps ran
        "adaptive_widths": widths,
        "chosen_width": int(max(widths, key=widths.get)) if widths else None,
        "first_error": errors[0][:500] if errors else None,
    }


def _server_info(url: str) -> dict:
    """``/server_info`` of the server, or of every worker behind a router: the acceptance counters of all of them."""
    from sglang_kimi.launcher.client import ServerQueryError
    from sglang_kimi.launcher.router import server_info

    try:
        return server_info(url, timeout=60)
    except ServerQueryError as exc:
        raise EvalError(str(exc)) from None


def sweep(server: Server, cfg: BenchConfig, out_dir: Path, label: str, questions: list[str] | None) -> list[dict]:
    """Every concurrency level against one server (``questions``: GSM8K's, for ``cfg.dataset`` gsm8k)."""
    from sglang_kimi.evals import sglang_bench

    serving = sglang_bench.import_serving()
    tokenizer_path = cfg.tokenizer or server.model_info.get("tokenizer_path") or server.model_path
    try:
        tokenizer = serving.get_tokenizer(tokenizer_path)
    except Exception as exc:
        raise EvalError(
            f"cannot load the tokenizer {tokenizer_path} ({type(exc).__name__}): pass --tokenizer PATH"
        ) from None
    rows_by_level = {c: make_rows(serving, tokenizer, cfg, c, questions) for c in cfg.concurrency}
    for rows in rows_by_level.values():  # every level checked before the first one runs
        check_rows_fit(rows, cfg.output_len, server)
    out_dir.mkdir(parents=True, exist_ok=True)  # once the levels can run: a refused sweep leaves no empty folder
    levels = []
    for c, rows in rows_by_level.items():
        print(f"\n[{label}] concurrency {c}: {len(rows)} requests, {cfg.output_len} output tokens each", flush=True)
        args = sglang_bench.bench_args(
            dataset="random-ids" if cfg.dataset == "random" else cfg.dataset,
            num_prompts=len(rows),
            input_len=cfg.input_len,
            output_len=cfg.output_len,
            warmup_requests=cfg.warmup_requests,
            output_file=str(out_dir / f"sglang_bench_serving_{label}.jsonl"),
        )
        info = _server_info(server.url)
        before, steps_before = acceptance.snapshot(info), adaptive_steps(info)
        try:
            result = sglang_bench.run_level(
                serving,
                base_url=server.url,
                model_id=server.served_model_name,
                tokenizer=tokenizer,
                rows=rows,
                concurrency=c,
                args=args,
            )
        except ValueError as exc:  # SGLang raises ValueError when every warm-up request fails
            raise EvalError(f"{server.url}: {str(exc)[:300]}") from None
        info = _server_info(server.url)
        after = acceptance.snapshot(info)
        level = summarize_level(c, len(rows), result, before, after, widths_run(steps_before, adaptive_steps(info)))
        if level["completed"] == 0:
            raise EvalError(f"{server.url}: every request at concurrency {c} failed: {level['first_error']}")
        silent = silent_failures(result)
        if silent:
            raise EvalError(
                f"{server.url}: {silent} of {len(rows)} requests at concurrency {c} got no token (the server answered "
                "with an error event; its log says why). SGLang's benchmark client counts them as completed with "
                "their whole output, so the level's numbers would be wrong"
            )
        levels.append(level)
    return levels


# -- the command -----------------------------------------------------------------------------------------


def speedups(levels: list[dict], baseline: list[dict]) -> list[dict]:
    """Per concurrency: throughput ratio (candidate / baseline) and TPOT ratio (baseline / candidate)."""
    base = {lv["concurrency"]: lv for lv in baseline}
    out = []
    for lv in levels:
        b = base.get(lv["concurrency"])
        if b is None:
            continue
        out.append(
            {
                "concurrency": lv["concurrency"],
                "throughput_speedup": lv["output_throughput"] / b["output_throughput"]
                if b["output_throughput"]
                else None,
                "tpot_speedup": b["tpot_ms"]["mean"] / lv["tpot_ms"]["mean"] if lv["tpot_ms"]["mean"] else None,
            }
        )
    return out


def _fmt(x, spec: str = ".1f") -> str:
    return "n/a" if x is None else format(x, spec)


def table(levels: list[dict], baseline: list[dict] | None) -> str:
    """The console summary: one row per concurrency level (and speedups with a baseline)."""
    cols = ["conc", "tok/s", "TPOT mean", "p50", "p95", "p99", "ITL p50", "p99", "TTFT mean", "p50", "p99", "tau"]
    if baseline:
        cols += ["base tok/s", "speedup", "TPOT x"]
    rows = []
    base = {lv["concurrency"]: lv for lv in baseline or []}
    ratios = {s["concurrency"]: s for s in speedups(levels, baseline)} if baseline else {}
    for lv in levels:
        t, i, f = lv["tpot_ms"], lv["itl_ms"], lv["ttft_ms"]
        row = [str(lv["concurrency"]), _fmt(lv["output_throughput"])]
        row += [_fmt(t[k]) for k in ("mean", "p50", "p95", "p99")] + [_fmt(i["p50"]), _fmt(i["p99"])]
        row += [_fmt(f[k]) for k in ("mean", "p50", "p99")] + [_fmt(lv["tau"], ".2f")]
        if baseline:
            b, r = base.get(lv["concurrency"]), ratios.get(lv["concurrency"], {})
            row += [
                _fmt(b["output_throughput"] if b else None),
                _fmt(r.get("throughput_speedup"), ".2f") + "x",
                _fmt(r.get("tpot_speedup"), ".2f") + "x",
            ]
        rows.append(row)
    widths = [max(len(c), *(len(r[k]) for r in rows)) for k, c in enumerate(cols)]
    lines = ["(times in ms)", "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(x.rjust(w) for x, w in zip(r, widths)) for r in rows]
    acc = [lv for lv in levels if lv["acceptance"]]
    for lv in acc:
        rates = ", ".join(_fmt(r, ".2f") for r in lv["acceptance"]["acceptance_per_position"])
        lines.append(
            f"acceptance by position @ concurrency {lv['concurrency']}: [{rates}]  "
            f"tau(level) {_fmt(lv['acceptance']['tau_level'], '.2f')}"
        )
    if not acc:
        lines.append("acceptance by position: n/a (the server reports no speculative-decoding counters)")
    for lv in levels:
        if lv.get("adaptive_widths"):
            total = sum(lv["adaptive_widths"].values())
            shares = ", ".join(
                f"{w}: {100 * n / total:.0f}%"
                for w, n in sorted(lv["adaptive_widths"].items(), key=lambda x: int(x[0]))
            )
            lines.append(f"adaptive widths @ concurrency {lv['concurrency']}: chosen {lv['chosen_width']} ({shares})")
    return "\n".join(lines)


def _check_bench_servers(args: argparse.Namespace) -> None:
    if args.launch and args.base_url:
        raise EvalError("--launch starts the server: drop --base-url, or drop --launch")
    if not args.launch and not args.base_url:
        raise EvalError("give --base-url URL (a running SGLang server) or --launch to start one here")
    if not args.launch and (
        args.model_path or args.server_args or args.baseline_args is not None or args.launch_timeout is not None
    ):
        raise EvalError("--model-path / --server-args / --baseline-args / --launch-timeout only apply with --launch")
    if args.baseline_url and args.baseline_args is not None:
        raise EvalError("give the baseline once: --baseline-url (running) or --baseline-args (launched)")


def _check_dataset_flags(args: argparse.Namespace) -> None:
    """Refuse a flag the chosen prompts would ignore."""
    dataset = _dataset(args)
    if dataset != "random" and args.input_len is not None:
        raise EvalError(
            f"--input-len sets the length of random prompts, and the prompts here are {dataset} questions: "
            "add --dataset random, or drop --input-len"
        )
    if dataset == "random" and args.data_dir:
        raise EvalError("--data-dir holds GSM8K questions, and --dataset random makes its own prompts: drop one")


def run_bench_command(args: argparse.Namespace, out_dir: Path) -> int:
    from sglang_kimi.evals import plots

    _check_bench_servers(args)
    # bad flags fail before any server starts
    if args.concurrency:
        parse_concurrency(args.concurrency)
    check_load(args.input_len, args.output_len, args.num_prompts, args.warmup_requests)
    _check_dataset_flags(args)
    if args.launch_timeout is not None and not 0 < args.launch_timeout < math.inf:
        raise EvalError(f"--launch-timeout {args.launch_timeout}: give a number of seconds above 0")
    # loaded once for both servers; with --launch before they start (no test.jsonl in the folder, or no hub: refused)
    questions = gsm8k_questions(args.data_dir) if args.launch and _dataset(args) == "gsm8k" else None
    with ExitStack() as stack:
        if args.launch:
            model = ["--model-path", args.model_path] if args.model_path else []
            specs = {"server": model + split_args(args.server_args)}
            if args.baseline_args is not None:
                specs["baseline"] = model + split_args(args.baseline_args)
            print(f"starting {' and '.join(specs)} (logs in {out_dir}) ...", flush=True)
            urls = launch_pair(specs, stack, out_dir, timeout=args.launch_timeout or LAUNCH_TIMEOUT)
        else:
            urls = {"server": args.base_url}
        if args.baseline_url:
            urls["baseline"] = args.baseline_url
        server = probe(urls["server"])
        baseline = probe(urls["baseline"]) if "baseline" in urls else None
        if baseline:
            check_same_model(baseline, server)
        cfg = resolve_config(args, server)
        if cfg.dataset == "gsm8k" and questions is None:
            questions = gsm8k_questions(cfg.data_dir)
        levels = sweep(server, cfg, out_dir, "server", questions)
        base_levels = sweep(baseline, cfg, out_dir, "baseline", questions) if baseline else None
    data = {
        "config": asdict(cfg),
        "server": server.summary(),
        "levels": levels,
        "baseline": {"server": baseline.summary(), "levels": base_levels} if baseline else None,
        "speedup": speedups(levels, base_levels) if base_levels else None,
    }
    (out_dir / "bench.json").write_text(json.dumps(data, indent=2) + "\n")
    pngs = plots.write_all(data, out_dir)
    print("\n" + table(levels, base_levels))
    print(f"results: {out_dir / 'bench.json'}  plots: {', '.join(p.name for p in pngs)}")
    return 0
