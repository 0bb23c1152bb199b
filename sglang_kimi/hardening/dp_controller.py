"""SGLang's data-parallel controller, made to wait for requests instead of spinning for them.

A server with ``--dp-size`` above 1 (attention data parallelism included) runs a controller process that takes each
request from the tokenizer manager and hands it to a rank. Its loop (``DataParallelController.event_loop``, the same
in SGLang 0.5.20 to 0.5.23) polls the tokenizer's socket without blocking and never waits: from start-up to shutdown
the controller keeps one CPU core at 100%, idle or not. On a GPU host that core is taken from the schedulers and the
tokenizer manager; on a CPU server the ranks compute on what is left.

The REPLACE hook runs the same loop with a blocking receive, the way SGLang's detokenizer waits for its scheduler:
the soft watchdog is paused while the socket is empty (an idle controller is not a stuck one) and fed after each
request. Requests are dispatched by SGLang's own dispatcher, in the order they arrive, as before.
"""

from __future__ import annotations

from sglang_kimi.hooks import hook


def event_loop(self) -> None:
    """REPLACE ``DataParallelController.event_loop``: one request at a time, blocking while there is none."""
    from sglang.srt.managers.io_struct import sock_recv

    while True:
        with self.soft_watchdog.disable():
            request = sock_recv(self.recv_from_tokenizer)
        self._request_dispatcher(request)
        self.soft_watchdog.feed()


def install_blocking_dp_controller(target: str):
    hook(target, event_loop, "REPLACE")
