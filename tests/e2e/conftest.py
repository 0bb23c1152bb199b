"""Real SGLang server processes on CPU with the embedded tiny Kimi model."""

import pytest
from support.servers import SharedServers, launch

from sglang_kimi.server import group_alive


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory):
    server = launch(tmp_path_factory, "tiny")
    yield server
    server.stop()
    assert not group_alive(server.pgid), "the server left processes behind"


@pytest.fixture(scope="session")
def shared_servers(tmp_path_factory):
    """The speculative tree servers several modules test (``spec_common.shared_tree_server``)."""
    pool = SharedServers(tmp_path_factory)
    yield pool
    pool.stop_all()
