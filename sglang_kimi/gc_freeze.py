"""The garbage-collector freeze SGLang's HTTP server asks for once it serves, made to wait until it does serve.

After start-up SGLang's launcher thread posts ``/freeze_gc`` to its own server (``_freeze_gc_after_server_warmup``),
so that the objects built at start-up leave the collector's oldest generation. With warmup, the warmup request has
already waited for the server to listen. With ``--skip-server-warmup`` (a default of ``sglang-kimi serve`` on CPU) the
post comes straight away, usually before uvicorn has bound its socket: the connection is refused, a 60-line traceback
is logged on every start, and the collector is never frozen. An AROUND hook first waits, up to the time SGLang's own
warmup waits, for the server's port to accept connections; then SGLang's function runs unchanged.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

from sglang_kimi.hooks import hook

WAIT_S = 120.0  # as long as SGLang's warmup polls /model_info
POLL_S = 0.05


def wait_until_listening(url: str, timeout_s: float = WAIT_S, connect_timeout_s: float = 1.0) -> bool:
    """Whether ``url``'s host and port accept a TCP connection within ``timeout_s`` seconds (0: one try), each try
    given ``connect_timeout_s``."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((parts.hostname, port), timeout=connect_timeout_s):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)


def freeze_gc_once_listening(original, server_args, *args, **kwargs):
    """AROUND ``http_server._freeze_gc_after_server_warmup(server_args)``."""
    wait_until_listening(server_args.url())
    return original(server_args, *args, **kwargs)


def install_gc_freeze_wait(target: str):
    hook(target, freeze_gc_once_listening, "AROUND")
