"""SpecForge's own code (``specforge`` 0.2.0 from the registry, installed by ``make install`` into ``.venv/specforge``
without its dependencies: its pins, torch 2.11 and sglang 0.5.14, have no CPU build there) run in subprocesses with
that folder on ``PYTHONPATH``: its draft models built from a draft config, and its ``export``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SPECFORGE = Path(sys.prefix) / "specforge"
VERSION = "0.2.0"

# A training checkpoint as SpecForge's exporters read it (``training_state.pt``: the draft's state dict, the
# embedding left out as its trainer leaves it, and the strategy), from a draft model SpecForge builds from the config.
INITIAL_CHECKPOINT = """
import sys, torch
from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig
model = AutoDraftModel.from_config(AutoDraftModelConfig.from_file(sys.argv[1]))
state = {k: v for k, v in model.state_dict().items() if "embed_tokens" not in k}
torch.save({"draft_state_dict": state, "strategy": sys.argv[3]}, sys.argv[2])
"""


def run(args: list[str], timeout: float = 300.0) -> subprocess.CompletedProcess:
    """``python args`` with SpecForge importable; fails naming ``make install`` when it is not installed."""
    if not (SPECFORGE / "specforge").is_dir():
        raise FileNotFoundError(f"SpecForge is not installed in {SPECFORGE}: run `make install`")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SPECFORGE), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


def initial_checkpoint(draft_config: Path, path: Path, strategy: str) -> Path:
    out = run(["-c", INITIAL_CHECKPOINT, str(draft_config), str(path), strategy])
    assert out.returncode == 0, out.stderr[-3000:]
    return path


def export(to: str, checkpoint: Path, draft_config: Path, output_dir: Path, *extra: str) -> Path:
    """``specforge export --to {hf, sglang}``: SpecForge's own exporter writes the serving directory."""
    out = run(["-m", "specforge.cli", "export", "--to", to, "--checkpoint", str(checkpoint), "--draft-config",
               str(draft_config), "--output-dir", str(output_dir), *extra])  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return output_dir
