"""``sglang-kimi acceptance``: speculative acceptance of a running server, or of every worker behind an
``sglang-router``, each worker apart and all of them summed.

Read from each worker's ``/server_info`` (the plugin's counters, merged over its data-parallel ranks): decode steps,
tau (tokens per step, the bonus included) and the acceptance rate at each draft position since the worker started.
"""

from __future__ import annotations

import json

from sglang_kimi.launcher.api_key import HELP as API_KEY_HELP
from sglang_kimi.launcher.api_key import use_api_key
from sglang_kimi.launcher.client import ServerQueryError
from sglang_kimi.launcher.dp_reports import merge_spec_metrics
from sglang_kimi.launcher.router import worker_reports

POSITIONS = 8  # draft positions shown in the table (--json has them all)


def acceptance_table(url: str) -> dict:
    """``{"workers": {url: spec_metrics or None}, "all": summed spec_metrics or None}``."""
    workers = {w: report.get("spec_metrics") for w, report in worker_reports(url).items()}
    measured = [m for m in workers.values() if isinstance(m, dict)]
    return {"workers": workers, "all": merge_spec_metrics(measured) if measured else None}


def _row(name: str, metrics: dict | None) -> list[str]:
    if not isinstance(metrics, dict):
        return [name, "-", "-", "no speculative counters (not a speculative server, or no plugin)"]
    tau = metrics.get("tau")
    rates = metrics.get("acceptance_rate_per_position") or []
    shown = " ".join("-" if r is None else f"{r:.2f}" for r in rates[:POSITIONS])
    return [name, str(metrics.get("steps", 0)), "-" if tau is None else f"{tau:.2f}", shown]


def print_table(table: dict) -> None:
    rows = [["worker", "steps", "tau", f"acceptance at draft positions 1-{POSITIONS}"]]
    rows += [_row(url, metrics) for url, metrics in table["workers"].items()]
    if len(table["workers"]) > 1:
        rows.append(_row("all workers", table["all"]))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])


def run_acceptance(args) -> int:
    from sglang_kimi.errors import command_failed

    use_api_key(args.api_key)
    try:
        table = acceptance_table(args.base_url.rstrip("/"))
    except ServerQueryError as exc:
        return command_failed(str(exc))
    if args.json:
        print(json.dumps(table, indent=2))
    else:
        print_table(table)
    return 0


def add_acceptance_parser(sub) -> None:
    parser = sub.add_parser(
        "acceptance",
        help="speculative acceptance of a server, or of each worker behind sglang-router and all summed",
        description="Reads the plugin's acceptance counters from /server_info: of one server, or, when the URL is "
        "an sglang-router, of every worker it lists (GET /workers), each worker apart and all of them summed. "
        "Counts are since each worker started: decode steps, tau (tokens per step, the bonus included) and the "
        "acceptance rate at each draft position.",
    )
    parser.add_argument("--base-url", required=True, metavar="URL", help="a server, or the router in front of several")
    parser.add_argument("--json", action="store_true", help="print every worker's counters and the sum as JSON")
    parser.add_argument("--api-key", default=None, help=API_KEY_HELP)
