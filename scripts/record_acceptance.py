#!/usr/bin/env python
"""Records, per request and per decode step, how many drafts real speculative serving accepted: the acceptance
traces ``bench/replay_adaptive.py`` replays.

    python scripts/record_acceptance.py                       # every configuration (one CPU server at a time)
    python scripts/record_acceptance.py --only matched/dflash-chain --prompts 4   # one, small

One CPU server per configuration (the embedded tiny Kimi model): the matched and the mismatched DFlash drafter as a
chain of 7 drafts and as DDTree budgets 2, 4, 8, 16 and 32, and the EAGLE3 drafter as a chain of 7 steps (topk 1).
Each serves the same GSM8K test prompts greedily (the first ``--prompts``, ``--max-new-tokens`` tokens each, EOS
ignored) at ``--concurrency`` streams.

How a step's outcome is read: the requests stream (``/generate``, ``stream``, the default stream interval of one
step), so every chunk after the first (the prefill's token) is one decode step, and its new tokens are the step's
accepted drafts plus the bonus. SGLang sends its own per-request counters only with the last chunk: the number of
steps (``spec_verify_ct``) and their histogram of accepted drafts (``spec_correct_drafts_histogram``). They check
the chunks (as many steps, the same lengths) and give the last step's length, which the request's token limit may
have cut. A request whose chunks do not match them (SGLang coalesces the queued chunks of a client that fell
behind) is left out and counted (``dropped``), not guessed. A chain's outcome at its full width is the depth its
drafts reached, which gives every narrower chain's outcome too (``min(depth, width)``). A tree server also records
each step's accepted path (``SGLANG_KIMI_ACCEPTANCE_TRACE``: the accepted node numbers, best first), which gives
every narrower budget's outcome on the same step (the nodes of the path numbered within the budget: DDTree budgets
are nested); ``paths`` is null for a request whose paths do not match its steps. Each budget is still recorded on
its own server, so a reader can check the derivation against it.

Writes ``bench/data/acceptance_traces.json`` (format ``sglang-kimi-acceptance-traces/1``)::

    {"format": ..., "recorded": "...", "machine": {...}, "sglang": "0.5.23", "prompts": {...},
     "max_new_tokens": 128, "concurrency": 8,
     "traces": {"matched/dflash-chain": {"family": "chain", "width": 7, "args": [...],
                                        "requests": [[accepted drafts of each step, in order] or null, ...],
                                        "output_digests": [...], "dropped": 0, "seconds": 21.3},
                "matched/dflash-tree-32": {..., "paths": [[[accepted node numbers] of each step] or null, ...]},
                ...}}

Request i is prompt i in every configuration (null where it was left out). ``output_digests`` (sha256 of each
request's output token ids, 12 hex digits) let a reader check that every configuration served the same text, as
lossless greedy speculation must.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sglang_kimi.assets import ASSETS_DIR, TINY_EAGLE3

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "data" / "acceptance_traces.json"
FORMAT = "sglang-kimi-acceptance-traces/1"
SERVER_ARGS = ["--attention-backend", "kimi_cpu", "--max-total-tokens", "16384"]
TREE_BUDGETS = (2, 4, 8, 16, 32)


def configurations() -> dict[str, dict]:
    """name -> {"family", "width", "args"}: the chain at its full width and every tree budget above 1 (budget 1 is
    the chain's first draft), for both DFlash drafters; EAGLE3 as a chain of 7 steps."""
    out = {}
    for drafter, folder in (("matched", "tiny-kimi-k2.6-dflash"), ("mismatched", "tiny-kimi-k2.5-dflash")):
        spec = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(ASSETS_DIR / folder)]
        out[f"{drafter}/dflash-chain"] = {"family": "chain", "width": 7, "args": spec}
        for budget in TREE_BUDGETS:
            out[f"{drafter}/dflash-tree-{budget}"] = {
                "family": "tree",
                "width": budget,
                "args": spec + ["--speculative-dflash-tree-budget", str(budget)],
            }
    eagle3 = TINY_EAGLE3
    out["eagle3/chain"] = {
        "family": "chain",
        "width": 7,
        "args": [
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(eagle3),
            "--speculative-num-steps", "7", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8",
        ],
    }  # fmt: skip
    return out


