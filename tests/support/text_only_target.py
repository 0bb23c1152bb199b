"""A text-only copy of the embedded tiny Kimi model: its ``text_config`` as ``config.json`` and the
``language_model.*`` weights without that prefix (a DeepSeek-V3 causal LM), for the servers SGLang does not start
with the multimodal wrapper's ``--language-model-only`` (prefill and decode servers of PD disaggregation)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from sglang_kimi.assets import TINY_MODEL

PREFIX = "language_model."
SIDE_FILES = ("generation_config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json")


def write_text_only_target(folder: Path, source: Path = TINY_MODEL) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())["text_config"]
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tensors = load_file(source / "model.safetensors")
    save_file({k[len(PREFIX) :]: v for k, v in tensors.items() if k.startswith(PREFIX)}, folder / "model.safetensors")
    for name in SIDE_FILES:
        shutil.copy(source / name, folder / name)
    return folder
