"""How the kernels reach Triton's interpreter on CPU, checked in fresh processes (the interpreter choice is made
per process, when Triton is first imported; see ``kernels/interpret.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_python(code: str, interpret_env: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if interpret_env is not None:
        env["TRITON_INTERPRET"] = interpret_env
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )


def test_interpreter_imports_first_then_sglang_and_cpu_launch():
    proc = run_python(
        """
        import os, torch
        from sglang_kimi.kernels.interpret import interpreter_active, interpreter_imports
        with interpreter_imports():
            from sglang_kimi.kernels import ddtree_build as dd
        from sglang_kimi.speculators.ddtree import rank_draft_logits
        assert interpreter_active()
        assert "TRITON_INTERPRET" not in os.environ, "the variable must not leak to later subprocesses"
        import sglang.srt.plugins.hook_registry  # SGLang still imports afterwards
        lp, ids = rank_draft_logits(torch.randn(2, 3, 10), 5)
        tree = dd.ddtree_build(torch.tensor([1, 2]), lp, ids, 5)
        assert tree.tokens.shape == (2, 6)
        print("ok")
        """
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr


def test_triton_imported_first_without_interpreter_gives_a_clear_error():
    proc = run_python(
        """
        import torch, triton.language
        from sglang_kimi.kernels.interpret import interpreter_active, interpreter_imports
        with interpreter_imports():
            from sglang_kimi.kernels import ddtree_build as dd
        from sglang_kimi.speculators.ddtree import rank_draft_logits
        assert not interpreter_active()
        lp, ids = rank_draft_logits(torch.randn(1, 2, 4), 3)
        try:
            dd.ddtree_build(torch.tensor([0]), lp, ids, 3)
        except RuntimeError as exc:
            assert "TRITON_INTERPRET=1" in str(exc) and "_ref" in str(exc), exc
            print("ok")
        """
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr


def test_module_runs_itself_in_a_fresh_process_when_triton_came_first():
    """pytest in a process that imported Triton without the interpreter: the kernel test module replaces its tests
    by one that runs the module in a fresh interpreter process, and that one passes."""
    proc = run_python(
        f"""
        import sys, triton.language, pytest
        sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", {str(HERE / "test_kernel_ddtree_build.py")!r}]))
        """
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout, proc.stdout
