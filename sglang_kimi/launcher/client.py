"""Reading an SGLang server's JSON routes, with one message for each way a URL can fail to be one: unreachable,
too slow, refusing the API key, or answering something other than SGLang's JSON. The plugin's clients (the router
reads, the eval and bench commands, the KV calibration) all read servers through :func:`get_json`."""

from __future__ import annotations

import requests

from sglang_kimi.launcher.api_key import auth_headers, refused_key_hint

NOT_SGLANG_FIX = "point the URL at `python -m sglang.launch_server` / `sglang-kimi serve`"


class ServerQueryError(RuntimeError):
    """A URL that could not be read as an SGLang server; the one-line message names the problem and the fix."""


def request(
    url: str,
    path: str,
    timeout: float,
    *,
    method: str = "GET",
    body: dict | None = None,
    fix: str = "check the URL and port",
    error: type[Exception] = ServerQueryError,
) -> requests.Response:
    """``method path`` on the server at ``url`` with the API key; ``error`` when it is unreachable (naming ``fix``),
    does not answer within ``timeout`` seconds, or refuses the key. Any other answer is returned as it came."""
    try:
        response = requests.request(method, url + path, json=body, timeout=timeout, headers=auth_headers())
    except requests.ConnectionError as exc:
        reason = "connection refused" if "refused" in str(exc).lower() else type(exc).__name__
        raise error(f"cannot reach {url} ({reason}): is the server running? {fix}") from None
    except requests.Timeout:
        raise error(f"{url} did not answer {path} within {timeout:.0f} s: is the server overloaded?") from None
    except requests.RequestException as exc:
        raise error(f"cannot reach {url}: {exc}") from None
    hint = refused_key_hint(response.status_code)
    if hint:
        raise error(f"{url}: {method} {path}: {hint}")
    return response


def get_json(
    url: str, path: str, timeout: float, *, method: str = "GET", error: type[Exception] = ServerQueryError, **options
) -> dict:
    """One JSON object from the server at ``url`` (:func:`request`, with its ``body`` and ``fix`` options);
    ``error`` also when the answer is not HTTP 200 or not a JSON object."""
    response = request(url, path, timeout, method=method, error=error, **options)
    kind = response.headers.get("content-type", "?").split(";")[0]
    if response.status_code != 200:
        raise error(
            f"{url} is not an SGLang server: {method} {path} answered HTTP {response.status_code} ({kind}); "
            f"{NOT_SGLANG_FIX}"
        )
    try:
        data = response.json()
    except ValueError:
        raise error(
            f"{url} is not an SGLang server: {method} {path} answered {kind}, not JSON; {NOT_SGLANG_FIX}"
        ) from None
    if not isinstance(data, dict):
        raise error(f"{url} is not an SGLang server: {method} {path} answered a JSON {type(data).__name__}")
    return data
