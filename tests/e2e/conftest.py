"""Real SGLang server processes on CPU with the embedded tiny Kimi model."""

import pytest
from support.servers import launch

from sglang_kimi.server import group_alive


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory):
    server = launch(tmp_path_factory, "tiny")
    yield server
    server.stop()
    assert not group_alive(server.pgid), "the server left processes behind"
