"""Running test files again in a fresh pytest child process, with a chosen environment.

Two reasons to: SGLang's modules need the CPU import shims (``sglang_kimi/platform/cpu/shims``) on ``PYTHONPATH``,
which must
never leak into the parent test process; and Triton decides at its first import whether kernels run under its
interpreter (``sglang_kimi/kernels/interpret.py``), so a module needing the other mode runs in a fresh process.

A test file whose tests must run in an SGLang child process says so with a module-level marker, once:

- ``pytestmark = pytest.mark.cpu_sglang_child``: a CPU SGLang process (``SGLANG_USE_CPU_ENGINE=1``). The session's
  files with it share one child (:class:`CpuSglangChild`): importing SGLang costs more than most of their tests.
- ``pytestmark = pytest.mark.interpreted_sglang_child``: SGLang's GPU code path with its Triton kernels under the
  interpreter (:func:`run_file_in_interpreted_child`), one child per file.

The parent process never imports such a file (``tests/conftest.py``'s ``pytest_pycollect_makemodule`` reads the
marker from its source, :func:`child_kind`): it collects one test per file (:class:`ChildModule`) that runs the
file in its child and fails with the child's report. In the child (:data:`CHILD_KIND_ENV` names its kind) the
file is collected and run as any other, its SGLang imports at module level. To run a file's tests directly as
the CPU child does::

    SGLANG_KIMI_TEST_CHILD=cpu_sglang_child SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=sglang_kimi/platform/cpu/shims \
        python -m pytest tests/unit/test_sessions.py
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

CHILD_KIND_ENV = "SGLANG_KIMI_TEST_CHILD"  # in a child process: the marker of the files it runs (one of KINDS)
CPU_SGLANG = "cpu_sglang_child"
INTERPRETED_SGLANG = "interpreted_sglang_child"
KINDS = (CPU_SGLANG, INTERPRETED_SGLANG)


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


def run_file_in_interpreted_child(test_file: str) -> None:
    """The file's tests in a child process on SGLang's GPU code path, with the CPU shims and its Triton kernels under
    ``TRITON_INTERPRET=1``. Fails, with the child's output, unless every child test passed and none was skipped."""
    from sglang_kimi.launcher.server import SHIMS_DIR

    env = {"PYTHONPATH": str(SHIMS_DIR), CHILD_KIND_ENV: INTERPRETED_SGLANG, "TRITON_INTERPRET": "1"}
    rc, output = pytest_in_fresh_process(test_file, env, unset=("SGLANG_USE_CPU_ENGINE",))
    if rc != 0:
        pytest.fail(f"the interpreted SGLang child exited with {rc}:\n{output[-9000:]}", pytrace=False)
    if " passed" not in output or "skipped" in output:
        pytest.fail(f"the interpreted SGLang child passed no test or skipped one:\n{output[-2000:]}", pytrace=False)


