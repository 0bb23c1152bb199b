"""Layers the reference drafter modules and the compact DeepSeek-V3 (:mod:`.deepseek_v3`) share: RoPE as SGLang
builds it (plain, YaRN, DeepSeek YaRN), RMSNorm, the gated MLP, and attention under an explicit boolean mask."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..configs import GQA, DFlashConfig, Eagle3Config, yarn_attention_factor, yarn_get_mscale


@dataclass(frozen=True)
class Rope:
    """RoPE as SGLang's ``get_rope`` builds it: plain, YaRN (``yarn``) or DeepSeek YaRN (``deepseek_yarn``, MLA).

    ``cos_sin(positions)`` -> (cos, sin) [..., rotary_dim / 2] with the attention factor folded in;
    ``apply(x, cos, sin)`` rotates the last dim: neox halves (Qwen3 / Llama) or interleaved pairs (DeepSeek MLA).
    """

    rotary_dim: int
    base: float
    scaling: Mapping | None = None
    neox: bool = True
    deepseek: bool = False  # DeepseekScalingRotaryEmbedding: mscale_all_dim defaults to 0
    max_position: int = 4096  # original_max_position_embeddings when the scaling block has none

    def inv_freq(self) -> torch.Tensor:
        d = self.rotary_dim
        pos_freqs = self.base ** (torch.arange(0, d, 2, dtype=torch.float) / d)
        if self.scaling is None:
            return 1.0 / pos_freqs
        s = self.scaling
        factor = float(s["factor"])
        orig = float(s.get("original_max_position_embeddings", self.max_position))
        truncate = True if self.deepseek else bool(s.get("truncate", True))

        def corr_dim(rotations: float) -> float:
            return (d * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(self.base))

        low, high = corr_dim(float(s.get("beta_fast", 32))), corr_dim(float(s.get("beta_slow", 1)))
        if truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(d // 2, dtype=torch.float) - low) / (high - low)).clamp(0, 1)
        extrapolate = (1 - ramp) * float(s.get("extrapolation_factor", 1.0))  # 1 = keep the original frequency
        return (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate

    def attention_factor(self) -> float:
        if self.scaling is None:
            return 1.0
        if not self.deepseek:
            return yarn_attention_factor(self.scaling)
        f = float(self.scaling["factor"])
        m, m_all = float(self.scaling.get("mscale", 1.0)), float(self.scaling.get("mscale_all_dim", 0.0))
        return yarn_get_mscale(f, m) / yarn_get_mscale(f, m_all) * float(self.scaling.get("attn_factor", 1.0))

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq().to(positions.device)  # [..., d/2]
        factor = self.attention_factor()
        return freqs.cos() * factor, freqs.sin() * factor

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [..., S, heads, rotary_dim] with cos/sin [..., S, rotary_dim / 2]."""
        cos, sin = cos[..., None, :].to(x.dtype), sin[..., None, :].to(x.dtype)
        if self.neox:
            x1, x2 = x.chunk(2, dim=-1)
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def rope_for(config: DFlashConfig | Eagle3Config) -> Rope:
    """The drafter's RoPE: Qwen3 neox halves (DFlash, EAGLE3 GQA) or DeepSeek YaRN on the rope dims (EAGLE3 MLA)."""
    if isinstance(config, DFlashConfig) or config.attention == GQA:
        return Rope(
            config.head_dim, config.rope_theta, config.rope_scaling, neox=True,
            max_position=config.max_position_embeddings,
        )  # fmt: skip
    return Rope(
        config.qk_rope_head_dim,
        config.rope_theta,
        config.rope_scaling,
        neox=not config.rope_interleave,
        deepseek=True,
        max_position=config.max_position_embeddings,
    )


class RMSNorm(nn.Module):
    """SGLang's / HF's RMSNorm: normalize in fp32, scale by ``weight``, cast back.

    ``cast_before_scale`` takes transformers' ``DeepseekV3RMSNorm`` order instead: cast the normalized fp32 values
    back to the input dtype, then scale in the weight's dtype (the compact DeepSeek-V3 of :mod:`.deepseek_v3`).
    The two orders are equal in float32; in float64 the default rounds the product to float32.
    """

    def __init__(self, dim: int, eps: float, cast_before_scale: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.cast_before_scale = cast_before_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.cast_before_scale:
            return self.weight * xf.to(x.dtype)
        return (self.weight.float() * xf).to(x.dtype)


class GatedMLP(nn.Module):
    """SwiGLU: ``down_proj(silu(gate_proj(x)) * up_proj(x))`` (Qwen3 / Llama / DeepSeek dense MLP)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """q [B, S, Hq, D], k [B, K, Hkv, D], v [B, K, Hkv, Dv], mask bool [B, S, K] (True = attend) or None (all)
    -> [B, S, Hq, Dv]. GQA: each group of Hq / Hkv query heads shares one KV head."""
    groups = q.shape[2] // k.shape[2]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    attn_mask = None if mask is None else mask[:, None]  # [B, 1, S, K]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask, scale=scale
    )
    return out.transpose(1, 2)
