#!/usr/bin/env python
"""Where a speculative server's greedy tokens left the autoregressive server's in a serving check, what the float64
reference model says about that position.

A bfloat16 server runs the verify forward (several tokens per request) and the autoregressive forward (one token)
through matrix products of different shapes, which round differently; where the target's two best tokens are
closer than that rounding, the two servers can pick different ones although both verify correctly. A bug in the
speculative path looks the same in a parity table. This script tells them apart for each divergence in a JSON of
``scripts/gpu_serve_check.py``:

- the float64 logits of both tokens at the first different position, given the tokens both servers agreed on, and
  their gap, also in units of bfloat16's spacing at the larger logit's magnitude (2**-7 relative);
- for calibration, every row's departures from the float64 greedy choice (teacher-forced on its own tokens) and the
  largest gap among them: how far rounding reaches in the same run. In a MoE model that can be whole logits, where
  a near-tie in the router flips an expert.

A gap at the divergence within the autoregressive server's own departures is a near-tie that rounding decides; a
gap well beyond them means the speculative path chose a token the target does not rank first.

    python scripts/divergence_margins.py bench/results/serve-NVIDIA_H200-20261128-061234.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sglang_kimi.assets import TINY_MODEL  # noqa: E402
from sglang_kimi.cli.demo import gsm8k_prompt, load_questions  # noqa: E402


@dataclass
class Departure:
    """One position of an output: the token taken, the float64 model's choice there, and their logit gap."""

    position: int
    token: int
    float64_choice: int
    gap: float  # logit of float64_choice minus logit of token (>= 0)
    bf16_spacings: float  # gap / bfloat16's spacing at the larger logit's magnitude


def bf16_spacing(x: float) -> float:
    """The distance between adjacent bfloat16 numbers at |x| (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - 7)


@torch.no_grad()
def teacher_forced_logits(model, prompt_ids: list[int], tokens: list[int]) -> torch.Tensor:
    """[len(tokens), vocab]: the float64 logits before each of ``tokens``, given the prompt and the tokens before."""
    x = torch.tensor([prompt_ids + tokens])  # [1, P + T]
    return model(x)[0, len(prompt_ids) - 1 : -1].double()  # [T, vocab]


def gap(row: torch.Tensor, better: int, other: int) -> tuple[float, float]:
    """``row`` [vocab]'s logit of ``better`` minus that of ``other``, and that gap in bfloat16 spacings at the larger
    of the two logits' magnitudes."""
    logit_gap = float(row[better] - row[other])
    return logit_gap, logit_gap / bf16_spacing(max(abs(float(row[better])), abs(float(row[other]))))


def departure(logits: torch.Tensor, position: int, token: int) -> Departure:
    row = logits[position]  # [vocab]
    choice = int(row.argmax())
    return Departure(position, token, choice, *gap(row, choice, token))


def departures(logits: torch.Tensor, tokens: list[int]) -> list[Departure]:
    """Every position where ``tokens`` is not the float64 greedy choice."""
    chosen = logits.argmax(-1).tolist()  # [T]
    return [departure(logits, i, t) for i, (t, c) in enumerate(zip(tokens, chosen)) if t != c]


def explain(logits: torch.Tensor, reference: list[int], speculative: list[int]) -> dict | None:
    """The first position where ``speculative`` leaves ``reference`` (None if it never does) and both tokens' float64
    logits there; ``logits`` [T, vocab]: :func:`teacher_forced_logits` of ``reference`` (``speculative`` has the
    same tokens before that position)."""
    at = next((i for i, (a, b) in enumerate(zip(reference, speculative)) if a != b), None)
    if at is None:
        return None
    row = logits[at]
    ref_tok, spec_tok = reference[at], speculative[at]
    logit_gap, spacings = gap(row, ref_tok, spec_tok)
    return {
        "first_different_token": at,
        "reference_token": ref_tok,
        "speculative_token": spec_tok,
        "float64_choice": int(row.argmax()),
        "reference_logit": float(row[ref_tok]),
        "speculative_logit": float(row[spec_tok]),
        "gap": logit_gap,  # > 0: the float64 model prefers the reference's token
        "gap_bf16_spacings": spacings,
    }


