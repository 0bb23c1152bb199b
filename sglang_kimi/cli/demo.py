"""``sglang-kimi demo``: the embedded tiny Kimi model in real SGLang, autoregressive then speculative.

Each mode is a real SGLang server started with the plugin (on this machine's device; on CPU with the plugin's
``kimi_cpu`` attention backend, which serves every speculative forward mode). The demo asks the same GSM8K
questions in every mode, prints the autoregressive answers, and for every speculative mode tau, per-position
acceptance, tokens/s and whether its output equals the autoregressive output token for token.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from sglang_kimi.assets import ASSETS_DIR, DEMO_QUESTIONS, TINY_DFLASH2
from sglang_kimi.launcher.server import (
    ANY_PORT,
    TINY_DFLASH,
    TINY_EAGLE3,
    LaunchError,
    fetch_plugin_state,
    has_gpu,
    require_sglang,
    start_server,
)

STOP = ["Question:", "\n\n"]


def mode_args(assets: Path = ASSETS_DIR) -> dict[str, list[str]]:
    """name -> SGLang arguments of each demo mode (added to the plugin's launch defaults), with the drafters of the
    ``assets`` folder (``scripts/check_sglang_range.py`` passes the assets of the tree it checks)."""
    dflash = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(assets / TINY_DFLASH.name)]
    return {
        "autoregressive": [],
        "dflash-chain": dflash,
        "dflash-tree": dflash + ["--speculative-dflash-tree-budget", "16"],
        # DFlash2 (a candidate selector over the block), adaptive widths over its chains
        "dflash2-adaptive": ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
                             str(assets / TINY_DFLASH2.name), "--speculative-kimi-adaptive"],
        "eagle3-tree": [
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(assets / TINY_EAGLE3.name),
            "--speculative-num-steps", "4", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "12",
        ],
    }  # fmt: skip


MODES: dict[str, list[str]] = mode_args()
CPU_ARGS = ["--attention-backend", "kimi_cpu"]  # the plugin's CPU backend: chains, trees, drafts


def gsm8k_prompt(question: str) -> str:
    """The zero-shot form of lm-eval's gsm8k prompt, which the tiny model was trained on."""
    return f"Question: {question}\nAnswer:"


@dataclass
class Answer:
    question: str
    text: str
    output_ids: list[int]
    seconds: float


@dataclass
class ModeResult:
    name: str
    answers: list[Answer] = field(default_factory=list)
    state: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        tokens = sum(len(a.output_ids) for a in self.answers)
        seconds = sum(a.seconds for a in self.answers)
        return tokens / seconds if seconds > 0 else 0.0


def ask(base_url: str, question: str, max_new_tokens: int) -> Answer:
    start = time.perf_counter()
    response = requests.post(
        base_url + "/generate",
        json={
            "text": gsm8k_prompt(question),
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "stop": STOP},
        },
        timeout=600,
    )
    response.raise_for_status()
    out = response.json()
    return Answer(question, out["text"].strip(), out["output_ids"], time.perf_counter() - start)


def load_questions(n: int | None = None) -> list[str]:
    """The first ``n`` demo questions (all of them for None); more than there are is a LaunchError."""
    questions = [json.loads(line)["question"] for line in DEMO_QUESTIONS.read_text().splitlines() if line.strip()]
    if n is not None and n > len(questions):
        raise LaunchError(f"--questions {n}: the demo has {len(questions)} questions, ask for at most that many")
    return questions[:n]


def print_registrations(state: dict) -> None:
    registrations = state.get("registrations", {})
    print(f"plugin sglang-kimi {state.get('version', '?')} in the scheduler (pid {state.get('pid', '?')}):")
    for name, outcome in registrations.items():
        print(f"  {name:<26} {outcome}")
    if not registrations:
        print("  NOT LOADED: the scheduler reported no sglang-kimi state")