def parse_stream(lines) -> tuple[list[int] | None, list[int]]:
    """(accepted drafts per decode step in order, output token ids) of one streamed ``/generate`` response (its
    ``data:`` lines); the steps are None when the chunks do not resolve into single steps (see the module
    docstring)."""
    deltas, tokens, meta, output_ids = [], 0, {}, []
    for raw in lines:
        line = raw.decode() if isinstance(raw, bytes) else raw
        if not line.startswith("data:"):
            continue
        body = line[len("data:") :].strip()
        if body == "[DONE]":
            break
        chunk = json.loads(body)
        if "error" in chunk:
            raise RuntimeError(f"the server answered an error: {chunk['error']}")
        meta = chunk.get("meta_info", {})
        output_ids = chunk.get("output_ids", output_ids)
        now = int(meta.get("completion_tokens", 0))
        if now > tokens:
            deltas.append(now - tokens)
            tokens = now
    return steps_of(deltas, meta), output_ids


def steps_of(deltas: list[int], final_meta: dict) -> list[int] | None:
    """The accepted drafts of each decode step from the chunks' new-token counts (the first chunk is the prefill's
    token; each later one a step's accepted drafts + the bonus), checked against the final chunk's step count
    (``spec_verify_ct``) and histogram (``spec_correct_drafts_histogram``, index a: steps that accepted a drafts).
    The last step may have committed fewer tokens than it accepted (the request's token limit): its length is the
    one the histogram has left. None when the counts do not match (SGLang coalesced chunks of a slow client)."""
    steps = [d - 1 for d in deltas[1:]]
    histogram = list(final_meta.get("spec_correct_drafts_histogram") or [])
    if int(final_meta.get("spec_verify_ct") or 0) != len(steps) or sum(histogram) != len(steps):
        return None
    left = list(histogram)
    for a in steps[:-1]:
        if a >= len(left) or left[a] == 0:
            return None
        left[a] -= 1
    last = [a for a, n in enumerate(left) if n]
    if steps and (len(last) != 1 or last[0] < steps[-1]):
        return None
    if steps:
        steps[-1] = last[0]
    return steps


def dump(data: dict) -> str:
    """JSON with an indent, each list of integers (a request's steps) on one line, and so each list of such lists
    (a request's paths)."""
    text = json.dumps(data, indent=1)
    one_line = lambda m: "[" + ",".join(x.strip() for x in m.group(0)[1:-1].split(",")) + "]"  # noqa: E731
    text = re.sub(r"\[[\d,\s]*\]", one_line, text)
    items = r"(?m)^(\s*)(\[(\s*\[[\d,]*\],?)+\s*\])"  # a list item that is a list of such lists
    return re.sub(items, lambda m: m.group(1) + re.sub(r"\s+", "", m.group(2)), text) + "\n"


def digest(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:12]


def record(base_url: str, prompts: list[str], max_new_tokens: int, concurrency: int) -> list[tuple]:
    import requests

    def one(i: int):
        payload = {
            "rid": rid_of(i),
            "text": prompts[i],
            "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True},
        }
        with requests.post(base_url + "/generate", json=payload, stream=True, timeout=900) as response:
            response.raise_for_status()
            return parse_stream(response.iter_lines())

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(len(prompts))))


def rid_of(i: int) -> str:
    return f"record-acceptance-{i}"


