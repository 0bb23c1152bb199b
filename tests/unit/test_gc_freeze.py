"""The post-start GC freeze waits for the server to listen (``sglang_kimi/hardening/gc_freeze.py``)."""

import socket
import threading
import time
from types import SimpleNamespace

from sglang_kimi.hardening.gc_freeze import freeze_gc_once_listening
from sglang_kimi.launcher.checks import free_port, wait_until_listening


def listen_after(port: int, delay_s: float, ready: threading.Event):
    def serve():
        time.sleep(delay_s)
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
            ready.set()
            connection, _ = server.accept()
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_the_freeze_runs_only_once_the_port_listens():
    port = free_port()
    ready = threading.Event()
    listen_after(port, 0.5, ready)
    calls = []

    def original(server_args):
        calls.append(ready.is_set())  # SGLang's post would be refused before this
        return "frozen"

    server_args = SimpleNamespace(url=lambda: f"http://127.0.0.1:{port}")
    assert freeze_gc_once_listening(original, server_args) == "frozen"
    assert calls == [True]


def test_a_port_that_never_listens_gives_up_at_the_deadline():
    port = free_port()
    started = time.monotonic()
    assert not wait_until_listening(f"http://127.0.0.1:{port}", timeout_s=0.3)
    assert 0.3 <= time.monotonic() - started < 5
