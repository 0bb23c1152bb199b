"""The data-parallel controller waits for requests instead of spinning (``sglang_kimi/hardening/dp_controller.py``).

The loop runs on a real ZeroMQ socket pair with SGLang's own message encoding and soft watchdog; SGLang's loop is
run on the same setup, so that the CPU-time bound is one a spinning loop fails.

SGLang's modules need the CPU import shims: the tests run in the session's CPU SGLang child process
(``cpu_sglang_child``), and one test here fails with its report of them.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import zmq
from sglang.srt.managers.data_parallel_controller import DataParallelController
from sglang.srt.managers.io_struct import sock_send
from sglang.srt.utils.watchdog import Watchdog

from sglang_kimi.hardening.dp_controller import event_loop

pytestmark = pytest.mark.cpu_sglang_child


IDLE_S = 1.0  # the socket stays empty this long before the requests come
REQUESTS = ["a", "b", "c"]


class Done(Exception):
    pass


def run_loop(loop) -> tuple[float, list]:
    """CPU seconds this process spent while ``loop`` served an idle second and then REQUESTS, and what it
    dispatched, in order."""
    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    dispatched = []

    def dispatch(request):
        dispatched.append(request)
        if len(dispatched) == len(REQUESTS):
            raise Done

    def send_later():
        time.sleep(IDLE_S)
        for request in REQUESTS:
            sock_send(push, request)

    controller = SimpleNamespace(
        recv_from_tokenizer=pull,
        _request_dispatcher=dispatch,
        soft_watchdog=Watchdog.create("test", watchdog_timeout=None),
    )
    sender = threading.Thread(target=send_later)
    sender.start()
    started = time.process_time()
    with pytest.raises(Done):
        loop(controller)
    cpu = time.process_time() - started
    sender.join()
    pull.close(linger=0)
    push.close(linger=0)
    context.term()
    return cpu, dispatched


def test_an_idle_controller_waits_without_spending_cpu():
    cpu, dispatched = run_loop(event_loop)
    assert dispatched == REQUESTS
    assert cpu < 0.1 * IDLE_S, f"{cpu:.2f} CPU seconds over a {IDLE_S} s wait"


def test_sglangs_own_loop_spins_while_idle():
    """The measurement above can fail: SGLang's loop, unhooked, burns CPU for the whole wait."""
    cpu, dispatched = run_loop(DataParallelController.event_loop)
    assert dispatched == REQUESTS
    assert cpu > 0.25 * IDLE_S, f"only {cpu:.2f} CPU seconds: the spinning loop was not measured"
