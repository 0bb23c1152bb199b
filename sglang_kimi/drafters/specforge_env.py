"""SpecForge's own code, run in its own environment: ``specforge`` installed apart from the plugin's packages (``make
install`` puts 0.2.0 in ``<venv>/specforge`` without its dependencies: its pins, torch 2.11 and sglang 0.5.14, have no
CPU build on the package registry), imported by a subprocess with that folder on ``PYTHONPATH``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

VERSION = "0.2.0"  # the release `make install` installs
SPECFORGE_ENV = "SGLANG_KIMI_SPECFORGE_PATH"  # a folder holding the `specforge` package; default <venv>/specforge


class SpecForgeError(RuntimeError):
    """SpecForge is missing, or one of its commands failed; the message names the fix or carries its output."""


def location() -> Path:
    return Path(os.environ.get(SPECFORGE_ENV) or Path(sys.prefix) / "specforge")


def run(args: list[str], timeout: float = 300.0) -> subprocess.CompletedProcess:
    """``python args`` with SpecForge importable."""
    where = location()
    if not (where / "specforge").is_dir():
        raise SpecForgeError(
            f"SpecForge is not installed in {where}: run `make install` (or `pip install --no-deps --target {where} "
            f"specforge=={VERSION}`), or point {SPECFORGE_ENV} at a folder that holds it"
        )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(where), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


def export(to: str, checkpoint: Path, draft_config: Path, output_dir: Path, *extra: str) -> Path:
    """``specforge export --to {hf, sglang}``: SpecForge's exporter reads the training checkpoint (its loader
    checks every weight against the draft architecture) and writes the serving folder."""
    out = run(["-m", "specforge.cli", "export", "--to", to, "--checkpoint", str(checkpoint), "--draft-config",
               str(draft_config), "--output-dir", str(output_dir), *extra])  # fmt: skip
    if out.returncode:
        raise SpecForgeError(f"specforge export --to {to} failed:\n{out.stderr[-3000:]}")
    return output_dir