def read_paths(path: Path, count: int, steps: list[list[int] | None]) -> list[list[list[int]] | None]:
    """Per request, the accepted path of each decode step from a server's ``SGLANG_KIMI_ACCEPTANCE_TRACE`` file;
    None where they do not match the request's steps (as many, each path as long as its step's accepted drafts;
    the last step's path may be longer: the token limit cut its commit). A request's trace may hold one step more
    than it streamed, at its end: the overlap scheduler launches a step before the request's finish is processed,
    and that step's tokens are dropped."""
    by_rid: dict[str, list[list[int]]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            by_rid.setdefault(row["rid"], []).append(row["path"])
    out: list[list[list[int]] | None] = []
    for i in range(count):
        paths, recorded = by_rid.get(rid_of(i)), steps[i]
        if paths is not None and recorded is not None and len(paths) == len(recorded) + 1:
            paths = paths[:-1]
        ok = paths is not None and recorded is not None and len(paths) == len(recorded)
        ok = ok and all(len(p) == a for p, a in zip(paths[:-1], recorded[:-1])) and len(paths[-1]) >= recorded[-1]
        out.append(paths if ok else None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32, help="GSM8K test questions, the first N")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--only", help="comma-separated configuration names (default: all)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    configs = configurations()
    if args.only:
        names = args.only.split(",")
        unknown = [n for n in names if n not in configs]
        if unknown:
            ap.error(f"unknown configuration(s) {unknown}; known: {', '.join(configs)}")
        configs = {n: configs[n] for n in names}

    from sglang_kimi.cli.demo import gsm8k_prompt
    from sglang_kimi.evals.bench import gsm8k_questions
    from sglang_kimi.launcher.server import ANY_PORT, ServerProcess, launch_command, sglang_version
    from sglang_kimi.settings import ACCEPTANCE_TRACE_ENV

    prompts = [gsm8k_prompt(q) for q in gsm8k_questions(str(REPO / "data" / "gsm8k"))[: args.prompts]]
    data = json.loads(args.out.read_text()) if args.out.exists() and args.only else {}
    if data and data.get("format") != FORMAT:
        raise SystemExit(f"{args.out}: not an acceptance-trace file ({data.get('format')!r})")
    data.update(
        {
            "format": FORMAT,
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0]},
            "sglang": sglang_version(),
            "prompts": {"source": "data/gsm8k/test.jsonl", "first": args.prompts, "form": "Question: ...\\nAnswer:"},
            "max_new_tokens": args.max_new_tokens,
            "concurrency": args.concurrency,
            "server_args": SERVER_ARGS,
        }
    )
    traces = data.setdefault("traces", {})
    logs = Path(tempfile.mkdtemp(prefix="record_acceptance_"))
    print(f"server logs: {logs}", flush=True)
    for name, config in configs.items():
        started = time.monotonic()
        log = logs / (name.replace("/", "-") + ".log")
        spec = launch_command([*SERVER_ARGS, *config["args"]], port=ANY_PORT)
        path_file = logs / (name.replace("/", "-") + ".paths.jsonl")
        if config["family"] == "tree":
            spec.env[ACCEPTANCE_TRACE_ENV] = str(path_file)
        with ServerProcess(spec, log) as server:
            server.wait_ready(900)
            ready = time.monotonic()
            results = record(server.base_url, prompts, args.max_new_tokens, args.concurrency)
        steps = [r[0] for r in results]  # None: left out (kept in place, so request i is prompt i everywhere)
        traces[name] = {
            "family": config["family"],
            "width": config["width"],
            "args": [a.replace(str(REPO) + "/", "") for a in config["args"]],
            "requests": steps,
            "output_digests": [digest(r[1]) if r[0] is not None else None for r in results],
            "dropped": sum(r[0] is None for r in results),
            "seconds": round(time.monotonic() - ready, 1),
        }
        if config["family"] == "tree":
            traces[name]["paths"] = read_paths(path_file, len(prompts), steps)
        kept = [s for s in steps if s is not None]
        n = sum(len(s) for s in kept)
        tau = 1 + sum(map(sum, kept)) / max(1, n)
        print(
            f"[{name}] ready in {ready - started:.0f} s, {n} steps in {time.monotonic() - ready:.0f} s, tau {tau:.2f}, "
            f"{traces[name]['dropped']} requests left out (coalesced chunks)",
            flush=True,
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(dump(data))  # after every configuration
    print(f"traces: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