def reference_rows(path: Path, result: dict) -> dict[str, dict]:
    """The autoregressive rows a speculative row may name as its reference: this run's and those of the files its
    rows name (``"<file> <config>"``, looked up next to ``path``)."""
    rows = {f"this run {r['config']}": r for r in result["rows"] if "output_ids" in r}
    for name in {r["reference"].split(" ", 1)[0] for r in result["rows"] if r.get("reference")} - {"this"}:
        if not (path.parent / name).is_file():
            raise FileNotFoundError(f"{path.name}'s rows take their reference from {name}, not found next to it")
        other = json.loads((path.parent / name).read_text())
        rows.update({f"{name} {r['config']}": r for r in other["rows"] if "output_ids" in r})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("result", type=Path, help="a serve-<device>-<time>.json of scripts/gpu_serve_check.py")
    p.add_argument("--out", type=Path, help="also write the findings as JSON here")
    opts = p.parse_args(argv)
    from transformers import AutoTokenizer

    from sglang_kimi.speculators.reference.deepseek_v3 import CompactDeepseekV3

    try:
        result = json.loads(opts.result.read_text())
    except (OSError, ValueError) as exc:
        p.error(f"{opts.result}: {exc}")
    if not isinstance(result, dict) or result.get("max_new_tokens") is None or "rows" not in result:
        p.error(f"{opts.result} is not a JSON of scripts/gpu_serve_check.py (no rows / max_new_tokens)")
    try:
        refs = reference_rows(opts.result, result)
    except FileNotFoundError as exc:
        p.error(str(exc))
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)
    model = CompactDeepseekV3.from_pretrained(TINY_MODEL, dtype=torch.float64)
    prompts = [tokenizer.encode(gsm8k_prompt(q)) for q in load_questions()]

    print(f"every output against the float64 greedy choice, teacher-forced ({result.get('dtype')} servers):")
    calibration, logits = {}, {}  # logits[(row name, prompt)]: [T, vocab], read again at that row's divergences
    for name, row in refs.items():
        for i, ids in enumerate(row["output_ids"]):
            logits[name, i] = teacher_forced_logits(model, prompts[i], ids)
        found = [departures(logits[name, i], ids) for i, ids in enumerate(row["output_ids"])]
        flat = [d for per_prompt in found for d in per_prompt]
        calibration[name] = [[asdict(d) for d in per_prompt] for per_prompt in found]
        largest = max((d.gap for d in flat), default=0.0)
        tokens = sum(len(ids) for ids in row["output_ids"])
        print(f"  {name}: {len(flat)} of {tokens} tokens not the float64 choice, largest gap {largest:.4f}")

    findings = []
    for row in (r for r in result["rows"] if r.get("diverged")):
        ref = refs[row["reference"]]
        for d in row["diverged"]:
            i = d["prompt"]
            found = explain(logits[row["reference"], i], ref["output_ids"][i], row["output_ids"][i])
            findings.append({"config": row["config"], "prompt": i, "reference": row["reference"], **found})
            print(
                f"{row['config']}, prompt {i}, token {found['first_different_token']}: "
                f"reference {found['reference_token']} ({found['reference_logit']:.4f}), "
                f"speculative {found['speculative_token']} ({found['speculative_logit']:.4f}), "
                f"float64 choice {found['float64_choice']}: gap {found['gap']:.4f}, "
                f"{found['gap_bf16_spacings']:.2f} bf16 spacings"
            )
    if not findings:
        print("every speculative row equals its autoregressive reference")
    if opts.out:
        out = {"result": opts.result.name, "calibration": calibration, "findings": findings}
        opts.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
