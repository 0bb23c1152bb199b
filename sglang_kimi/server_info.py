"""The plugin's report in ``/server_info`` (``internal_states[i]["sglang_kimi"]``), added by the scheduler.

Version, every registration's outcome (``plugin.registration_state``), the plugin's server options, the
per-position acceptance counters (``metrics.py``), the FP8 KV scales (``models/kv_scales.py``), the cost probe's sums
(``models/cost_probe.py``, with ``SGLANG_KIMI_COST_PROBE=1``) and, with ``--speculative-kimi-adaptive``, the policy's
state (``speculative/adaptive/runtime.py``).
"""

from __future__ import annotations

import dataclasses

from sglang_kimi.hooks import hook


def plugin_report(server_args) -> dict:
    from sglang_kimi.models.cost_probe import snapshot as cost_probe_snapshot
    from sglang_kimi.models.kv_scales import snapshot as kv_scales_snapshot
    from sglang_kimi.plugin import registration_state
    from sglang_kimi.settings import plugin_args
    from sglang_kimi.speculative.adaptive.runtime import current_snapshot as adaptive_snapshot
    from sglang_kimi.speculative.metrics import current_snapshot

    state = registration_state()
    state["args"] = dataclasses.asdict(plugin_args(server_args))
    state["spec_metrics"] = current_snapshot()
    state["kv_scales"] = kv_scales_snapshot()
    state["adaptive"] = adaptive_snapshot()
    state["cost_probe"] = cost_probe_snapshot()
    return state


def _add_plugin_report(result, scheduler, *args, **kwargs):
    result.internal_state["sglang_kimi"] = plugin_report(scheduler.server_args)
    return result


def install_server_info(target: str):
    hook(target, _add_plugin_report, "AFTER")
