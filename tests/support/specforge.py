"""SpecForge's own code (``specforge`` 0.2.0, in its own environment: ``sglang_kimi.drafters.specforge_env``) for the
tests: its draft models built from a draft config, and its ``export``."""

from __future__ import annotations

from pathlib import Path

from sglang_kimi.drafters.specforge_env import export, run

__all__ = ["export", "initial_checkpoint", "run"]

# A training checkpoint as SpecForge's exporters read it (``training_state.pt``: the draft's state dict, the
# embedding left out as its trainer leaves it, and the strategy), from a draft model SpecForge builds from the config.
INITIAL_CHECKPOINT = """
import sys, torch
from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig
model = AutoDraftModel.from_config(AutoDraftModelConfig.from_file(sys.argv[1]))
state = {k: v for k, v in model.state_dict().items() if "embed_tokens" not in k}
torch.save({"draft_state_dict": state, "strategy": sys.argv[3]}, sys.argv[2])
"""


def initial_checkpoint(draft_config: Path, path: Path, strategy: str) -> Path:
    out = run(["-c", INITIAL_CHECKPOINT, str(draft_config), str(path), strategy])
    assert out.returncode == 0, out.stderr[-3000:]
    return path
