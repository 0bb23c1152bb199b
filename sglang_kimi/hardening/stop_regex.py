"""Stop regexes that cannot freeze the scheduler.

SGLang checks each request's ``stop_regex`` patterns with Python's ``re.search`` inside the scheduler, at every decode
step: on the output's tail (the whole output for a pattern with unbounded repetition) and, when a speculative step
accepts several tokens, once more per accepted prefix to find where the stop falls. A pattern with ambiguous nested
repetition, such as ``(a|a)+b`` or ``(\\s|\\s)*x``, backtracks exponentially in the length of a run of text that
almost matches: about a second at 22 characters, minutes at 30, days at 40. ``re`` has no time limit, and while it
searches the scheduler serves no request at all.

An AROUND hook on ``Req._check_str_based_finish`` runs SGLang's own stop check for a request with stop regexes with
the ``regex`` module (the ``re``-compatible engine that transformers installs) in place of ``re`` for that call: the
same patterns match the same text, and every search gives up after :data:`SEARCH_TIMEOUT_S`. A search that runs out
of time ends its request with HTTP 400 naming the pattern (as SGLang ends a request whose pattern fails to compile
there); the other requests go on.
"""

from __future__ import annotations

import re
import sys
from http import HTTPStatus

import regex

from sglang_kimi.hooks import hook

SEARCH_TIMEOUT_S = 0.1  # one search of one pattern on one output tail (a sane pattern takes microseconds)
SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"


class StopRegexTimeout(Exception):
    """A stop-regex search ran out of time (not an ``re.error``: SGLang's own handler must not swallow it)."""

    def __init__(self, pattern: str):
        super().__init__(pattern)
        self.pattern = pattern


class BoundedRe:
    """What ``schedule_batch``'s ``re`` is during the hooked call: ``search`` bounded, the rest ``re``'s own."""

    def __getattr__(self, name: str):
        return getattr(re, name)

    @staticmethod
    def search(pattern, string, flags=0):
        try:
            return regex.search(pattern, string, flags, timeout=SEARCH_TIMEOUT_S)
        except TimeoutError:
            raise StopRegexTimeout(pattern) from None


BOUNDED_RE = BoundedRe()


def timeout_message(pattern: str) -> str:
    return (
        f"stop_regex {pattern!r} took more than {SEARCH_TIMEOUT_S} s to search the output (nested or ambiguous "
        "repetition such as (a|a)+ backtracks exponentially): the request is stopped; rewrite the pattern without "
        "repetition inside repetition"
    )


def bounded_str_finish(original, req, *args, **kwargs):
    """AROUND ``Req._check_str_based_finish(self, new_accepted_len)``."""
    if not req.sampling_params.stop_regex_strs:
        return original(req, *args, **kwargs)
    module = sys.modules[SCHEDULE_BATCH]
    saved, module.re = module.re, BOUNDED_RE
    try:
        return original(req, *args, **kwargs)
    except StopRegexTimeout as exc:
        req.finished_reason = module.FINISH_ABORT(
            timeout_message(exc.pattern), HTTPStatus.BAD_REQUEST, "BadRequestError"
        )
        return True
    finally:
        module.re = saved


def install_bounded_stop_regex(target: str):
    hook(target, bounded_str_finish, "AROUND")
