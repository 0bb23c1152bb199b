"""Admin request validation (``sglang_kimi/hardening/admin_validation.py``): admin requests that would end the
scheduler, or
break every later request, are an HTTP 400 naming the fix; the others reach SGLang unchanged."""

import asyncio
from types import SimpleNamespace

import pytest
from fastapi import HTTPException
from support.refusals import refused

from sglang_kimi.hardening.admin_validation import (
    check_configure_logging,
    check_expert_distribution,
    check_profile_activities,
    check_slow_down,
    profile_failure_is_400,
)


def manager(device="cuda", recorder=None):
    return SimpleNamespace(server_args=SimpleNamespace(device=device, expert_distribution_recorder_mode=recorder))


def test_expert_distribution_needs_the_recorder_mode():
    assert "--expert-distribution-recorder-mode" in refused(check_expert_distribution, manager())
    assert check_expert_distribution(manager(recorder="stat")) is None


@pytest.mark.parametrize(
    "device, activities, message",
    [
        ("cpu", ["GPU"], "runs on the CPU and cannot record ['GPU']"),
        ("cpu", ["CPU", "MEM"], "cannot record ['MEM']"),
        ("cpu", ["CUDA_PROFILER"], "cannot record ['CUDA_PROFILER']"),
        ("cpu", ["XPU"], "cannot record ['XPU']"),
        ("cuda", ["CPU", "TPU"], "unknown profiler activities ['TPU']"),
        ("cuda", ["RPD"], "rpdTracerControl"),  # not installed here
    ],
)
def test_profiler_activities_the_server_cannot_record_are_refused(device, activities, message):
    assert message in refused(check_profile_activities, manager(device), SimpleNamespace(activities=activities))


@pytest.mark.parametrize(
    "device, activities",
    [("cpu", ["CPU"]), ("cuda", ["CPU", "GPU"]), ("cuda", ["MEM"]), ("cuda", ["CUDA_PROFILER"]), ("cpu", None)],
)
def test_profiler_activities_the_server_can_record_pass(device, activities):
    assert check_profile_activities(manager(device), SimpleNamespace(activities=activities)) is None
    assert check_profile_activities(manager(device), None) is None  # /start_profile without a body


def test_a_profile_request_the_scheduler_refuses_is_400():
    async def failing(tokenizer_manager, req):
        raise RuntimeError("Profiling is not in progress. Call /start_profile first.")

    async def succeeding(tokenizer_manager, req):
        return "ok"

    with pytest.raises(HTTPException) as info:
        asyncio.run(profile_failure_is_400(failing, manager(), None))
    assert info.value.status_code == 400 and "not in progress" in info.value.detail
    assert asyncio.run(profile_failure_is_400(succeeding, manager(), None)) == "ok"


def logging_request(**fields):
    base = {"log_requests_level": None, "log_requests_format": None, "log_level": None}
    return SimpleNamespace(**(base | fields))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"log_requests_level": 5}, "log_requests_level is 5: give 0, 1, 2 or 3"),
        ({"log_requests_level": -1}, "log_requests_level is -1"),
        ({"log_requests_format": "xml"}, "log_requests_format is 'xml'"),
        ({"log_level": "loud"}, "log_level is 'loud'"),
    ],
)
def test_logging_values_sglang_would_fail_on_are_refused(fields, message):
    assert message in refused(check_configure_logging, manager(), logging_request(**fields))


@pytest.mark.parametrize(
    "fields",
    [{"log_requests_level": 0}, {"log_requests_level": 3, "log_requests_format": "json"}, {"log_level": "debug"}, {}],
)
def test_logging_values_sglang_serves_pass(fields):
    assert check_configure_logging(manager(), logging_request(**fields)) is None


def sleeper(watchdog):
    return SimpleNamespace(server_args=SimpleNamespace(watchdog_timeout=watchdog))


@pytest.mark.parametrize(
    "sleep, watchdog, message",
    [
        (1e300, 300.0, "would trip the scheduler's watchdog (--watchdog-timeout 300 s)"),
        (150.0, 300.0, "give less than 150 s"),
        (20.0, 10.0, "--watchdog-timeout 10 s"),
        (float("inf"), 300.0, "forward_sleep_time is inf"),
        (float("nan"), None, "forward_sleep_time is nan"),
        (True, 300.0, "forward_sleep_time is True"),
        ("5", 300.0, "forward_sleep_time is '5'"),
        (1e300, None, "give at most 86400 s"),
    ],
)
def test_a_sleep_the_scheduler_cannot_take_or_survive_is_refused(sleep, watchdog, message):
    obj = SimpleNamespace(forward_sleep_time=sleep)
    assert message in refused(check_slow_down, sleeper(watchdog), obj)


@pytest.mark.parametrize(
    "sleep, watchdog", [(None, 300.0), (0, 300.0), (-3.0, 300.0), (0.5, 300.0), (149.9, 300.0), (3600.0, None)]
)
def test_sleeps_the_scheduler_survives_and_stopping_pass(sleep, watchdog):
    assert check_slow_down(sleeper(watchdog), SimpleNamespace(forward_sleep_time=sleep)) is None
