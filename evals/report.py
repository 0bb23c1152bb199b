"""The GSM8K gate's outputs: ``gsm8k_gate.json`` (everything, per question), ``gsm8k_gate.md`` and the console."""

from __future__ import annotations

import json
import math
from pathlib import Path

from sglang_kimi.evals.gsm8k import FILTERS, GateResult

MAX_LISTED = 10  # differing generations shown in the Markdown report (all of them are in the JSON)
CLIP = 160  # characters of a generation shown in a table cell


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.2f}"


def _z(z: float) -> str:
    return ("+inf" if z > 0 else "-inf") if math.isinf(z) else f"{z:+.2f}"


def _cell(text: str) -> str:
    text = text if len(text) <= CLIP else text[:CLIP] + "…"
    return text.replace("|", "\\|").replace("\n", "⏎")


def identical_line(result: GateResult) -> str:
    """The line printed prominently: how many generations differ."""
    n = len(result.differing)
    if n == 0:
        return f"IDENTICAL GENERATIONS: {result.compared}/{result.compared} (0 differ)"
    return (
        f"DIFFERING GENERATIONS: {n} of {result.compared} differ ({result.differing_answers} extracted answers differ)"
    )


def markdown(result: GateResult) -> str:
    cfg = result.config
    verdict = "PASS" if result.passed else "FAIL"
    seeds = sorted({run.seed for run in result.runs})
    lines = [
        f"# GSM8K gate: {verdict}",
        "",
        f"**{identical_line(result)}**" + (" (required: greedy decoding)" if cfg["identical_required"] else ""),
        "",
        "| | baseline | candidate |",
        "|---|---|---|",
        f"| server | {result.baseline['url']} | {result.candidate['url']} |",
        f"| model | {result.baseline['model_path']} | {result.candidate['model_path']} |",
        f"| speculative decoding | {result.baseline['speculative']} | {result.candidate['speculative']} |",
        f"| device / dtype | {result.baseline['device']} / {result.baseline['dtype']} | "
        f"{result.candidate['device']} / {result.candidate['dtype']} |",
        "",
        f"Task `{result.task['name']}` (lm-eval {result.task['lm_eval_version']}"
        + (f", stock gsm8k definition on {result.task['data_dir']}" if result.task.get("data_dir") else ", stock gsm8k")
        + f"); {cfg['num_fewshot']}-shot, {result.comparisons[FILTERS[0]].questions} questions"
        + (f" (--limit {cfg['limit']})" if cfg["limit"] else "")
        + f", seeds {', '.join(map(str, seeds))}, temperature {cfg['temperature']:g}"
        + f", max {cfg['max_gen_toks']} new tokens.",
        "",
        "## Accuracy (exact_match, %)",
        "",
        "| filter | seed | baseline | candidate |",
        "|---|---|---|---|",
    ]
    for name in FILTERS:
        comp = result.comparisons[name]
        for seed, b, c in zip(seeds, comp.baseline_per_seed, comp.candidate_per_seed):
            lines.append(f"| {name} | {seed} | {_pct(b)} | {_pct(c)} |")
        lines.append(
            f"| **{name}** | mean ± std | **{_pct(comp.baseline_mean)} ± {_pct(comp.baseline_std)}** | "
            f"**{_pct(comp.candidate_mean)} ± {_pct(comp.candidate_std)}** |"
        )
    lines += [
        "",
        "## Difference (candidate − baseline)",
        "",
        "| filter | Δ (pp) | paired z | p (drop, one-sided) | unpaired z | allowed drop (pp) |",
        "|---|---|---|---|---|---|",
    ]
    for name in FILTERS:
        comp = result.comparisons[name]
        lines.append(
            f"| {name} | {100 * comp.delta:+.2f} | {_z(comp.paired_z)} | {comp.p_drop:.3g} | {_z(comp.unpaired_z)} | "
            f"{cfg['max_drop']:g} |"
        )
    lines += [
        "",
        "Paired z: per-question differences averaged over seeds, questions as the independent units "
        "(see `sglang_kimi.evals.stats`). A drop fails the gate when it exceeds the allowed drop and p < "
        f"{cfg['alpha']:g}.",
        "",
        "## Verdict",
        "",
        "| check | required | result | detail |",
        "|---|---|---|---|",
    ]
    for name, check in result.checks.items():
        status = "pass" if check["passed"] else ("**FAIL**" if check["required"] else "differs (not required)")
        lines.append(f"| {name} | {'yes' if check['required'] else 'no'} | {status} | {check['detail']} |")
    if result.differing:
        lines += [
            "",
            f"## Differing generations ({len(result.differing)}; first {min(MAX_LISTED, len(result.differing))})",
            "",
            "| seed | question | baseline | candidate |",
            "|---|---|---|---|",
        ]
        for diff in result.differing[:MAX_LISTED]:
            lines.append(f"| {diff.seed} | {diff.doc_id} | {_cell(diff.baseline)} | {_cell(diff.candidate)} |")
    return "\n".join(lines) + "\n"


def write(result: GateResult, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "gsm8k_gate.json", out_dir / "gsm8k_gate.md"
    json_path.write_text(json.dumps(result.as_dict(), indent=2, default=str) + "\n")
    md_path.write_text(markdown(result))
    return json_path, md_path


def console(result: GateResult) -> str:
    """The summary printed at the end of a run."""
    bar = "=" * 72
    lines = [bar, identical_line(result), bar]
    for name in FILTERS:
        comp = result.comparisons[name]
        lines.append(
            f"{name:<17} baseline {_pct(comp.baseline_mean)} ± {_pct(comp.baseline_std)}%  candidate "
            f"{_pct(comp.candidate_mean)} ± {_pct(comp.candidate_std)}%  Δ {100 * comp.delta:+.2f} pp  "
            f"paired z {_z(comp.paired_z)}"
        )
    for name, check in result.checks.items():
        status = "pass" if check["passed"] else ("FAIL" if check["required"] else "not required")
        lines.append(f"{name:<22} {status:<12} {check['detail']}")
    lines.append(f"VERDICT: {'PASS' if result.passed else 'FAIL'}")
    return "\n".join(lines)
