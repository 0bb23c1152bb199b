"""Running a test file again in a fresh pytest child process, with a chosen environment.

Two reasons to: SGLang's modules need the CPU import shims (``sglang_kimi/cpu/shims``) on ``PYTHONPATH``, which must
never leak into the parent test process; and Triton decides at its first import whether kernels run under its
interpreter (``sglang_kimi/kernels/interpret.py``), so a module needing the other mode runs in a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys


def pytest_in_fresh_process(test_file: str, env: dict[str, str], unset: tuple[str, ...] = (), timeout: float = 1200.0):
    """``pytest test_file`` in a new interpreter, ``env`` added, ``unset`` removed. Returns (exit code, output)."""
    child_env = {k: v for k, v in os.environ.items() if k not in unset}
    child_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def run_pytest_in_fresh_process(test_file: str, interpret: bool, timeout: float = 900.0) -> tuple[int, str]:
    """With ``TRITON_INTERPRET`` set (or cleared): for kernel test modules when this process imported Triton in the
    other mode, so their tests still run (and fail loudly) instead of being skipped."""
    if interpret:
        return pytest_in_fresh_process(test_file, {"TRITON_INTERPRET": "1"}, timeout=timeout)
    return pytest_in_fresh_process(test_file, {}, unset=("TRITON_INTERPRET",), timeout=timeout)


def run_file_in_child(test_file: str, child_env: str, *, cpu_engine: bool) -> None:
    """The file's tests in a CPU SGLang child process (``child_env=1`` selects them there). ``cpu_engine``: SGLang's
    CPU path (``SGLANG_USE_CPU_ENGINE=1``, no Triton interpreter); otherwise SGLang's GPU code path with its Triton
    kernels under ``TRITON_INTERPRET=1``. Fails unless every child test passed and none was skipped."""
    from sglang_kimi.server import SHIMS_DIR

    env = {"PYTHONPATH": str(SHIMS_DIR), child_env: "1"}
    if cpu_engine:
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        rc, output = pytest_in_fresh_process(test_file, env, unset=("TRITON_INTERPRET",))
    else:
        env["TRITON_INTERPRET"] = "1"
        rc, output = pytest_in_fresh_process(test_file, env, unset=("SGLANG_USE_CPU_ENGINE",))
    assert rc == 0, output[-9000:]
    assert " passed" in output and "skipped" not in output, output[-2000:]