class CpuSglangChild:
    """One CPU SGLang child process (``SGLANG_USE_CPU_ENGINE=1``, the shims on ``PYTHONPATH``, no Triton interpreter)
    for every test file given. It runs on the first :meth:`check`; each file's tests must then all have passed, none
    skipped."""

    def __init__(self, files: list[str], folder: Path):
        self._files = sorted(files)
        self._folder = folder
        self._cases: list[dict] | None = None
        self._output = ""

    def check(self, test_file: str) -> None:
        path = Path(test_file).resolve()
        assert str(path) in self._files, f"{test_file} is not among the session's CPU SGLang child files"
        if self._cases is None:
            self._run()
        cases = [case for case in self._cases if path.as_posix().endswith("/" + case["file"])]
        if not cases:
            pytest.fail(f"no test of {path.name} ran in the CPU SGLang child:\n{self._output[-9000:]}", pytrace=False)
        bad = [case for case in cases if case["outcome"] != "passed"]
        report = "\n\n".join(f"{case['name']}: {case['outcome']}\n{case['text']}" for case in bad)
        if bad:
            pytest.fail(f"{len(bad)} of {len(cases)} tests of {path.name} did not pass in the CPU SGLang child:\n"
                        f"{report[-9000:]}", pytrace=False)  # fmt: skip

    def _run(self) -> None:
        from sglang_kimi.launcher.server import SHIMS_DIR

        env = {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": str(SHIMS_DIR), CHILD_KIND_ENV: CPU_SGLANG}
        report = self._folder / "report.xml"
        junit = ("--junitxml", str(report), "-o", "junit_family=xunit1")
        rc, self._output = pytest_in_fresh_process(self._files, env, unset=("TRITON_INTERPRET",), extra_args=junit)
        self._cases = []
        if not report.exists():
            pytest.fail(f"the CPU SGLang child (exit code {rc}) wrote no report:\n{self._output[-9000:]}",
                        pytrace=False)  # fmt: skip
        for case in ET.parse(report).getroot().iter("testcase"):
            outcome, text = "passed", ""
            for kind in ("failure", "error", "skipped"):
                found = case.find(kind)
                if found is not None:
                    outcome, text = kind, (found.get("message") or "") + "\n" + (found.text or "")
                    break
            self._cases.append({"file": case.get("file", ""), "name": case.get("name"), "outcome": outcome,
                                "text": text})  # fmt: skip


# -- the test files that run in a child process ------------------------------------------------------------------


def child_kind(path: Path) -> str | None:
    """The child marker (one of :data:`KINDS`) in a test file's module-level ``pytestmark``, read from its source
    without importing it; None for a file that runs in the process that collects it."""
    text = Path(path).read_text()
    if not any(kind in text for kind in KINDS):
        return None
    for node in ast.parse(text).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if not any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in targets):
            continue
        for sub in ast.walk(node.value):
            if isinstance(sub, ast.Attribute) and sub.attr in KINDS and ast.unparse(sub.value) == "pytest.mark":
                return sub.attr
    return None


def runs_here(kind: str | None) -> bool:
    """Whether the tests of a file with the child marker ``kind`` run in this process: any unmarked file, and a
    marked one in its kind of child process."""
    return kind is None or os.environ.get(CHILD_KIND_ENV) == kind


class ChildModule(pytest.Module):
    """A test file that runs in a child process of its kind, seen from the parent: one test that runs the file there
    (for ``cpu_sglang_child``: in the session's shared child, the ``cpu_sglang_child`` fixture) and fails with the
    child's report of it. The file itself is never imported here."""

    kind: str

    def _getobj(self):
        # Stands in for the test module (fixtures and the server pool look at ``item.module``): no test of its own.
        module = types.ModuleType(self.path.stem)
        module.__file__ = str(self.path)
        return module

    def collect(self):
        path = str(self.path)
        if self.kind == CPU_SGLANG:

            def test_in_a_cpu_sglang_child(cpu_sglang_child):
                cpu_sglang_child.check(path)

            test = test_in_a_cpu_sglang_child
        else:

            def test_in_an_interpreted_sglang_child():
                run_file_in_interpreted_child(path)

            test = test_in_an_interpreted_sglang_child
        item = ChildTest.from_parent(self, name=test.__name__, callobj=test)
        item.add_marker(self.kind)
        return [item]


class ChildTest(pytest.Function):
    """:class:`ChildModule`'s test, reported at its file (its function is defined here)."""

    def reportinfo(self):
        return self.path, 0, self.name


def make_child_module(path: Path, parent) -> ChildModule | None:
    """For ``pytest_pycollect_makemodule``: a :class:`ChildModule` for a file whose tests run in another process,
    None (pytest's own collection) otherwise."""
    kind = child_kind(path)
    if runs_here(kind):
        return None
    module = ChildModule.from_parent(parent, path=path)
    module.kind = kind
    return module
