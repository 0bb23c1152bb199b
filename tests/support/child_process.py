"""Running test files again in a fresh pytest child process, with a chosen environment.

Two reasons to: SGLang's modules need the CPU import shims (``sglang_kimi/platform/cpu/shims``) on ``PYTHONPATH``,
which must
never leak into the parent test process; and Triton decides at its first import whether kernels run under its
interpreter (``sglang_kimi/kernels/interpret.py``), so a module needing the other mode runs in a fresh process.

The files whose tests need a CPU SGLang process share one (:class:`CpuSglangChild`): importing SGLang costs more
than most of those tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def pytest_in_fresh_process(
    test_files: str | list[str],
    env: dict[str, str],
    unset: tuple[str, ...] = (),
    timeout: float = 1200.0,
    extra_args: tuple[str, ...] = (),
):
    """``pytest test_files`` in a new interpreter, ``env`` added, ``unset`` removed. Returns (exit code, output).
    The child is a session of its own, not a ``pytest -n`` worker as its parent may be."""
    child_env = {k: v for k, v in os.environ.items() if k not in unset and not k.startswith("PYTEST_XDIST_")}
    child_env.update(env)
    files = [test_files] if isinstance(test_files, str) else list(test_files)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra_args, *files],
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


def rerun_in_fresh_process(module_globals: dict, interpret: bool) -> None:
    """For a Triton test module whose process imported Triton in the other mode (``interpret``: the mode the module
    needs): its tests are replaced by one that runs the whole file in a fresh process in that mode, so they still
    run (and fail loudly) instead of being skipped. Call it at the end of the module."""
    for name in [n for n in list(module_globals) if n.startswith("test_")]:
        del module_globals[name]
    test_file, mode = module_globals["__file__"], "interpreter" if interpret else "gpu"

    def test_module_in_fresh_process():
        rc, output = run_pytest_in_fresh_process(test_file, interpret=interpret)
        assert rc == 0, output

    test_module_in_fresh_process.__name__ = f"test_module_in_fresh_{mode}_process"
    module_globals[test_module_in_fresh_process.__name__] = test_module_in_fresh_process


def run_file_in_interpreted_child(test_file: str, child_env: str) -> None:
    """The file's tests (``child_env=1`` selects them there) in a child process on SGLang's GPU code path, with the
    CPU shims and its Triton kernels under ``TRITON_INTERPRET=1``. Fails unless every child test passed and none was
    skipped."""
    from sglang_kimi.launcher.server import SHIMS_DIR

    env = {"PYTHONPATH": str(SHIMS_DIR), child_env: "1", "TRITON_INTERPRET": "1"}
    rc, output = pytest_in_fresh_process(test_file, env, unset=("SGLANG_USE_CPU_ENGINE",))
    assert rc == 0, output[-9000:]
    assert " passed" in output and "skipped" not in output, output[-2000:]


class CpuSglangChild:
    """One CPU SGLang child process (``SGLANG_USE_CPU_ENGINE=1``, the shims on ``PYTHONPATH``, no Triton interpreter)
    for every test file given as ``{path: child_env}``: each file's ``child_env=1`` selects its tests there. It runs
    on the first :meth:`check`; each file's tests must then all have passed, none skipped."""

    def __init__(self, files: dict[str, str], folder: Path):
        self._files = files
        self._folder = folder
        self._cases: list[dict] | None = None
        self._output = ""

    def check(self, test_file: str) -> None:
        path = Path(test_file).resolve()
        assert str(path) in self._files, f"{test_file} is not among the session's CPU SGLang child files"
        if self._cases is None:
            self._run()
        cases = [case for case in self._cases if path.as_posix().endswith("/" + case["file"])]
        assert cases, f"no test of {path.name} ran in the CPU SGLang child:\n{self._output[-9000:]}"
        bad = [case for case in cases if case["outcome"] != "passed"]
        report = "\n\n".join(f"{case['name']}: {case['outcome']}\n{case['text']}" for case in bad)
        assert not bad, f"{len(bad)} of {len(cases)} tests of {path.name} did not pass:\n{report[-9000:]}"

    def _run(self) -> None:
        from sglang_kimi.launcher.server import SHIMS_DIR

        env = {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": str(SHIMS_DIR)}
        env |= {child_env: "1" for child_env in self._files.values()}
        report = self._folder / "report.xml"
        junit = ("--junitxml", str(report), "-o", "junit_family=xunit1")
        rc, self._output = pytest_in_fresh_process(
            sorted(self._files), env, unset=("TRITON_INTERPRET",), extra_args=junit
        )
        assert report.exists(), f"the CPU SGLang child (exit code {rc}) wrote no report:\n{self._output[-9000:]}"
        self._cases = []
        for case in ET.parse(report).getroot().iter("testcase"):
            outcome, text = "passed", ""
            for kind in ("failure", "error", "skipped"):
                found = case.find(kind)
                if found is not None:
                    outcome, text = kind, (found.get("message") or "") + "\n" + (found.text or "")
                    break
            self._cases.append({"file": case.get("file", ""), "name": case.get("name"), "outcome": outcome,
                                "text": text})  # fmt: skip
