"""Starting real SGLang servers for the end-to-end tests: one helper, the log in the test's temporary folder."""

from __future__ import annotations

from sglang_kimi.cli.server import ANY_PORT, ServerProcess, group_alive, launch_command

START_TIMEOUT = 600.0


def launch(tmp_path_factory, name: str, args: list[str] | None = None, env: dict[str, str] | None = None):
    """``sglang-kimi serve``'s launch of SGLang with ``args`` (plus ``env``), ready to serve; stopped on failure."""
    spec = launch_command(list(args or []), port=ANY_PORT)
    spec.env.update(env or {})
    server = ServerProcess(spec, tmp_path_factory.mktemp(name) / "server.log")
    try:
        server.wait_ready(START_TIMEOUT)
    except BaseException:
        server.stop()
        raise
    return server


class SharedServers:
    """Servers that several test modules serve alike, started on first use and stopped at the end of the session
    (a start-up costs about as much as the tests run on it)."""

    def __init__(self, tmp_path_factory):
        self._tmp_path_factory = tmp_path_factory
        self._servers: dict[tuple[str, ...], ServerProcess] = {}

    def get(self, name: str, args: list[str]) -> ServerProcess:
        key = tuple(args)
        if key not in self._servers:
            self._servers[key] = launch(self._tmp_path_factory, name, list(args))
        return self._servers[key]

    def stop_all(self) -> None:
        servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.stop()
        left = [server.log_path for server in servers if group_alive(server.pgid)]
        assert not left, f"servers left processes behind: {left}"
