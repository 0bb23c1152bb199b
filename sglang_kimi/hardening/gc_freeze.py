"""The garbage-collector freeze SGLang's HTTP server asks for once it serves, made to wait until it does serve.

After start-up SGLang's launcher thread posts ``/freeze_gc`` to its own server (``_freeze_gc_after_server_warmup``),
so that the objects built at start-up leave the collector's oldest generation. With warmup, the warmup request has
already waited for the server to listen. With ``--skip-server-warmup`` (a default of ``sglang-kimi serve`` on CPU) the
post comes straight away, usually before uvicorn has bound its socket: the connection is refused, a 60-line traceback
is logged on every start, and the collector is never frozen. An AROUND hook first waits, up to the time SGLang's own
warmup waits, for the server's port to accept connections; then SGLang's function runs unchanged.
"""

from __future__ import annotations

from sglang_kimi.hooks import hook
from sglang_kimi.launcher.checks import wait_until_listening

WAIT_S = 120.0  # as long as SGLang's warmup polls /model_info


def freeze_gc_once_listening(original, server_args, *args, **kwargs):
    """AROUND ``http_server._freeze_gc_after_server_warmup(server_args)``."""
    wait_until_listening(server_args.url(), timeout_s=WAIT_S)
    return original(server_args, *args, **kwargs)


def install_gc_freeze_wait(target: str):
    hook(target, freeze_gc_once_listening, "AROUND")
