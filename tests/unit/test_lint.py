"""The repository passes ruff's lint and format checks, as configured in pyproject.toml."""

import subprocess
import sys

from support.paths import REPO


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_check():
    result = ruff("check", ".")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_format():
    result = ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
