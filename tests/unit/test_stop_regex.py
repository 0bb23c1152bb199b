"""Bounded stop regexes (``sglang_kimi/hardening/stop_regex.py``): the same matches as ``re``, a time limit per search,
and a
request whose search runs out of time ended with HTTP 400 while SGLang's module keeps its own ``re``."""

import re
import sys
import time
from http import HTTPStatus
from types import SimpleNamespace

import pytest

from sglang_kimi.hardening import stop_regex as sr

PATTERNS = [r"[0-9]+ =", r"\.$", r"^The", r"(\d+\s*)+=", r"(?i)answer", r"\bis\b", r"(?=x)x+", r"[^\W\d]+!", r"é+"]
TEXTS = ["The answer is 12 = 12.", "no digits here", "x", "Ünïcödé é!", "", "12 34 =", "ANSWER: 4\n"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_bounded_search_matches_what_re_matches(pattern):
    for text in TEXTS:
        ours, theirs = sr.BOUNDED_RE.search(pattern, text), re.search(pattern, text)
        assert (ours is None) == (theirs is None), (pattern, text)
        if theirs is not None:
            assert ours.span() == theirs.span(), (pattern, text)


def test_a_search_that_backtracks_exponentially_stops_in_time():
    start = time.monotonic()
    with pytest.raises(sr.StopRegexTimeout) as info:
        sr.BOUNDED_RE.search(r"(a|a)+b", "a" * 40)  # with re: about 2^40 steps
    assert time.monotonic() - start < 10 * sr.SEARCH_TIMEOUT_S
    assert info.value.pattern == r"(a|a)+b"
    assert sr.BOUNDED_RE.IGNORECASE is re.IGNORECASE  # the rest is re's own


class FakeScheduleBatch:
    """Stands in for SGLang's module: its own ``re`` and ``FINISH_ABORT``."""

    re = re

    class FINISH_ABORT:  # noqa: N801 - SGLang's name
        def __init__(self, message, status_code, err_type):
            self.message, self.status_code, self.err_type = message, status_code, err_type


@pytest.fixture
def schedule_batch(monkeypatch):
    monkeypatch.setitem(sys.modules, sr.SCHEDULE_BATCH, FakeScheduleBatch)
    return FakeScheduleBatch


def request(*patterns):
    return SimpleNamespace(sampling_params=SimpleNamespace(stop_regex_strs=list(patterns)), finished_reason=None)


def checking(text):
    """SGLang's check as the hook sees it: searches with the module's ``re`` of the moment."""
    seen = []

    def original(req, new_accepted_len=1):
        seen.append(sys.modules[sr.SCHEDULE_BATCH].re)
        return any(sys.modules[sr.SCHEDULE_BATCH].re.search(p, text) for p in req.sampling_params.stop_regex_strs)

    return original, seen


def test_sglangs_check_runs_bounded_and_the_module_gets_re_back(schedule_batch):
    original, seen = checking("12 =")
    assert sr.bounded_str_finish(original, request(r"[0-9]+ ="), 1) is True
    assert sr.bounded_str_finish(original, request(r"x$"), 1) is False
    assert seen == [sr.BOUNDED_RE, sr.BOUNDED_RE] and schedule_batch.re is re


def test_requests_without_stop_regex_are_checked_as_before(schedule_batch):
    original, seen = checking("12 =")
    assert sr.bounded_str_finish(original, request(), 1) is False
    assert seen == [re]


def test_a_search_out_of_time_ends_only_that_request_with_400(schedule_batch):
    original, _ = checking("a" * 40)
    req = request(r"(a|a)+b")
    assert sr.bounded_str_finish(original, req, 3) is True
    reason = req.finished_reason
    assert reason.status_code == HTTPStatus.BAD_REQUEST and reason.err_type == "BadRequestError"
    assert "(a|a)+b" in reason.message and "backtracks exponentially" in reason.message
    assert schedule_batch.re is re


def test_other_errors_reach_sglang_with_re_restored(schedule_batch):
    def original(req, new_accepted_len=1):
        raise re.error("bad pattern")

    with pytest.raises(re.error):
        sr.bounded_str_finish(original, request("("), 1)
    assert schedule_batch.re is re
