"""The hardening checks' HTTP 400: one home for the refusal helpers.

A refusal raised on the tokenizer side is a ``fastapi.HTTPException`` (status 400), which SGLang's routes answer as
an error object; :class:`BadValue` and :class:`UnknownField` are also the exception SGLang itself raises at that
place (``ValueError`` / ``TypeError``), so code that catches those behaves as before. Ollama's routes answer their
own shape (:func:`ollama_error`).
"""

from __future__ import annotations

import math
from typing import NoReturn

from fastapi import HTTPException


class BadRequest(HTTPException):
    """HTTP 400 with ``message``; the subclasses are also the exception SGLang raised at that place."""

    def __init__(self, message: str):
        super().__init__(status_code=400, detail=message)


class BadValue(BadRequest, ValueError):
    """A parser name SGLang does not have, or a request the ``/generate`` API contract refuses."""


class UnknownField(BadRequest, TypeError):
    """A keyword the request dataclass does not have."""


def refuse(message: str) -> NoReturn:
    """A tokenizer-side check's refusal: HTTP 400 with ``message``."""
    raise BadRequest(message)


def finite_number(value) -> bool:
    """A JSON number that is finite (not a boolean, a string, inf or nan)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def ollama_error(message: str):
    """HTTP 400 in Ollama's shape: ``{"error": message}``."""
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=400, content={"error": message})
