"""A server started on a picked free port that another process binds first is started again on a new port; a
port the user chose is never replaced."""

import socket
import sys
import textwrap

import pytest
import requests

from sglang_kimi.launcher.checks import DEFAULT_HOST, LaunchError
from sglang_kimi.launcher.server import LaunchSpec, ServerProcess

# Stands in for SGLang: binds --port, answers /health, or exits with uvicorn's bind error (as SGLang's log has it).
FAKE_SERVER = textwrap.dedent(
    """
    import http.server, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    try:
        server = http.server.HTTPServer(("127.0.0.1", port), Health)
    except OSError as e:
        print(f"ERROR:    [Errno {e.errno}] error while attempting to bind on address ('127.0.0.1', {port}): "
              "address already in use", flush=True)
        sys.exit(3)
    print("ready", flush=True)
    server.serve_forever()
    """
)


@pytest.fixture
def taken_port():
    with socket.socket() as sock:
        sock.bind((DEFAULT_HOST, 0))
        sock.listen()
        yield sock.getsockname()[1]


def fake_spec(port: int, any_port: bool) -> LaunchSpec:
    argv = [sys.executable, "-c", FAKE_SERVER, "--port", str(port)]
    return LaunchSpec(argv=argv, env={}, host=DEFAULT_HOST, port=port, cpu=True, any_port=any_port)


def test_a_picked_port_lost_to_another_process_is_picked_again(tmp_path, taken_port):
    server = ServerProcess(fake_spec(taken_port, any_port=True), tmp_path / "server.log")
    try:
        server.wait_ready(30)
        assert server.spec.port != taken_port
        assert str(server.spec.port) in server.spec.argv
        assert requests.get(server.base_url + "/health", timeout=5).status_code == 200
        log = (tmp_path / "server.log").read_text()
        assert f"port {taken_port} was taken by another process; starting again on {server.spec.port}" in log
    finally:
        server.stop()


def test_a_port_the_user_chose_is_never_replaced(tmp_path, taken_port):
    server = ServerProcess(fake_spec(taken_port, any_port=False), tmp_path / "server.log")
    try:
        with pytest.raises(LaunchError, match="address already in use"):
            server.wait_ready(30)
        assert server.spec.port == taken_port
    finally:
        server.stop()


def test_free_port_never_hands_out_a_port_twice(monkeypatch):
    """The kernel may offer a released port again; servers started side by side must still get distinct ones."""
    from sglang_kimi.launcher import checks as launch_checks

    offered = iter([41000, 41000, 41000, 41001])

    class OfferingSocket:
        def __init__(self, *args):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(offered)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(launch_checks, "_handed_out", set())
    monkeypatch.setattr(launch_checks.socket, "socket", OfferingSocket)
    assert launch_checks.free_port() == 41000
    assert launch_checks.free_port() == 41001
