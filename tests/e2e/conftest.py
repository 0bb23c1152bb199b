"""Real SGLang server processes on CPU with the embedded tiny Kimi model, from the session's server pool
(``support.servers.ServerPool``, created by ``tests/conftest.py``): a module lists the servers it uses in
``SERVERS``."""

import pytest
from support.spec_e2e import TINY


@pytest.fixture(scope="module")
def tiny_server(request, server_pool):
    """The non-speculative reference: SGLang's synchronous scheduler, which counts every output token for penalties
    before the next one is sampled (its overlap scheduler counts each one step late; docs/verification.md). Without
    penalties both give the same tokens; the demo serves the overlap scheduler. It takes custom logit processors,
    the reference of the speculative servers' processed requests. One server for the session, stopped after the
    last module that lists it."""
    return server_pool.get(TINY, request)


@pytest.fixture(scope="module", autouse=True)
def stop_servers_no_later_module_lists(request, server_pool):
    yield
    server_pool.module_done(request.module.__name__)
