"""Admin requests that would stop a serving server, refused with HTTP 400 before they reach it.

BEFORE hooks on the ``TokenizerManager`` methods behind SGLang's admin endpoints. In SGLang 0.5.23 each of these
ends the scheduler (and with it the server), or makes every later request fail:

- ``/start_expert_distribution_record``, ``/stop_…`` and ``/dump_…`` on a server started without
  ``--expert-distribution-recorder-mode``: the scheduler's recorder raises, and the scheduler dies;
- ``/start_profile`` with an activity this server cannot record: any but ``CPU`` on a CPU server (the torch
  profiler asserts that it has no activity, or ``torch.cuda`` is missing), ``RPD`` without ROCm's ``rpdTracerControl``
  (an ImportError in the scheduler); an unknown activity name starts nothing and says it started;
- ``/configure_logging`` with a ``log_requests_level`` outside 0-3 or a ``log_requests_format`` other than
  ``text`` / ``json``: SGLang stores the value, then fails to use it, so while request logging is on every later
  request is answered HTTP 500;
- ``/slow_down`` with a ``forward_sleep_time`` the scheduler cannot sleep (1e300: an OverflowError in the next batch
  ends the scheduler) or one that trips the scheduler's watchdog, which ends the server when no batch finishes within
  ``--watchdog-timeout``.

A failed ``/start_profile`` or ``/stop_profile`` (stopping a profile that is not running, say) is a 400 carrying the
scheduler's message instead of a 500. Each refusal is a ``fastapi.HTTPException`` (status 400), which SGLang's
HTTP server answers as an error object.
"""

from __future__ import annotations

import importlib.util
import logging

from sglang_kimi.hardening.http_errors import finite_number, refuse
from sglang_kimi.hooks import hook

LOG_REQUESTS_LEVELS = (0, 1, 2, 3)
LOG_REQUESTS_FORMATS = ("text", "json")
# SGLang's profiler activities; each but CPU records an accelerator, RPD also needs ROCm's rpdTracerControl
PROFILER_ACTIVITIES = ("CPU", "GPU", "MEM", "CUDA_PROFILER", "RPD", "XPU")


def check_expert_distribution(tokenizer_manager, *args, **kwargs):
    """BEFORE the start / stop / dump of the expert distribution record."""
    if getattr(tokenizer_manager.server_args, "expert_distribution_recorder_mode", None) is None:
        refuse(
            "this server records no expert distribution: start it with --expert-distribution-recorder-mode "
            "(stat, stat_approx, per_pass or per_token) to use the expert distribution endpoints"
        )


def _platform_activity() -> str | None:
    """The activity name of an out-of-tree platform (SGLang adds it to its profiler's names), if any."""
    try:
        from sglang.srt.platforms import current_platform

        if current_platform.is_out_of_tree():
            return current_platform.get_torch_profiler_activity_str()
    except Exception:  # noqa: BLE001 - an older SGLang without platforms: the in-tree names only
        return None
    return None


def check_profile_activities(tokenizer_manager, req=None, *args, **kwargs):
    """BEFORE ``start_profile(self, req)``: every activity is one this server can record."""
    activities = getattr(req, "activities", None)
    if not activities:
        return None  # SGLang's default
    known = PROFILER_ACTIVITIES + tuple(filter(None, [_platform_activity()]))
    unknown = [name for name in activities if name not in known]
    if unknown:
        refuse(f"unknown profiler activities {unknown}: choose from {list(known)}")
    if str(getattr(tokenizer_manager.server_args, "device", "")) == "cpu":
        on_device = [name for name in activities if name != "CPU"]
        if on_device:
            refuse(f"this server runs on the CPU and cannot record {on_device}: profile with activities ['CPU']")
    if "RPD" in activities and importlib.util.find_spec("rpdTracerControl") is None:
        refuse("the RPD activity needs ROCm's rpdTracerControl (rocmProfileData) installed in the server's Python")
    return None


async def profile_failure_is_400(original, tokenizer_manager, req, *args, **kwargs):
    """AROUND ``_execute_profile``: SGLang raises RuntimeError (HTTP 500) when the scheduler refuses."""
    try:
        return await original(tokenizer_manager, req, *args, **kwargs)
    except RuntimeError as exc:
        refuse(f"profiling: {exc}")


def check_configure_logging(tokenizer_manager, obj, *args, **kwargs):
    """BEFORE ``configure_logging(self, obj)``: values SGLang would store and then fail on."""
    level = getattr(obj, "log_requests_level", None)
    if level is not None and level not in LOG_REQUESTS_LEVELS:
        refuse(f"log_requests_level is {level!r}: give 0, 1, 2 or 3 (more of each request is logged at each level)")
    fmt = getattr(obj, "log_requests_format", None)
    if fmt is not None and fmt not in LOG_REQUESTS_FORMATS:
        refuse(f"log_requests_format is {fmt!r}: give 'text' or 'json'")
    log_level = getattr(obj, "log_level", None)
    if log_level is not None and not isinstance(logging.getLevelName(str(log_level).upper()), int):
        refuse(f"log_level is {log_level!r}: give a logging level name such as 'info', 'warning' or 'debug'")
    return None


MAX_SLEEP_WITHOUT_WATCHDOG_S = 86400.0  # no watchdog to trip: a day per batch is already a stopped server


def check_slow_down(tokenizer_manager, obj, *args, **kwargs):
    """BEFORE ``slow_down(self, obj)``: a sleep before each batch that the scheduler can take and survive."""
    sleep = getattr(obj, "forward_sleep_time", None)
    if sleep is None:
        return None  # SGLang's "no slow-down"
    if not finite_number(sleep):
        refuse(f"forward_sleep_time is {sleep!r}: give the seconds to sleep before each batch, or 0 or null to stop")
    if sleep <= 0:
        return None  # SGLang's "stop slowing down"
    watchdog = getattr(tokenizer_manager.server_args, "watchdog_timeout", None)
    if watchdog is not None and watchdog > 0:
        # the watchdog ends the server when no batch finishes within its timeout; the batch's own time adds to the
        # sleep, so half the timeout is the bound
        if sleep >= watchdog / 2:
            refuse(
                f"forward_sleep_time {sleep:g} s would trip the scheduler's watchdog "
                f"(--watchdog-timeout {watchdog:g} s), which ends the server: give less than {watchdog / 2:g} s, "
                "or start the server with a larger --watchdog-timeout"
            )
    elif sleep > MAX_SLEEP_WITHOUT_WATCHDOG_S:
        refuse(f"forward_sleep_time {sleep:g} s: give at most {MAX_SLEEP_WITHOUT_WATCHDOG_S:g} s (a day per batch)")
    return None


def install_admin_validation(
    configure_logging: str,
    start_record: str,
    stop_record: str,
    dump_record: str,
    start_profile: str,
    execute_profile: str,
    slow_down: str,
):
    hook(configure_logging, check_configure_logging, "BEFORE")
    for record in (start_record, stop_record, dump_record):
        hook(record, check_expert_distribution, "BEFORE")
    hook(start_profile, check_profile_activities, "BEFORE")
    hook(execute_profile, profile_failure_is_400, "AROUND")
    hook(slow_down, check_slow_down, "BEFORE")
