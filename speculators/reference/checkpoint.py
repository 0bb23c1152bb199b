"""Drafter checkpoints on disk: ``config.json`` + ``model.safetensors``, the layout z-lab's DFlash and SpecForge's
EAGLE3 drafters are published in (and SGLang loads with ``--speculative-draft-model-path``)."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

import torch
from torch import nn

from ..configs import DrafterConfigError


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors by name, a ``model.`` prefix dropped (both spellings are published)."""
    from safetensors.torch import load_file

    return {k.removeprefix("model."): v for k, v in load_file(path / "model.safetensors").items()}


def check_names(path: Path, missing: Collection[str], unexpected: Collection[str]) -> None:
    """Refuse a checkpoint whose tensor names are not the config's."""
    if missing or unexpected:
        raise DrafterConfigError(
            f"{path}: checkpoint does not match its config: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )


def save(model: nn.Module, config: dict, path: str | Path, dtype: torch.dtype) -> None:
    """Write ``config`` (with ``torch_dtype``) and the model's tensors, floating-point ones cast to ``dtype``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {**config, "torch_dtype": str(dtype).removeprefix("torch.")}
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {
        k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous()
        for k, v in model.state_dict().items()
    }
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