def run_mode(name: str, questions: list[str], args: argparse.Namespace, log_dir: Path) -> ModeResult:
    sglang_args = MODES[name] + ([] if has_gpu() else CPU_ARGS)
    log_path = log_dir / f"{name}.log"
    print(f"\n== {name}: starting SGLang (log: {log_path}) ...", flush=True)
    result = ModeResult(name)
    with start_server(sglang_args, port=args.port or ANY_PORT, log_path=log_path) as server:
        for question in questions:
            result.answers.append(ask(server.base_url, question, args.max_new_tokens))
        result.state = fetch_plugin_state(server.base_url)
    return result


def format_rates(metrics: dict | None) -> str:
    if not metrics or not metrics.get("steps"):
        return "-"
    return " ".join(f"{rate:.2f}" for rate in metrics["acceptance_rate_per_position"])


def same_answer(answer: Answer, reference: Answer) -> bool:
    """The same text, and the same tokens up to where the reference stopped. With a stop string SGLang trims the
    text at the stop but keeps in ``output_ids`` the tokens a speculative step accepted after it (up to the step's
    accept length), so a speculative answer's ids may run a few tokens past the reference's."""
    ids, ref = answer.output_ids, reference.output_ids
    return answer.text == reference.text and ids[: len(ref)] == ref


def matches_reference(result: ModeResult, reference: ModeResult) -> bool:
    """Whether every answer of ``result`` equals the reference mode's (:func:`same_answer`). The summary table and
    the demo's exit code both come from this one function."""
    return len(result.answers) == len(reference.answers) and all(
        same_answer(a, r) for a, r in zip(result.answers, reference.answers)
    )


def registration_failed(result: ModeResult) -> bool:
    """The scheduler reported a failed registration, or no plugin state at all."""
    return bool(result.state.get("failed")) or not result.state.get("registrations")


def print_summary(results: list[ModeResult]) -> None:
    reference = results[0]
    print(f"\n{'mode':<15} {'tokens/s':>9} {'tau':>6}  {'= autoregressive':<17} acceptance by draft position")
    for result in results:
        metrics = result.state.get("spec_metrics")
        tau = f"{metrics['tau']:.2f}" if metrics and metrics.get("tau") else "1.00"
        same = "reference" if result is reference else ("yes" if matches_reference(result, reference) else "NO")
        print(f"{result.name:<15} {result.tokens_per_second:>9.1f} {tau:>6}  {same:<17} {format_rates(metrics)}")


def exit_code(results: list[ModeResult]) -> int:
    """0 when every mode registered the plugin and reproduced the reference's answers, else 1 (with the reason)."""
    reference = results[0]
    problems = [f"{r.name}: the plugin's registration failed" for r in results if registration_failed(r)]
    problems += [
        f"{r.name}: an answer differs from {reference.name}'s"
        for r in results[1:]
        if not matches_reference(r, reference)
    ]
    for problem in problems:
        print(f"demo: {problem}", file=sys.stderr)
    return 1 if problems else 0


def run_demo(args: argparse.Namespace) -> int:
    twice = sorted({m for m in args.modes if args.modes.count(m) > 1})
    if twice:  # each mode writes <mode>.log and is one row of the summary
        raise LaunchError(f"--modes names {', '.join(twice)} more than once: give each mode once")
    require_sglang()
    questions = load_questions(args.questions)
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="sglang-kimi-demo-"))
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"--log-dir {log_dir}: cannot create it ({exc.strerror or exc}): give a writable folder")
    results = []
    for name in args.modes:
        result = run_mode(name, questions, args, log_dir)
        results.append(result)
        if len(results) == 1:
            print_registrations(result.state)
            for i, answer in enumerate(result.answers, 1):
                print(f"\n[{i}/{len(questions)}] Question: {answer.question}")
                print(f"Answer: {answer.text}")
        print(f"{name}: {result.tokens_per_second:.1f} tokens/s; server stopped", flush=True)
    print_summary(results)
    return exit_code(results)
