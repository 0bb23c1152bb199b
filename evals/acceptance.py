"""Speculative-decoding acceptance read from a server's ``/server_info``.

- ``tau``: SGLang's ``internal_states[0]["avg_spec_accept_length"]``, output tokens per verify step over the
  server's lifetime (what ``sglang.benchmark.serving`` prints as "Accept length"); absent without speculation,
  and until SGLang's scheduler first logs decode statistics (its totals are updated at those log steps).
- the plugin's counters, ``internal_states[i]["sglang_kimi"]["spec_metrics"]`` summed over the data-parallel
  ranks ``i`` (:mod:`sglang_kimi.launcher.dp_reports`), cumulative since start-up:
  ``drafted_per_position[i]`` / ``accepted_per_position[i]``: decode steps that drafted position ``i + 1`` /
  accepted at least ``i + 1`` draft tokens (list index 0 = the first token after the bonus);
  ``accept_length_histogram[a]``: steps that accepted ``a`` drafts (bonus excluded).
  See :mod:`sglang_kimi.speculative.metrics`.

A benchmark level reads them before and after and reports the difference: acceptance of that level only.
From the histogram difference it also derives the level's own tau, output tokens per step:
``1 + sum_a a * h[a] / sum_a h[a]``.
"""

from __future__ import annotations

from sglang_kimi.launcher.dp_reports import merged_report
from sglang_kimi.speculative import acceptance_rates

COUNTERS = ("drafted_per_position", "accepted_per_position", "accept_length_histogram")


def scheduler_state(server_info: dict) -> dict:
    states = server_info.get("internal_states") or [{}]
    return states[0] or {}


def snapshot(server_info: dict) -> dict:
    """``{"tau": float | None, "spec_metrics": {counter: [int]} | None}`` of one ``/server_info`` answer."""
    state = scheduler_state(server_info)
    metrics = merged_report(server_info).get("spec_metrics")  # all data-parallel ranks
    if isinstance(metrics, dict):
        metrics = {k: list(metrics[k]) for k in COUNTERS if isinstance(metrics.get(k), list)}
    else:
        metrics = None
    tau = state.get("avg_spec_accept_length")
    return {"tau": float(tau) if tau is not None else None, "spec_metrics": metrics or None}


def _minus(after: list[int], before: list[int]) -> list[int]:
    # [n] - [m], the shorter padded with zeros (positions can appear as the draft length grows)
    n = max(len(after), len(before))
    a = after + [0] * (n - len(after))
    b = before + [0] * (n - len(before))
    return [x - y for x, y in zip(a, b)]


def level_acceptance(before: dict, after: dict) -> dict | None:
    """Acceptance during one level from two :func:`snapshot`s; None when the server exposes no counters."""
    if after["spec_metrics"] is None:
        return None
    prev = before["spec_metrics"] or {}
    delta = {k: _minus(after["spec_metrics"].get(k, []), prev.get(k, [])) for k in COUNTERS}
    if any(x < 0 for values in delta.values() for x in values):
        delta = after["spec_metrics"]  # counters were reset in between: report the totals
    drafted, accepted = delta.get("drafted_per_position", []), delta.get("accepted_per_position", [])
    hist = delta.get("accept_length_histogram", [])
    return {
        "drafted_per_position": drafted,
        "accepted_per_position": accepted,
        "acceptance_per_position": acceptance_rates.rates(accepted, drafted),  # [position - 1] accepted / drafted
        "accept_length_histogram": hist,  # [accepted drafts] steps
        "steps": sum(hist),
        "tau_level": acceptance_rates.tau(hist),
    }
