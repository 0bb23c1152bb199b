"""Starting real SGLang servers for the end-to-end tests: one helper, the log in the test's temporary folder."""

from __future__ import annotations

from sglang_kimi.server import ANY_PORT, ServerProcess, launch_command

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
