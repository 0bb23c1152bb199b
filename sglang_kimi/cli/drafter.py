"""``sglang-kimi drafter``: the target's answers as SpecForge training data (``regenerate``), and SpecForge's draft
config for a target (``config``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglang_kimi.errors import command_failed
from sglang_kimi.launcher.api_key import HELP as API_KEY_HELP
from sglang_kimi.launcher.api_key import use_api_key


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: give 1 or more")
    return value


def add_drafter_parser(sub) -> None:
    drafter = sub.add_parser(
        "drafter",
        help="a drafter matched to the target: its answers as SpecForge training data, SpecForge's draft config",
        description="Tools for training a drafter on the target's own outputs with SpecForge (docs/drafters.md).",
    )
    commands = drafter.add_subparsers(dest="drafter_command", metavar="COMMAND", required=True)

    regen = commands.add_parser(
        "regenerate",
        help="answer a prompt set with the target's server, written as SpecForge's regenerated-conversation jsonl",
        description="Sends every user turn of every row to the target's SGLang server (/v1/chat/completions, the "
        "conversation so far) and writes the rows with the target's answers in SpecForge's format (OUT), the rows "
        "the server failed on (OUT_error.jsonl) and the rows that cannot be regenerated (OUT_skipped.jsonl). Input: "
        "a .jsonl file or a .json array of rows with conversations / messages (role + content, or ShareGPT's from + "
        "value) or a prompt / question / instruction text.",
    )
    regen.add_argument("--input", required=True, type=Path, help="prompts: .jsonl, or a .json array (ShareGPT)")
    regen.add_argument("--output", required=True, type=Path, help="the regenerated rows (.jsonl)")
    regen.add_argument(
        "--base-url",
        required=True,
        nargs="+",
        metavar="URL",
        help="the target's server (several: requests alternate between them)",
    )
    regen.add_argument("--concurrency", type=_positive, default=16, help="rows in flight (default 16)")
    regen.add_argument("--max-tokens", type=_positive, default=2048, help="tokens per answer (default 2048)")
    regen.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    regen.add_argument("--top-p", type=float, default=None)
    regen.add_argument("--top-k", type=int, default=None)
    regen.add_argument(
        "--reasoning",
        choices=("none", "save", "disable"),
        default="none",
        help="none: as the chat template does; save: thinking on, its text kept as reasoning_content "
        "(needs the server's --reasoning-parser); disable: thinking off",
    )
    regen.add_argument("--limit", type=_positive, default=None, help="only the first N rows")
    regen.add_argument(
        "--resume",
        action="store_true",
        help="continue OUT: rows already answered or skipped are kept, failed ones tried again",
    )
    regen.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    regen.add_argument("--api-key", default=None, help=API_KEY_HELP)

    config = commands.add_parser(
        "config",
        help="SpecForge's draft-model config for a target (--draft-config), with everything the plugin checks",
        description="Writes the draft config SpecForge trains from (its --draft-config) for the target: the mask "
        "token id, the target layers read, the target's depth, full-attention layers and the target's name, so "
        "that SpecForge's export of the trained drafter carries every field the plugin checks when it serves it.",
    )
    config.add_argument("--algorithm", choices=("dflash", "eagle3"), required=True)
    config.add_argument("--target", required=True, type=Path, help="the target checkpoint's folder")
    config.add_argument(
        "--target-name",
        default=None,
        help="the target's hub id, written as target_model_name_or_path (default: --target)",
    )
    config.add_argument(
        "--draft-layers",
        type=_positive,
        default=None,
        help="DFlash: decoder layers of the drafter (Kimi default 6, else 5)",
    )
    config.add_argument("--block-size", type=_positive, default=None, help="DFlash: tokens a block drafts (default 8)")
    config.add_argument(
        "--mask-token-id",
        type=int,
        default=None,
        help="DFlash: the mask token (default: Kimi's [UNK] 163838, else the tokenizer's mask or unknown token)",
    )
    config.add_argument(
        "--draft-vocab-size",
        type=_positive,
        default=None,
        help="EAGLE3: the drafter's vocabulary (default: the target's)",
    )
    config.add_argument("--output", type=Path, default=None, help="write it here (default: print it)")

    compare = commands.add_parser(
        "compare",
        help="DFlash drafters of one target on the same prompts: tau by tree budget, acceptance by depth, the best "
        "budget per concurrency",
        description="Serves the target with each drafter in turn as a DFlash tree (--budget nodes, its acceptance "
        "trace on), answers every prompt set greedily, and prints and writes (JSON and PNG under --out) tau by tree "
        "budget, acceptance by depth of the accepted path and, with --step-costs, the budget with the most tokens "
        "per second at each concurrency. Extra SGLang flags for the servers go after --.",
    )
    compare.add_argument("--target", required=True, help="the target checkpoint (folder or hub id)")
    compare.add_argument(
        "--drafter",
        required=True,
        action="append",
        metavar="NAME=PATH",
        help="a DFlash drafter to compare, named; give two or more",
    )
    compare.add_argument(
        "--prompts",
        action="append",
        metavar="NAME=FILE",
        default=None,
        help="a prompt set (.jsonl or .json, the forms of `drafter regenerate`; default: the "
        "embedded GSM8K questions as gsm8k)",
    )
    compare.add_argument("--num-prompts", type=_positive, default=None, help="at most this many of each set")
    compare.add_argument("--budget", type=_positive, default=16, help="the widest tree budget measured (default 16)")
    compare.add_argument("--max-tokens", type=_positive, default=128, help="tokens per answer (default 128)")
    compare.add_argument("--concurrency", type=_positive, default=4, help="requests in flight (default 4)")
    compare.add_argument(
        "--step-costs",
        type=Path,
        default=None,
        help="a step-costs table (bench/bench_step_cost.py, bench/project_kimi.py --step-costs) for "
        "the best budget per concurrency; without it that table is left out",
    )
    compare.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results/drafter_compare"),
        help="folder for drafter_compare.json / .png (default bench/results/drafter_compare)",
    )


def run_drafter(args, server_args: list[str] = ()) -> int:
    if args.drafter_command == "regenerate":
        return _regenerate(args)
    if args.drafter_command == "compare":
        return _compare(args, list(server_args))
    return _config(args)


def _named(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"{flag} {value}: give NAME=PATH")
        if name in out:
            raise ValueError(f"{flag} {value}: the name {name} is given twice")
        out[name] = path
    return out


def _compare(args, server_args: list[str]) -> int:
    from sglang_kimi.assets import DEMO_QUESTIONS
    from sglang_kimi.drafters.compare import CompareError, compare, load_prompt_set, print_tables, write

    try:
        drafters = _named(args.drafter, "--drafter")
        sets = _named(args.prompts, "--prompts") if args.prompts else {"gsm8k": str(DEMO_QUESTIONS)}
    except ValueError as exc:
        return command_failed(str(exc))
    if len(drafters) < 2:
        return command_failed("--drafter: give two or more drafters to compare (NAME=PATH each)")
    costs = None
    if args.step_costs is not None:
        from sglang_kimi.speculative.adaptive.profile import StepCostsError, read_step_costs

        try:
            costs = read_step_costs(args.step_costs).seconds.get("tree")
        except StepCostsError as exc:
            return command_failed(str(exc))
        if not costs:
            return command_failed(f"--step-costs {args.step_costs} has no tree costs: measure them in tree mode")
    try:
        prompt_sets = {name: load_prompt_set(Path(path), args.num_prompts) for name, path in sets.items()}
        data = compare(args.target, drafters, prompt_sets, budget=args.budget, max_tokens=args.max_tokens,
                       concurrency=args.concurrency, server_args=server_args, step_costs=costs,
                       log_dir=args.out / "logs")  # fmt: skip
    except (CompareError, OSError) as exc:
        return command_failed(str(exc))
    print_tables(data)
    for path in write(data, args.out):
        print(f"wrote {path}")
    return 0


def _regenerate(args) -> int:
    from sglang_kimi.drafters.regenerate import RegenerateError, Sampling, regenerate

    use_api_key(args.api_key)
    if not args.input.is_file():
        return command_failed(f"--input {args.input} does not exist")
    sampling = Sampling(args.max_tokens, args.temperature, args.top_p, args.top_k, args.reasoning)
    try:
        summary = regenerate(
            args.input,
            args.output,
            args.base_url,
            sampling,
            concurrency=args.concurrency,
            limit=args.limit,
            resume=args.resume,
            timeout=args.timeout,
        )
    except RegenerateError as exc:
        return command_failed(str(exc))
    print(
        f"{summary.success} rows answered -> {args.output}"
        + (f" ({summary.resumed} from before)" if args.resume else "")
    )
    if summary.skipped:
        reasons = "; ".join(f"{n} x {why}" for why, n in sorted(summary.reasons.items(), key=lambda kv: -kv[1])[:5])
        print(f"{summary.skipped} rows skipped (cannot be regenerated: {reasons}) -> see the _skipped.jsonl file")
    if summary.error:
        print(
            f"{summary.error} rows failed on the server -> the _error.jsonl file; run again with --resume to retry "
            "them",
            file=sys.stderr,
        )
        return 1
    return 0


def _config(args) -> int:
    from sglang_kimi.drafters.draft_config import DraftConfigError, dflash_config, eagle3_config

    try:
        if args.algorithm == "dflash":
            config = dflash_config(
                args.target,
                draft_layers=args.draft_layers,
                block_size=args.block_size,
                mask_id=args.mask_token_id,
                target_name=args.target_name,
            )
        else:
            config = eagle3_config(args.target, target_name=args.target_name, draft_vocab_size=args.draft_vocab_size)
    except DraftConfigError as exc:
        return command_failed(str(exc))
    text = json.dumps(config, indent=2)
    if args.output is None:
        print(text)
    else:
        args.output.write_text(text + "\n")
        print(f"wrote {args.output}")
    return 0
