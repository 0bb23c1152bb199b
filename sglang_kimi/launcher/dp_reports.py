"""The plugin's ``/server_info`` report read over every data-parallel rank of a server.

SGLang's ``/server_info`` lists one internal state per data-parallel rank (``--dp-size``; tensor-parallel ranks of
one replica share one). Each DP rank is its own scheduler process serving its own requests, so each carries its
own plugin report (``server_info.plugin_report``): acceptance counters, KV maxima and adaptive step counts of its
requests only. A client that read rank 0 alone would see part of the traffic; with ``calibrate-kv`` it would write
FP8 scales from part of the KV data, which clip the rest. :func:`merged_report` combines them:

- acceptance counters (``spec_metrics``) and adaptive steps per width: summed, tau and rates recomputed;
- KV data (``kv_scales`` layers): the largest ``|K|`` / ``|V|`` and scales over ranks, tokens summed;
- failed registrations: united (a rank whose hook failed is reported);
- everything else (version, options, the adaptive policy's per-bucket state): rank 0's.
"""

from __future__ import annotations

import copy

from sglang_kimi.speculative import acceptance_rates

SPEC_LISTS = ("drafted_per_position", "accepted_per_position", "accept_length_histogram")
SPEC_COUNTS = ("steps", "nonfinite_draft_positions", "nonfinite_draft_steps", "draft_replays_checked",
               "draft_replays_differed")  # fmt: skip
STEP_TIMES = ("host_ms_per_step", "host_ms_per_step_outside_target_forward")


def reports(server_info: dict) -> list[dict]:
    """Each DP rank's plugin report (``internal_states[i]["sglang_kimi"]``), ranks without one left out."""
    states = server_info.get("internal_states") or []
    return [s["sglang_kimi"] for s in states if isinstance(s, dict) and isinstance(s.get("sglang_kimi"), dict)]


def merged_report(server_info: dict) -> dict:
    """The plugin's report over all DP ranks of one ``/server_info`` answer ({} without the plugin)."""
    found = reports(server_info)
    if len(found) <= 1:
        return found[0] if found else {}
    merged = copy.deepcopy(found[0])
    merged["data_parallel_ranks"] = len(found)
    merged["failed"] = sorted({name for r in found for name in r.get("failed") or []})
    spec = [r["spec_metrics"] for r in found if isinstance(r.get("spec_metrics"), dict)]
    if spec:
        merged["spec_metrics"] = merge_spec_metrics(spec)
    kv = [r["kv_scales"] for r in found if isinstance(r.get("kv_scales"), dict)]
    if kv:
        merged["kv_scales"] = merge_kv_scales(kv)
    adaptive = [r["adaptive"] for r in found if isinstance(r.get("adaptive"), dict)]
    if adaptive:
        steps: dict[str, int] = {}
        for a in adaptive:
            for width, n in (a.get("steps_by_width") or {}).items():
                steps[width] = steps.get(width, 0) + int(n)
        merged["adaptive"]["steps_by_width"] = dict(sorted(steps.items(), key=lambda kv: int(kv[0])))
    return merged


def _sum_lists(lists: list[list[int]]) -> list[int]:
    # ranks that drafted fewer positions so far have shorter lists: pad with zeros
    n = max((len(x) for x in lists), default=0)
    return [sum(x[i] for x in lists if i < len(x)) for i in range(n)]


def merge_spec_metrics(parts: list[dict]) -> dict:
    """Acceptance counters of several ranks as one rank's would read (``metrics.AcceptanceStats.snapshot``)."""
    out = copy.deepcopy(parts[0])
    for key in SPEC_COUNTS:
        if any(key in p for p in parts):
            out[key] = sum(int(p.get(key) or 0) for p in parts)
    steps = [int(p.get("decode_steps") or 0) for p in parts]
    if sum(steps):  # the DFLASH step clock (step_phases.StepClock): host times weighted by each rank's steps
        out["decode_steps"] = sum(steps)
        for key in STEP_TIMES:
            out[key] = sum(n * float(p.get(key) or 0.0) for n, p in zip(steps, parts)) / sum(steps)
    sources = [p["draft_steps_by_source"] for p in parts if p.get("draft_steps_by_source")]
    if sources:  # where each rank's draft steps came from
        out["draft_steps_by_source"] = {k: sum(int(s.get(k) or 0) for s in sources) for k in sources[0]}
    depths = [p["max_depth"] for p in parts if p.get("max_depth") is not None]
    if depths:
        out["max_depth"] = max(depths)
    if any(key in p for p in parts for key in SPEC_LISTS):
        for key in SPEC_LISTS:
            out[key] = _sum_lists([list(p.get(key) or []) for p in parts])
        out["tau"] = acceptance_rates.tau(out["accept_length_histogram"])
        out["acceptance_rate_per_position"] = acceptance_rates.rates(
            out["accepted_per_position"], out["drafted_per_position"]
        )
    return out


def merge_kv_scales(parts: list[dict]) -> dict:
    """KV data of several ranks: per role and layer, the largest maxima and scales, the tokens of all ranks."""
    out = copy.deepcopy(parts[0])
    for part in parts[1:]:
        for role, entry in part.items():
            if not isinstance(entry, dict) or "layers" not in entry:
                continue
            if not isinstance(out.get(role), dict):
                out[role] = copy.deepcopy(entry)
                continue
            layers = out[role].setdefault("layers", {})
            for layer, state in (entry.get("layers") or {}).items():
                mine = layers.get(layer)
                if mine is None:
                    layers[layer] = copy.deepcopy(state)
                    continue
                for key in ("k_amax", "v_amax", "k_scale", "v_scale"):
                    if state.get(key) is not None:
                        mine[key] = max(mine.get(key) or 0.0, state[key])
                mine["tokens"] = int(mine.get("tokens") or 0) + int(state.get("tokens") or 0)
    return out
