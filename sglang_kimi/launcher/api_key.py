"""The API key of a server started with ``--api-key``, for the plugin's clients (``eval``, ``bench``,
``calibrate-kv``).

Such a server answers HTTP 401 to every request without ``Authorization: Bearer <key>``, ``/health`` excepted.
lm-eval's ``local-completions`` model and SGLang's ``bench_serving`` read the key from ``OPENAI_API_KEY``; the
plugin's own requests (server probes, ``/server_info``, calibration prompts) read it there too, and each command's
``--api-key`` sets it for all of them.
"""

from __future__ import annotations

import os

ENV = "OPENAI_API_KEY"
HELP = f"key of a server started with --api-key (default: ${ENV}, which lm-eval and SGLang's bench_serving read)"


def use_api_key(key: str | None) -> None:
    """Make ``key`` the one every client of this process sends (None or empty: keep ``$OPENAI_API_KEY``)."""
    if key:
        os.environ[ENV] = key


def auth_headers() -> dict[str, str]:
    key = os.environ.get(ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def refused_key_hint(status: int) -> str | None:
    """What to do about an HTTP 401 / 403 answer; None for any other status."""
    if status not in (401, 403):
        return None
    if os.environ.get(ENV):
        return f"the server refused the API key in ${ENV} / --api-key (HTTP {status}): give the key it was started with"
    return (
        f"the server wants an API key (HTTP {status}; it was started with --api-key): pass --api-key KEY or set ${ENV}"
    )
