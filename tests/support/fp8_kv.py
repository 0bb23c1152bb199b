"""The FP8 KV round trip as SGLang's pools and kernels do it, for the tests of the FP8 KV scales
(``sglang_kimi/models/kv_scales.py``): what a pool stores and what an attention kernel reads back."""

from __future__ import annotations

import torch


def fp8_store(x: torch.Tensor, scale: float, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """What an SGLang pool stores: ``(x / scale).to(fp8)`` (torch saturates at +-448)."""
    return (x / scale).to(dtype)


def fp8_load(stored: torch.Tensor, scale: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What an attention kernel reads: ``stored * scale`` (``k_descale``)."""
    return stored.to(dtype) * scale
