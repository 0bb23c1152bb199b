"""Servers behind SGLang's router (``sglang-router``): the workers it lists and the plugin's report of each.

Data-parallel replicas behind the router are separate servers: each counts the acceptance of the requests the router
sent it, and the router answers none of SGLang's ``/server_info`` itself. :func:`server_info` reads a URL the way
the plugin's clients read one server: for a router, every worker's ``/server_info`` (its ``GET /workers`` list),
their data-parallel ranks' states gathered into one answer, so :func:`~.dp_reports.merged_report` sums the
acceptance of the whole fleet; :func:`worker_reports` keeps each worker's report apart as well.
"""

from __future__ import annotations

from sglang_kimi.launcher.client import ServerQueryError, get_json, request
from sglang_kimi.launcher.dp_reports import merged_report


class RouterError(ServerQueryError):
    """A router that cannot answer for its workers; the message names the fix."""


def router_workers(url: str, timeout: float = 30.0) -> list[str] | None:
    """The URLs of the workers the router at ``url`` routes to (``GET /workers``); None when ``url`` is not a
    router (an SGLang server has no such route)."""
    response = request(url, "/workers", timeout)
    if response.status_code != 200:
        return None
    try:
        data = response.json()
    except ValueError:
        return None
    workers = data.get("workers") if isinstance(data, dict) else None
    if not isinstance(workers, list):
        return None
    return [w["url"].rstrip("/") for w in workers if isinstance(w, dict) and isinstance(w.get("url"), str)]


def _server_info(url: str, timeout: float) -> dict:
    data = get_json(url, "/server_info", timeout)
    if "internal_states" not in data:
        raise ServerQueryError(
            f"{url} is not an SGLang server: GET /server_info answered without internal_states; give the URL of "
            "`sglang-kimi serve` / `python -m sglang.launch_server`, or of the sglang-router in front of them"
        )
    return data


def worker_server_infos(url: str, timeout: float = 30.0) -> dict[str, dict]:
    """``{worker URL: its /server_info}``: the router's workers, or ``{url: ...}`` for a server."""
    url = url.rstrip("/")
    workers = router_workers(url, timeout)
    if workers is None:
        return {url: _server_info(url, timeout)}
    if not workers:
        raise RouterError(
            f"the router at {url} lists no workers (GET /workers): wait until its workers are healthy, or add them "
            "(--worker-urls, or POST /workers)"
        )
    return {worker: _server_info(worker, timeout) for worker in workers}


def server_info(url: str, timeout: float = 30.0) -> dict:
    """``/server_info`` of the server at ``url``; of a router, the first worker's with every worker's data-parallel
    states in ``internal_states`` (and ``router_workers``: the worker URLs, in the router's order)."""
    infos = worker_server_infos(url, timeout)
    if len(infos) == 1 and url.rstrip("/") in infos:
        return infos[url.rstrip("/")]
    first = dict(next(iter(infos.values())))
    first["internal_states"] = [state for info in infos.values() for state in info.get("internal_states") or []]
    first["router_workers"] = list(infos)
    return first


def worker_reports(url: str, timeout: float = 30.0) -> dict[str, dict]:
    """The plugin's report of each worker (merged over its data-parallel ranks), by worker URL."""
    return {worker: merged_report(info) for worker, info in worker_server_infos(url, timeout).items()}
