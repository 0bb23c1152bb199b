"""``sglang-kimi eval gsm8k`` and ``sglang-kimi bench``: argument parsers and entry points.

``sglang_kimi.cli.main`` adds these parsers to its subcommands. Exit codes: 0 pass (or benchmark done), 1 the gate
failed, 2 bad input or an unusable server (one line on stderr naming the problem and the fix).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from sglang_kimi.errors import command_failed
from sglang_kimi.evals.errors import EvalError
from sglang_kimi.launcher.api_key import HELP as API_KEY_HELP
from sglang_kimi.launcher.api_key import use_api_key

EVAL_EPILOG = """\
verdict (exit code 0 pass, 1 fail, 2 error):
  accuracy              for flexible-extract and strict-match, the candidate's drop must not exceed --max-drop
                        percentage points with paired one-sided significance p < --alpha
  identical generations with greedy decoding (default), every candidate generation must equal the baseline's
                        for the same prompt: a lossless method reproduces the target exactly, and on a model
                        with near-zero accuracy (the tiny CPU model) this is the criterion that can fail.
                        --no-require-identical turns it off (lossy candidates; bf16 near-tie rounding on GPU)

examples:
  sglang-kimi eval gsm8k --baseline http://host:30000 --candidate http://host:30001 --seeds 3
  sglang-kimi eval gsm8k --launch --model-path moonshotai/Kimi-K2.6 --baseline-args "--tp 8" \\
      --candidate-args "--tp 8 --speculative-algorithm DFLASH --speculative-draft-model-path z-lab/Kimi-K2.6-DFlash"
  sglang-kimi eval gsm8k --launch --candidate-args "--max-running-requests 4" \\
      --data-dir /data/gsm8k --limit 10 --seeds 2 --num-fewshot 1   # the tiny model on CPU, offline
"""

BENCH_EPILOG = """\
presets (the published Kimi-K2.6 speculative-decoding runs):
  --preset long     random prompts, 10240 input / 512 output tokens
  --preset gsm8k    GSM8K questions, 512 output tokens
defaults: on a GPU server concurrency 1,8,32,64, 512 output tokens (random: 1024 input); on a CPU server
(SGLang reports device cpu) concurrency 1,2,4, 32 output tokens (random: 128 input).

metrics: output throughput (tok/s), TPOT, ITL, TTFT (mean, p50, p95, p99) from SGLang's own benchmark code
(sglang.benchmark.serving); tau = SGLang's avg_spec_accept_length; per-position acceptance from the plugin's
counters in /server_info (n/a without speculative decoding).

examples:
  sglang-kimi bench --base-url http://host:30001 --baseline-url http://host:30000 --data-dir /data/gsm8k
  sglang-kimi bench --launch --server-args "--speculative-algorithm DFLASH ..." --baseline-args "" --preset gsm8k
  sglang-kimi bench --launch --server-args "--attention-backend kimi_cpu --speculative-algorithm DFLASH \
      --speculative-draft-model-path DRAFTER" --baseline-url http://127.0.0.1:30000 --data-dir /data/gsm8k  # CPU
