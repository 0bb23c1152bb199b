"""SGLang's router (``sglang-router``, installed with the test extra) in front of servers a test started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import requests

from sglang_kimi.launcher.checks import free_port

READY_TIMEOUT = 300.0  # the router registers a worker after its /health, /server_info and /model_info answer


@contextmanager
def router(worker_urls: list[str], log_path, policy: str = "round_robin"):
    """The router's URL, once it reports every worker healthy; stopped with its process group on exit."""
    with router_with(["--worker-urls", *worker_urls, "--policy", policy], len(worker_urls), log_path) as url:
        yield url


@contextmanager
def pd_router(prefill_url: str, bootstrap_port: int, decode_url: str, log_path):
    """The router of one prefill and one decode server (SGLang's PD disaggregation), once both are healthy."""
    args = ["--pd-disaggregation", "--prefill", prefill_url, str(bootstrap_port), "--decode", decode_url]
    with router_with(args, 2, log_path) as url:
        yield url


@contextmanager
def router_with(args: list[str], workers: int, log_path):
    port, metrics_port = free_port(), free_port()
    command = [
        sys.executable, "-m", "sglang_router.launch_router", *args,
        "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(metrics_port), "--log-level", "warn",
    ]  # fmt: skip
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, workers, proc, log_path)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_ready(url: str, workers: int, proc, log_path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sglang-router exited with {proc.returncode}: {open(log_path).read()[-2000:]}")
        try:
            response = requests.get(url + "/readiness", timeout=10)
            last = f"HTTP {response.status_code}: {response.text[:200]}"
            if response.status_code == 200 and response.json().get("healthy_workers") == workers:
                return
        except (requests.RequestException, ValueError) as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(1.0)
    raise TimeoutError(f"sglang-router at {url} not ready with {workers} workers in {READY_TIMEOUT:.0f} s: {last}")
