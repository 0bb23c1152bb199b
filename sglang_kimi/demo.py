"""``sglang-kimi demo``: the embedded tiny Kimi model in real SGLang, answering GSM8K questions."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from sglang_kimi.server import ASSETS_DIR, free_port, plugin_state, require_sglang, start_server

DEMO_QUESTIONS = ASSETS_DIR / "gsm8k_demo.jsonl"
STOP = ["Question:", "\n\n"]


def gsm8k_prompt(question: str) -> str:
    """The zero-shot form of lm-eval's gsm8k prompt, which the tiny model was trained on."""
    return f"Question: {question}\nAnswer:"


@dataclass
class Answer:
    question: str
    text: str
    output_ids: list[int]
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return len(self.output_ids) / self.seconds if self.seconds > 0 else 0.0


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


def load_questions(n: int) -> list[str]:
    lines = DEMO_QUESTIONS.read_text().splitlines()
    return [json.loads(line)["question"] for line in lines[:n]]


def print_registrations(state: dict) -> None:
    registrations = state.get("registrations", {})
    print(f"plugin sglang-kimi {state.get('version', '?')} in the scheduler (pid {state.get('pid', '?')}):")
    for name, outcome in registrations.items():
        print(f"  {name:<24} {outcome}")
    if not registrations:
        print("  NOT LOADED: the scheduler reported no sglang-kimi state")


def run_demo(args: argparse.Namespace) -> int:
    require_sglang()
    questions = load_questions(args.questions)
    log_path = Path(args.log) if args.log else Path(tempfile.mkdtemp(prefix="sglang-kimi-demo-")) / "server.log"
    print(f"starting the tiny Kimi-K2.6 model in SGLang (log: {log_path}) ...", flush=True)
    with start_server([], port=args.port or free_port(), log_path=log_path) as server:
        state = plugin_state(server.base_url)
        print_registrations(state)
        answers = []
        for i, question in enumerate(questions, 1):
            answer = ask(server.base_url, question, args.max_new_tokens)
            answers.append(answer)
            print(f"\n[{i}/{len(questions)}] Question: {question}")
            print(f"Answer: {answer.text}")
            print(f"({len(answer.output_ids)} tokens, {answer.tokens_per_second:.1f} tokens/s)", flush=True)
    total_tokens = sum(len(a.output_ids) for a in answers)
    total_seconds = sum(a.seconds for a in answers)
    print(f"\n{total_tokens} tokens in {total_seconds:.1f} s: {total_tokens / total_seconds:.1f} tokens/s; server stopped")
    return 0 if not state.get("failed") and state.get("registrations") else 1
