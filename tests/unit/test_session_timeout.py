"""``/open_session``'s timeout (``sglang_kimi/hardening/sessions.py``): one the session cannot live with is an HTTP
400, where
SGLang answered the session's id and closed the session at once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from support.refusals import refused

from sglang_kimi.hardening.sessions import check_session_timeout


@pytest.mark.parametrize("timeout", [0, -1, -0.5, float("inf"), float("nan"), True, "60"])
def test_a_timeout_the_session_cannot_live_with_is_refused(timeout):
    message = refused(check_session_timeout, None, SimpleNamespace(timeout=timeout, capacity_of_str_len=100))
    assert f"timeout is {timeout!r}" in message and "/close_session" in message


@pytest.mark.parametrize("timeout", [None, 0.001, 1, 3600.0])
def test_no_timeout_or_a_positive_one_passes(timeout):
    assert check_session_timeout(None, SimpleNamespace(timeout=timeout, capacity_of_str_len=100)) is None
