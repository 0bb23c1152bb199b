"""Run a test file's tests again in a fresh pytest child process that imports SGLang on this CPU.

SGLang's modules need the CPU import shims (``sglang_kimi/cpu/shims``) on ``PYTHONPATH``, which must never leak into
the parent test process; each such file defines one parent test that calls :func:`run_file_in_child` and, under
``child_env=1``, the real tests.
"""

from __future__ import annotations

import os
import subprocess
import sys


def run_file_in_child(test_file: str, child_env: str, *, cpu_engine: bool) -> None:
    """``cpu_engine``: SGLang's CPU path (``SGLANG_USE_CPU_ENGINE=1``, no Triton interpreter); otherwise SGLang's GPU
    code path with its Triton kernels under ``TRITON_INTERPRET=1``. Fails unless every child test passed and none
    was skipped."""
    from sglang_kimi.server import SHIMS_DIR

    env = dict(os.environ, PYTHONPATH=str(SHIMS_DIR), **{child_env: "1"})
    if cpu_engine:
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        env.pop("TRITON_INTERPRET", None)
    else:
        env["TRITON_INTERPRET"] = "1"
        env.pop("SGLANG_USE_CPU_ENGINE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
