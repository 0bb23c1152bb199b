"""Reading back the quantized checkpoints ``sglang_kimi/models/quant/formats.py`` writes, for the tests of those
layouts: which modules a state dict stores quantized."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from sglang_kimi.models.quant.formats import INT4


def quantized_modules(sd: Mapping[str, torch.Tensor], fmt: str) -> list[str]:
    """Names of the modules stored quantized in a state dict."""
    suffix = ".weight_packed" if fmt == INT4 else ".weight_scale"
    return sorted(name[: -len(suffix)] for name in sd if name.endswith(suffix))
