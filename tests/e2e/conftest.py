"""Real SGLang server processes on CPU with the embedded tiny Kimi model."""

import pytest

from sglang_kimi.server import ServerProcess, free_port, group_alive, start_server

START_TIMEOUT = 600.0


def launch(tmp_path_factory, name: str, args: list[str] | None = None) -> ServerProcess:
    log = tmp_path_factory.mktemp(name) / "server.log"
    return start_server(args or [], port=free_port(), log_path=log, timeout=START_TIMEOUT)


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory):
    server = launch(tmp_path_factory, "tiny")
    yield server
    server.stop()
    assert not group_alive(server.pgid), "the server left processes behind"
