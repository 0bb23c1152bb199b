"""Real SGLang server processes on CPU with the embedded tiny Kimi model."""

import pytest
from support.servers import SharedServers, launch

from sglang_kimi.cli.server import group_alive


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory):
    """The non-speculative reference: SGLang's synchronous scheduler, which counts every output token for penalties
    before the next one is sampled (its overlap scheduler counts each one step late; docs/verification.md). Without
    penalties both give the same tokens; the demo serves the overlap scheduler. It takes custom logit processors,
    the reference of the speculative servers' processed requests."""
    server = launch(tmp_path_factory, "tiny", ["--disable-overlap-schedule", "--enable-custom-logit-processor"])
    yield server
    server.stop()
    assert not group_alive(server.pgid), "the server left processes behind"


@pytest.fixture(scope="session")
def shared_servers(tmp_path_factory):
    """The speculative tree servers several modules test (``spec_common.shared_tree_server``)."""
    pool = SharedServers(tmp_path_factory)
    yield pool
    pool.stop_all()