"""


def _default_out(kind: str) -> Path:
    return Path(f"sglang-kimi-{kind}-{time.strftime('%Y%m%d-%H%M%S')}")


def check_output_dir(path: Path) -> None:
    """Refuse an ``--output-dir`` that cannot be written before any server starts or request runs: it is created,
    then what was created is removed again (a run that fails early leaves no empty folder)."""
    if path.exists():
        if not path.is_dir():
            raise EvalError(f"--output-dir {path} is a file: give a folder")
        if not os.access(path, os.W_OK):
            raise EvalError(f"--output-dir {path} is not writable: give a writable folder")
        return
    missing, parent = [], path
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        raise EvalError(f"--output-dir {path}: cannot create it ({exc.strerror or exc}): give a writable folder")
    for folder in missing:  # deepest first
        folder.rmdir()


# -- eval ------------------------------------------------------------------------------------------------


def add_eval_parser(sub) -> argparse.ArgumentParser:
    evaluate = sub.add_parser(
        "eval",
        help="accuracy gate: lm-eval GSM8K on a baseline and a candidate server, compared",
        description="Accuracy gates built on lm-eval.",
    )
    tasks = evaluate.add_subparsers(dest="eval_task", metavar="TASK")
    p = tasks.add_parser(
        "gsm8k",
        help="GSM8K (lm-eval's gsm8k task) on baseline vs candidate; exit 0 pass, 1 fail, 2 error",
        description="Run lm-eval's own gsm8k task (local-completions against each server's /v1/completions) on a "
        "baseline and a candidate server with the same seeds, report exact_match per seed, mean, std, the "
        "difference with a paired z statistic, how many generations differ, and a verdict.",
        epilog=EVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    servers = p.add_argument_group("servers (give --baseline and --candidate, or --launch)")
    servers.add_argument("--baseline", metavar="URL", help="running SGLang server used as the reference")
    servers.add_argument("--candidate", metavar="URL", help="running SGLang server under test")
    servers.add_argument("--launch", action="store_true", help="start both servers here with the plugin's launcher")
    servers.add_argument("--model-path", help="with --launch: model of both servers (default: the embedded tiny model)")
    servers.add_argument(
        "--baseline-args", default="", metavar="ARGS", help="with --launch: extra SGLang flags of the baseline"
    )
    servers.add_argument(
        "--candidate-args", default="", metavar="ARGS", help="with --launch: extra SGLang flags of the candidate"
    )
    _add_wait_and_key(servers)

    run = p.add_argument_group("lm-eval")
    run.add_argument(
        "--num-fewshot", type=int, default=5, help="few-shot examples (published Kimi runs: 3, 5, 10; default 5)"
    )
    run.add_argument("--limit", type=int, default=None, help="first N test questions (default: all 1319)")
    run.add_argument("--seeds", default="3", help="a count (seeds 1234, 1235, ...) or a list like 1,7,42 (default 3)")
    run.add_argument("--num-concurrent", type=int, default=16, help="concurrent requests per server (default 16)")
    run.add_argument("--max-gen-toks", type=int, default=256, help="new tokens per answer (default 256, lm-eval's)")
    run.add_argument("--temperature", type=float, default=0.0, help="0 = greedy, the task's own setting (default)")
    run.add_argument("--data-dir", help="folder with GSM8K train.jsonl and test.jsonl: the same task, offline")
    run.add_argument("--request-timeout", type=int, default=600, help="seconds per request (default 600)")

    gate = p.add_argument_group("verdict")
    gate.add_argument(
        "--max-drop", type=float, default=1.0, help="allowed accuracy drop, percentage points (default 1)"
    )
    gate.add_argument("--alpha", type=float, default=0.05, help="significance of a drop, one-sided (default 0.05)")
    gate.add_argument(
        "--require-identical",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fail when any generation differs from the baseline's (default: on for greedy decoding, "
        "off when sampling, where it is refused: exact sampling does not reproduce the draws)",
    )
    p.add_argument("--output-dir", help="where gsm8k_gate.json / .md go (default ./sglang-kimi-eval-<time>)")
    return evaluate


def _add_wait_and_key(servers) -> None:
    """The two server options ``eval`` and ``bench`` share: how long launched servers may take, and the API key."""
    servers.add_argument(
        "--launch-timeout",
        type=float,
        default=None,
        help="with --launch: seconds to wait for the servers (default 900)",
    )
    servers.add_argument("--api-key", default=None, help=API_KEY_HELP)


def _gate_config(args: argparse.Namespace):
    from sglang_kimi.evals.gsm8k import GateConfig, parse_seeds

    if args.limit is not None and args.limit < 1:
        raise EvalError(f"--limit {args.limit}: give at least 1 question (or leave it out for all of them)")
    if args.num_fewshot < 0:
        raise EvalError(f"--num-fewshot {args.num_fewshot}: give 0 or more")
    for flag, value in (("--num-concurrent", args.num_concurrent), ("--max-gen-toks", args.max_gen_toks)):
        if value < 1:
            raise EvalError(f"{flag} {value}: give 1 or more")
    if not args.temperature >= 0 or math.isinf(args.temperature):
        raise EvalError(f"--temperature {args.temperature}: give 0 (greedy) or a positive temperature")
    if args.require_identical and args.temperature > 0:
        raise EvalError(
            f"--require-identical with --temperature {args.temperature}: two servers that both sample the target's "
            "distribution exactly still draw different tokens, so generations cannot be required identical when "
            "sampling; drop --require-identical (the accuracy gate still applies) or decode greedily (--temperature 0)"
        )
    if not 0 <= args.max_drop < math.inf or not 0 < args.alpha < 1:
        raise EvalError("--max-drop must be >= 0 and --alpha in (0, 1)")
    for flag, seconds in (("--request-timeout", args.request_timeout), ("--launch-timeout", args.launch_timeout)):
        if seconds is not None and not 0 < seconds < math.inf:
            raise EvalError(f"{flag} {seconds}: give a number of seconds above 0")
    return GateConfig(
        num_fewshot=args.num_fewshot,
        limit=args.limit,
        seeds=parse_seeds(args.seeds),
        num_concurrent=args.num_concurrent,
        max_gen_toks=args.max_gen_toks,
        temperature=args.temperature,
        max_drop=args.max_drop,
        alpha=args.alpha,
        require_identical=args.require_identical,
        request_timeout=args.request_timeout,
    )


def _check_eval_servers(args: argparse.Namespace) -> None:
    given = [flag for flag, v in (("--baseline", args.baseline), ("--candidate", args.candidate)) if v]
    if args.launch and given:
        raise EvalError(f"--launch starts both servers: drop {' and '.join(given)}, or drop --launch")
    if not args.launch and len(given) != 2:
        raise EvalError("give both --baseline URL and --candidate URL, or --launch to start them here")
    if not args.launch and (
        args.model_path or args.baseline_args or args.candidate_args or args.launch_timeout is not None
    ):
        raise EvalError("--model-path / --baseline-args / --candidate-args / --launch-timeout only apply with --launch")


def cmd_eval(args: argparse.Namespace) -> int:
    if args.eval_task != "gsm8k":
        return command_failed("name the task: sglang-kimi eval gsm8k --help")
    use_api_key(args.api_key)
    try:
        return _eval_gsm8k(args)
    except EvalError as exc:
        return command_failed(str(exc))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def _eval_gsm8k(args: argparse.Namespace) -> int:
    from sglang_kimi.evals import report
    from sglang_kimi.evals.gsm8k import check_generation_fits, run_gate
    from sglang_kimi.evals.gsm8k_task import check_stock_data, task_spec
    from sglang_kimi.evals.servers import LAUNCH_TIMEOUT, check_same_model, launch_pair, probe, split_args

    cfg = _gate_config(args)
    _check_eval_servers(args)
    out_dir = Path(args.output_dir) if args.output_dir else _default_out("eval")
    check_output_dir(out_dir)
    if args.launch and not args.data_dir:
        check_stock_data()  # launched servers take minutes to start: lm-eval's data set is checked first
    with ExitStack() as stack:
        # --data-dir: the task YAML is rendered into a temporary folder; its text goes into the JSON report
        task = task_spec(args.data_dir, stack.enter_context(tempfile.TemporaryDirectory()) if args.data_dir else None)
        if args.launch:
            model = ["--model-path", args.model_path] if args.model_path else []
            specs = {
                "baseline": model + split_args(args.baseline_args),
                "candidate": model + split_args(args.candidate_args),
            }
            print(f"starting baseline and candidate servers (logs in {out_dir}) ...", flush=True)
            urls = launch_pair(specs, stack, out_dir, timeout=args.launch_timeout or LAUNCH_TIMEOUT)
        else:
            urls = {"baseline": args.baseline, "candidate": args.candidate}
        baseline, candidate = probe(urls["baseline"]), probe(urls["candidate"])
        check_same_model(baseline, candidate)
        check_generation_fits(cfg, baseline, candidate)
        print(f"baseline  {baseline.url}  {baseline.model_path}  speculative: {baseline.speculative}")
        print(f"candidate {candidate.url}  {candidate.model_path}  speculative: {candidate.speculative}", flush=True)
        result = run_gate(baseline, candidate, cfg, task)
    json_path, md_path = report.write(result, out_dir)
    print(report.console(result))
    print(f"report: {md_path}  data: {json_path}")
    return result.exit_code


# -- bench -----------------------------------------------------------------------------------------------


def add_bench_parser(sub) -> argparse.ArgumentParser:
    from sglang_kimi.evals.bench import PRESETS

    p = sub.add_parser(
        "bench",
        help="serving benchmark: concurrency sweep, throughput / TPOT / ITL / TTFT, tau, acceptance by position",
        description="Concurrency sweep against an SGLang server, driven by SGLang's own benchmark code "
        "(sglang.benchmark.serving); JSON and PNG plots; with a baseline, speedup per concurrency.",
        epilog=BENCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    servers = p.add_argument_group(
        "servers (give --base-url or --launch; a baseline by --baseline-url or --baseline-args)"
    )
    servers.add_argument("--base-url", metavar="URL", help="running SGLang server to benchmark")
    servers.add_argument("--baseline-url", metavar="URL", help="side by side: the same sweep against this server")
    servers.add_argument("--launch", action="store_true", help="start the server(s) here with the plugin's launcher")
    servers.add_argument("--model-path", help="with --launch: model (default: the embedded tiny model)")
    servers.add_argument("--server-args", default="", metavar="ARGS", help="with --launch: SGLang flags of the server")
    servers.add_argument(
        "--baseline-args", default=None, metavar="ARGS", help="with --launch: also start a baseline with these flags"
    )
    _add_wait_and_key(servers)

    load = p.add_argument_group("load")
    load.add_argument("--preset", choices=sorted(PRESETS), help="the published settings (see below)")
    load.add_argument("--concurrency", help="comma-separated levels (default 1,8,32,64; 1,2,4 on a CPU server)")
    load.add_argument("--dataset", choices=("gsm8k", "random"), default=None, help="prompts (default gsm8k)")
    load.add_argument("--data-dir", help="GSM8K folder with test.jsonl (default: the hub's openai/gsm8k)")
    load.add_argument("--input-len", type=int, help="random prompts: input tokens")
    load.add_argument("--output-len", type=int, help="output tokens per request (EOS ignored, fixed length)")
    load.add_argument(
        "--num-prompts", type=int, help="requests per level (default max(4, 4 x concurrency), 2 x on CPU)"
    )
    load.add_argument(
        "--warmup-requests", type=int, default=1, help="warm-up requests per level, not measured (default 1)"
    )
    load.add_argument("--tokenizer", help="tokenizer path (default: the server's tokenizer_path)")
    load.add_argument("--seed", type=int, default=1, help="prompt sampling seed (default 1)")
    p.add_argument("--output-dir", help="where bench.json and the PNGs go (default ./sglang-kimi-bench-<time>)")
    return p


def cmd_bench(args: argparse.Namespace) -> int:
    from sglang_kimi.evals.bench import run_bench_command

    use_api_key(args.api_key)
    try:
        out_dir = Path(args.output_dir) if args.output_dir else _default_out("bench")
        check_output_dir(out_dir)
        return run_bench_command(args, out_dir)
    except EvalError as exc:
        return command_failed(str(exc))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
