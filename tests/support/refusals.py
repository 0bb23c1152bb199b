"""A check's HTTP 400: the detail a request-checking hook answers with (``fastapi.HTTPException``)."""

from __future__ import annotations

import pytest
from fastapi import HTTPException


def refused(call, *args) -> str:
    """``call(*args)`` raises HTTP 400; its detail."""
    with pytest.raises(HTTPException) as info:
        call(*args)
    assert info.value.status_code == 400
    return info.value.detail
