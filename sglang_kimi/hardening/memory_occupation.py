"""``/release_memory_occupation`` and ``/resume_memory_occupation`` that cannot end a serving server.

SGLang 0.5.23's scheduler handles both requests in ``SchedulerWeightUpdaterManager``, and two ordinary calls ended it:

- a release while requests are running: ``assert self.is_fully_idle(...)`` raises in the scheduler ("should be called
  only when server is idle");
- a resume of a region that was not released (a resume without a release first, or a second resume):
  ``offload_tags.remove(tag)`` raises ``KeyError``.

BEFORE hooks on the tokenizer manager answer HTTP 400 for a tag SGLang does not know (``kv_cache``, ``weights``,
``cuda_graph``), and for a release while this server has requests in flight and generation is not paused (RL
frameworks release after ``/pause_generation``, whose retracted requests wait in the queue, which SGLang allows).
AROUND hooks on the scheduler's handlers keep the rest from ending it: a release that still finds a request running
(one that arrived after the check, or one paused in place) releases nothing and logs why, and a resume resumes the
released regions it names and leaves the resident ones as they are, which is the state it asks for.
"""

from __future__ import annotations

import logging

from sglang_kimi.hardening.http_errors import refuse
from sglang_kimi.hooks import hook

logger = logging.getLogger(__name__)


def _all_tags() -> list[str]:
    from sglang.srt.constants import GPU_MEMORY_ALL_TYPES

    return list(GPU_MEMORY_ALL_TYPES)


def _reply(name: str):
    """The scheduler's (empty) answer to the tokenizer manager, which the HTTP route waits for."""
    from sglang.srt.managers import io_struct

    return getattr(io_struct, name)()


def _check_tags(obj) -> None:
    known = _all_tags()
    unknown = [tag for tag in getattr(obj, "tags", None) or [] if tag not in known]
    if unknown:
        refuse(f"unknown memory tags {unknown}: choose from {known}, or leave tags out for all of them")


def check_release(tokenizer_manager, obj, *args, **kwargs):
    """BEFORE ``TokenizerManager.release_memory_occupation(self, obj, ...)``."""
    _check_tags(obj)
    in_flight = len(getattr(tokenizer_manager, "rid_to_state", {}) or {})
    if in_flight and not getattr(tokenizer_manager, "is_pause", False):
        refuse(
            f"{in_flight} request{'s are' if in_flight > 1 else ' is'} being served: release memory when the server "
            'is idle, or after /pause_generation with mode "retract" or "abort"'
        )
    return None


def check_resume(tokenizer_manager, obj, *args, **kwargs):
    """BEFORE ``TokenizerManager.resume_memory_occupation(self, obj, ...)``."""
    _check_tags(obj)
    return None


def release_when_idle(original, manager, recv_req, *args, **kwargs):
    """AROUND ``SchedulerWeightUpdaterManager.release_memory_occupation(self, recv_req)``."""
    # the idleness SGLang asserts: 0.5.21+ let the requests a pause retracted wait in the queue, 0.5.20 does not
    paused = getattr(manager.scheduler, "_engine_paused", None)
    idle = manager.is_fully_idle() if paused is None else manager.is_fully_idle(ignore_waiting=bool(paused))
    if not idle:
        logger.error(
            "release_memory_occupation: requests are running, nothing released; release when the server is idle, "
            'or after /pause_generation with mode "retract" or "abort"'
        )
        return _reply("ReleaseMemoryOccupationReqOutput")
    return original(manager, recv_req, *args, **kwargs)


def resume_what_was_released(original, manager, recv_req, *args, **kwargs):
    """AROUND ``SchedulerWeightUpdaterManager.resume_memory_occupation(self, recv_req)``."""
    asked = recv_req.tags or _all_tags()
    released = [tag for tag in asked if tag in manager.offload_tags]
    if not released:
        logger.info("resume_memory_occupation: %s not released, nothing to resume", asked)
        return _reply("ResumeMemoryOccupationReqOutput")
    recv_req.tags = released
    return original(manager, recv_req, *args, **kwargs)


def install_memory_occupation_checks(
    tokenizer_release: str, tokenizer_resume: str, scheduler_release: str, scheduler_resume: str
):
    hook(tokenizer_release, check_release, "BEFORE")
    hook(tokenizer_resume, check_resume, "BEFORE")
    hook(scheduler_release, release_when_idle, "AROUND")
    hook(scheduler_resume, resume_what_was_released, "AROUND")
