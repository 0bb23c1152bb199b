"""DFlash drafter (z-lab format): config, module, block drafting, and plug-ins for the reference proposers.

A DFlash drafter is a stack of Qwen3 decoder layers with **non-causal** attention that drafts a whole block in one
pass (``reference/algorithms.md`` 1.1-1.2; SGLang ``srt/models/dflash.py::DFlashDraftModel``):

- context: ``ctx = hidden_norm(fc(cat_l h_l))`` over the target's captured layers (``target_layer_ids``) of every
  committed token; the same ctx rows feed every layer, where each layer's own ``k_proj`` / ``v_proj`` turns them
  into K/V ("injected into the KV cache"): K = RoPE(k_norm(k_proj(ctx))), V = v_proj(ctx);
- block: ``[bonus, mask x (B-1)]`` embedded with the *target's* ``embed_tokens`` at positions start..start+B-1;
  Q comes from the block only, K/V from ``[ctx; block]``, and every block row sees every ctx row and every block
  row (``is_causal=False``);
- readout: ``logits_k = target.lm_head(norm(h_k))``; position k (k = 1..B-1) drafts token start+k.

Tensor names are the published ones (``z-lab/Kimi-K2.5-DFlash``): ``layers.{i}.self_attn.{q,k,v,o}_proj``,
``layers.{i}.self_attn.{q,k}_norm``, ``layers.{i}.mlp.{gate,up,down}_proj``, ``layers.{i}.input_layernorm``,
``layers.{i}.post_attention_layernorm``, ``fc``, ``hidden_norm``, ``norm``; no embedding, no LM head.

RoPE is Qwen3's (neox halves) with SGLang's ``get_rope`` scaling: for YaRN the cos/sin carry the attention factor
``yarn_get_mscale(f, mscale) / yarn_get_mscale(f, mscale_all_dim)`` when both are given (1.0 for the published
Kimi config, where both are 1.0), else the legacy ``1 + 0.1 ln f`` (1.416 for f = 64). Transformers 5 computes the
same; see :func:`yarn_attention_factor`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .pairing import DrafterConfigError, load_config_dict
from .reference import DraftContext

DEFAULT_BLOCK_SIZE = 16  # SGLang's default when a config has no block_size
DEFAULT_MASK_TOKEN = "<|MASK|>"  # SGLang's default dflash_config.mask_token


# ---------------------------------------------------------------------------------------------------------------
# Shared building blocks (also used by the EAGLE3 drafter)
# ---------------------------------------------------------------------------------------------------------------


def _get(d: Mapping, key: str, kind: type, default: Any = ..., *, where: str = "config") -> Any:
    """d[key] converted to kind; a clear DrafterConfigError if it is missing (and no default) or invalid."""
    value = d.get(key, None)
    if value is None:
        if default is ...:
            raise DrafterConfigError(f"{where} has no {key!r}")
        return default
    if kind is bool:
        if not isinstance(value, bool):
            raise DrafterConfigError(f"{where}.{key} must be true or false, got {value!r}")
        return value
    if kind is int and (isinstance(value, bool) or not float(value).is_integer()):
        raise DrafterConfigError(f"{where}.{key} must be an integer, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError) as e:
        raise DrafterConfigError(f"{where}.{key} must be {kind.__name__}, got {value!r}") from e


def normalize_rope_scaling(d: Mapping) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from a config dict, v4 (``rope_scaling``) or v5 (``rope_parameters``)."""
    scaling = d.get("rope_scaling")
    params = d.get("rope_parameters")
    theta = d.get("rope_theta")
    if scaling is None and isinstance(params, Mapping):
        scaling = dict(params)
        theta = scaling.pop("rope_theta", theta)
    theta = 10000.0 if theta is None else float(theta)
    if scaling is None:
        return theta, None
    if not isinstance(scaling, Mapping):
        raise DrafterConfigError(f"rope_scaling must be an object or null, got {scaling!r}")
    scaling = dict(scaling)
    scaling.pop("rope_theta", None)
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return theta, None
    if kind not in ("yarn", "deepseek_yarn"):
        raise DrafterConfigError(f"rope_scaling type {kind!r} is not supported (supported: yarn, default)")
    if "factor" not in scaling:
        raise DrafterConfigError("rope_scaling of type yarn needs a 'factor'")
    return theta, scaling


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(rope_scaling: Mapping) -> float:
    """The factor SGLang's ``YaRNScalingRotaryEmbedding`` multiplies cos/sin by (so q.k by its square).

    With ``mscale`` and ``mscale_all_dim`` both present: ``get_mscale(f, mscale) / get_mscale(f, mscale_all_dim)``
    (HF's rule); otherwise the legacy ``get_mscale(f) = 1 + 0.1 ln f``; times ``attn_factor`` (default 1).
    """
    f = float(rope_scaling["factor"])
    m, m_all = rope_scaling.get("mscale"), rope_scaling.get("mscale_all_dim")
    if m is not None and m_all is not None:
        factor = yarn_get_mscale(f, float(m)) / yarn_get_mscale(f, float(m_all))
    else:
        factor = yarn_get_mscale(f)
    return factor * float(rope_scaling.get("attn_factor", 1.0))


def legacy_yarn_attention_factor(rope_scaling: Mapping) -> float:
    """``1 + 0.1 ln f``: the factor DFlash checkpoints were reportedly trained with (1.416 for f = 64)."""
    return yarn_get_mscale(float(rope_scaling["factor"]))


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


class RMSNorm(nn.Module):
    """SGLang's / HF's RMSNorm: normalize in fp32, scale by ``weight``, cast back."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
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


# ---------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's default capture layers (SGLang ``dflash_utils.build_target_layer_ids``): ``round(1 + i (L-4) /
    (n-1))``; the middle layer when n = 1. For L = 61, n = 6: [1, 12, 24, 35, 47, 58]."""
    if num_target_layers <= 0 or num_draft_layers <= 0:
        raise ValueError(f"layer counts must be positive, got {num_target_layers}, {num_draft_layers}")
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end < start:
        raise ValueError(f"DFlash layer selection needs a target with >= 4 layers, got {num_target_layers}")
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DFlashConfig:
    """A DFlash drafter ``config.json`` (z-lab format), parsed once. ``from_dict`` / ``from_pretrained`` raise
    :class:`~.pairing.DrafterConfigError` naming the field on anything missing or invalid.

    Fields as SGLang reads them: ``block_size`` and ``num_target_layers`` from ``dflash_config`` or the top level
    (block_size defaults to 16 like SGLang); ``dflash_config.target_layer_ids`` (None: SGLang picks
    :func:`build_target_layer_ids` for the runtime target); ``dflash_config.mask_token_id``; Qwen3 fields.
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    mask_token_id: int
    block_size: int = DEFAULT_BLOCK_SIZE
    num_target_layers: int | None = None
    target_layer_ids: tuple[int, ...] | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    mask_token: str = DEFAULT_MASK_TOKEN
    architectures: tuple[str, ...] = ("DFlashDraftModel",)
    extra: dict = field(default_factory=dict, compare=False)  # every other config.json field, kept on save

    # -- parsing ---------------------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: Mapping) -> DFlashConfig:
        d = dict(d)
        archs = tuple(d.get("architectures") or ())
        if "DFlashDraftModel" not in archs:
            raise DrafterConfigError(
                f"not a DFlash drafter config: architectures {list(archs)} (expected ['DFlashDraftModel'])"
            )
        dc = d.get("dflash_config") or {}
        if not isinstance(dc, Mapping):
            raise DrafterConfigError(f"dflash_config must be an object, got {dc!r}")
        hidden = _get(d, "hidden_size", int)
        heads = _get(d, "num_attention_heads", int)
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise DrafterConfigError(f"hidden_act {act!r} is not supported (DFlash drafters use silu)")
        if d.get("use_gemma_norm") or dc.get("conv_kernel_size") or dc.get("selector_rank") or dc.get("projector_type"):
            raise DrafterConfigError(
                "this DFlash variant (gemma norm, grouped conv, candidate selector or Domino projector) is not "
                "the z-lab format this module implements"
            )
        layer_types = d.get("layer_types")
        if layer_types is not None and any(t != "full_attention" for t in layer_types):
            raise DrafterConfigError(f"only full_attention layers are supported, got layer_types {layer_types}")
        block = dc.get("block_size", d.get("block_size"))
        block_size = DEFAULT_BLOCK_SIZE if block is None else _get({"block_size": block}, "block_size", int)
        if block_size < 2:
            raise DrafterConfigError(f"block_size must be >= 2, got {block_size}")
        ntl = dc.get("num_target_layers", d.get("num_target_layers"))
        ids = dc.get("target_layer_ids", d.get("target_layer_ids"))
        if ids is not None:
            if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(i, int) for i in ids):
                raise DrafterConfigError(f"dflash_config.target_layer_ids must be a non-empty int list, got {ids!r}")
            ids = tuple(int(i) for i in ids)
        mask_id = dc.get("mask_token_id", d.get("mask_token_id"))
        if mask_id is None:
            raise DrafterConfigError(
                "dflash_config.mask_token_id is missing: the drafter's mask token must be a token id of the target "
                "(Kimi: 163838, [UNK])"
            )
        if isinstance(mask_id, bool) or not isinstance(mask_id, int) or mask_id < 0:
            raise DrafterConfigError(f"dflash_config.mask_token_id must be a non-negative integer, got {mask_id!r}")
        theta, scaling = normalize_rope_scaling(d)
        known = {
            "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "block_size", "num_target_layers", "rms_norm_eps", "rope_theta",
            "rope_scaling", "rope_parameters", "max_position_embeddings", "attention_bias", "architectures",
            "dflash_config", "target_layer_ids", "mask_token_id",
        }  # fmt: skip
        cfg = cls(
            hidden_size=hidden,
            num_hidden_layers=_get(d, "num_hidden_layers", int),
            num_attention_heads=heads,
            num_key_value_heads=_get(d, "num_key_value_heads", int, heads),
            head_dim=_get(d, "head_dim", int, hidden // heads),
            intermediate_size=_get(d, "intermediate_size", int),
            vocab_size=_get(d, "vocab_size", int),
            mask_token_id=int(mask_id),
            block_size=block_size,
            num_target_layers=None if ntl is None else _get({"n": ntl}, "n", int, where="num_target_layers"),
            target_layer_ids=ids,
            rms_norm_eps=_get(d, "rms_norm_eps", float, 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=_get(d, "max_position_embeddings", int, 32768),
            attention_bias=_get(d, "attention_bias", bool, False),
            mask_token=str(dc.get("mask_token", d.get("mask_token", DEFAULT_MASK_TOKEN))),
            architectures=archs,
            extra={k: v for k, v in d.items() if k not in known},
        )
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise DrafterConfigError(
                f"num_attention_heads {cfg.num_attention_heads} is not a multiple of num_key_value_heads "
                f"{cfg.num_key_value_heads}"
            )
        if ids is not None and cfg.num_target_layers is not None and max(ids) >= cfg.num_target_layers:
            raise DrafterConfigError(
                f"dflash_config.target_layer_ids {list(ids)} name layers beyond num_target_layers "
                f"{cfg.num_target_layers}"
            )
        return cfg

    @classmethod
    def from_pretrained(cls, path: str | Path) -> DFlashConfig:
        """Parse ``path/config.json`` (or a config.json path)."""
        return cls.from_dict(load_config_dict(path))

    def to_dict(self) -> dict:
        """The config.json content (z-lab layout: Qwen3 fields, top-level block_size / num_target_layers,
        ``dflash_config{target_layer_ids, mask_token_id}``)."""
        d = dict(self.extra)
        d.setdefault("model_type", "qwen3")
        d.update(
            architectures=list(self.architectures),
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            rms_norm_eps=self.rms_norm_eps,
            hidden_act="silu",
            attention_bias=self.attention_bias,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            rope_scaling=None if self.rope_scaling is None else dict(self.rope_scaling),
            block_size=self.block_size,
        )
        if self.num_target_layers is not None:
            d["num_target_layers"] = self.num_target_layers
        dc: dict[str, Any] = {"mask_token_id": self.mask_token_id}
        if self.target_layer_ids is not None:
            dc["target_layer_ids"] = list(self.target_layer_ids)
        if self.mask_token != DEFAULT_MASK_TOKEN:
            dc["mask_token"] = self.mask_token
        d["dflash_config"] = dc
        return d

    # -- derived ---------------------------------------------------------------------------------------------

    def resolve_target_layer_ids(self, target_num_layers: int | None = None) -> list[int]:
        """The target layers whose outputs form the context: the config's ids, else SGLang's default for the
        runtime target (``num_target_layers`` when no runtime target is given)."""
        if self.target_layer_ids is not None:
            return list(self.target_layer_ids)
        layers = target_num_layers or self.num_target_layers
        if layers is None:
            raise DrafterConfigError("dflash_config.target_layer_ids is absent and no target layer count is known")
        return build_target_layer_ids(layers, self.num_hidden_layers)

    @property
    def num_context_features(self) -> int:
        """K, the number of target layers concatenated per token (fc takes K * hidden_size inputs)."""
        return len(self.target_layer_ids) if self.target_layer_ids is not None else self.num_hidden_layers

    @property
    def rope_attention_factor(self) -> float:
        """What SGLang (and transformers 5) multiply cos/sin by; 1.0 without YaRN."""
        return 1.0 if self.rope_scaling is None else yarn_attention_factor(self.rope_scaling)

    @property
    def legacy_rope_attention_factor(self) -> float | None:
        """``1 + 0.1 ln f`` for a YaRN config (the value z-lab's drafters were trained with); None without YaRN."""
        return None if self.rope_scaling is None else legacy_yarn_attention_factor(self.rope_scaling)

    def rope(self) -> Rope:
        return Rope(
            self.head_dim, self.rope_theta, self.rope_scaling, neox=True, max_position=self.max_position_embeddings
        )

    def summary(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "extra"}


# ---------------------------------------------------------------------------------------------------------------
# Module
# ---------------------------------------------------------------------------------------------------------------


class DFlashAttention(nn.Module):
    """Qwen3 attention whose K/V come from ``[ctx; block]`` and whose Q comes from the block (non-causal)."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(h, self.num_heads * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * hd, h, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.rope = cfg.rope()
        self.scale = hd**-0.5

    def context_kv(self, ctx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """ctx [B, C, H] -> K, V [B, C, Hkv, D]: what SGLang materializes into the draft KV cache once per
        committed token (``kv_proj_only`` + ``apply_k_norm`` + ``apply_k_rope``)."""
        b, c, _ = ctx.shape
        k = self.k_norm(self.k_proj(ctx).view(b, c, self.num_kv_heads, self.head_dim))
        v = self.v_proj(ctx).view(b, c, self.num_kv_heads, self.head_dim)
        return self.rope.apply(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        ctx_kv: tuple[torch.Tensor, torch.Tensor],
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """x [B, S, H] (block rows, input-normed); ctx_kv from :meth:`context_kv`; cos/sin of the block
        positions; mask bool [B, S, C + S] or None (everything visible) -> [B, S, H]."""
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, s, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim)
        q, k = self.rope.apply(q, cos, sin), self.rope.apply(k, cos, sin)
        k = torch.cat([ctx_kv[0], k], dim=1)  # [B, C+S, Hkv, D]: ctx first, then the block
        v = torch.cat([ctx_kv[1], v], dim=1)
        out = masked_attention(q, k, v, mask, self.scale)
        return self.o_proj(out.reshape(b, s, self.num_heads * self.head_dim))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, ctx_kv, cos, sin, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx_kv, cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """The DFlash drafter with the published tensor names; the target's embedding and LM head are attached with
    :meth:`attach_target` (plain tensors, not parameters: they are not part of the checkpoint).

    Main entry points: :meth:`forward` (one non-causal pass, any mask: training), :meth:`draft_block` (the draft
    step of ``reference/algorithms.md`` 1.2) and :meth:`block_drafter` (the ``BlockDrafter`` callable of
    :class:`~.reference.ChainProposer` / :class:`~.reference.DDTreeProposer`).
    """

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.layers = nn.ModuleList(DFlashDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.fc = nn.Linear(config.num_context_features * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.embed_weight: torch.Tensor | None = None  # [V, H], the target's embed_tokens
        self.lm_head_weight: torch.Tensor | None = None  # [V, H], the target's lm_head

    # -- target sharing --------------------------------------------------------------------------------------

    def attach_target(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> DFlashDrafter:
        """Share the target's ``embed_tokens.weight`` and ``lm_head.weight`` (both [vocab, hidden])."""
        for name, w in (("embed_tokens", embed_weight), ("lm_head", lm_head_weight)):
            if tuple(w.shape) != (self.config.vocab_size, self.config.hidden_size):
                raise ValueError(
                    f"target {name} is {tuple(w.shape)}, the drafter needs "
                    f"({self.config.vocab_size}, {self.config.hidden_size})"
                )
        self.embed_weight, self.lm_head_weight = embed_weight.detach(), lm_head_weight.detach()
        return self

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.embed_weight is None:
            raise RuntimeError("call attach_target(embed_weight, lm_head_weight) first")
        return F.embedding(ids, self.embed_weight).to(self.fc.weight.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target LM head over the drafter's normed output: [..., H] -> [..., V] float32."""
        if self.lm_head_weight is None:
            raise RuntimeError("call attach_target(embed_weight, lm_head_weight) first")
        return F.linear(hidden, self.lm_head_weight.to(hidden.dtype)).float()

    # -- forward ---------------------------------------------------------------------------------------------

    def project_context(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[..., K * H] concatenated target layers -> ctx [..., H] = hidden_norm(fc(.))."""
        expected = self.fc.in_features
        if target_hidden.shape[-1] != expected:
            raise ValueError(
                f"target hidden states have {target_hidden.shape[-1]} features, the drafter expects {expected} "
                f"({self.config.num_context_features} layers x {self.config.hidden_size})"
            )
        return self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))

    def forward(
        self,
        noise_embeds: torch.Tensor,
        ctx: torch.Tensor,
        positions: torch.Tensor,
        ctx_positions: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One drafter pass.

        noise_embeds [B, S, H]: embedded block tokens; ctx [B, C, H]: projected context (:meth:`project_context`);
        positions [B, S] / ctx_positions [B, C]: absolute positions; mask bool [B, S, C + S] (query row sees key
        column; ctx columns first) or None for "everything visible" (the inference step).
        Returns the normed hidden states [B, S, H] (feed :meth:`logits`).
        """
        return self.forward_with_context_kv(noise_embeds, self.context_kv(ctx, ctx_positions), positions, mask)

    def context_kv(self, ctx: torch.Tensor, ctx_positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, K/V [B, C, Hkv, D] of projected context rows (the ctx rows are NOT input-normed); a row's
        K/V depends on its own features and position only, so it can be computed once per committed token."""
        cos, sin = self.config.rope().cos_sin(ctx_positions)
        return [layer.self_attn.context_kv(ctx, cos, sin) for layer in self.layers]

    def forward_with_context_kv(
        self,
        noise_embeds: torch.Tensor,
        ctx_kv: list[tuple[torch.Tensor, torch.Tensor]],
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`forward` with the context already materialized per layer (:meth:`context_kv`)."""
        cos, sin = self.config.rope().cos_sin(positions)
        x = noise_embeds
        for layer, kv in zip(self.layers, ctx_kv):
            x = layer(x, kv, cos, sin, mask)
        return self.norm(x)

    @torch.no_grad()
    def draft_block(
        self,
        target_hidden: torch.Tensor,
        root: int | torch.Tensor,
        num_positions: int | None = None,
        *,
        start: int | None = None,
        ctx_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """Per-position draft logits of one block (``reference/algorithms.md`` 1.2).

        target_hidden [C, K * H]: the captured target features of the committed tokens before the root (positions
        0..C-1); root: the last committed token (the bonus), at position ``start`` (default C); the block is
        ``[root, mask x num_positions]`` (num_positions defaults to block_size - 1) and is fully visible to itself
        and to the context. ``ctx_kv``: the context already materialized (:meth:`context_kv` of the C rows), in
        which case target_hidden is not read. Returns logits [num_positions, V] float32: row k-1 drafts the token
        at start + k.
        """
        cfg = self.config
        n = cfg.block_size - 1 if num_positions is None else int(num_positions)
        if not 1 <= n <= cfg.block_size - 1:
            raise ValueError(
                f"num_positions must be in [1, {cfg.block_size - 1}] (block_size {cfg.block_size}), got {n}"
            )
        device = self.fc.weight.device
        if ctx_kv is None:
            c = target_hidden.shape[0]
            ctx = self.project_context(target_hidden.to(device))[None]  # [1, C, H]
            ctx_kv = self.context_kv(ctx, torch.arange(c, device=device)[None])
        c = ctx_kv[0][0].shape[1]
        start = c if start is None else int(start)
        root = torch.as_tensor(root, device=device).reshape(1).long()
        block = torch.cat([root, torch.full((n,), cfg.mask_token_id, dtype=torch.long, device=device)])
        positions = torch.arange(start, start + n + 1, device=device)[None]
        hidden = self.forward_with_context_kv(self.embed(block)[None], ctx_kv, positions)
        return self.logits(hidden[0, 1:])  # [n, V]

    def block_drafter(self) -> Callable[[DraftContext, int], torch.Tensor]:
        """``(DraftContext, L) -> logits [L, V]``: plug into ``ChainProposer(drafter=...)`` or
        ``DDTreeProposer(drafter=...)``; L must be <= block_size - 1 (SGLang: num_draft_tokens = L + 1).

        Like SGLang's draft KV cache, the context K/V of committed tokens is materialized once: rows already
        seen (same features) are reused, only newly committed tokens are projected.
        """
        cache: dict[str, Any] = {"hidden": None, "kv": None}

        @torch.no_grad()
        def drafter(context: DraftContext, length: int) -> torch.Tensor:
            hidden = context.hidden_states
            if hidden is None:
                raise ValueError("DFlash needs the target's captured hidden states (capture target_layer_ids)")
            device = self.fc.weight.device
            old = cache["hidden"]
            keep = 0
            if old is not None and old.shape[0] <= hidden.shape[0] and torch.equal(old, hidden[: old.shape[0]]):
                keep = old.shape[0]
            new_rows = hidden[keep:].to(device)
            new_kv = self.context_kv(self.project_context(new_rows)[None],
                                     torch.arange(keep, hidden.shape[0], device=device)[None])  # fmt: skip
            if keep:
                new_kv = [(torch.cat([k0, k1], dim=1), torch.cat([v0, v1], dim=1))
                          for (k0, v0), (k1, v1) in zip(cache["kv"], new_kv)]  # fmt: skip
            cache.update(hidden=hidden, kv=new_kv)
            logits = self.draft_block(hidden, context.tokens[-1], length, ctx_kv=new_kv)
            return logits.to(context.tokens.device)

        return drafter

    # -- checkpoint ------------------------------------------------------------------------------------------

    def checkpoint_names(self) -> list[str]:
        return sorted(self.state_dict())

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> DFlashDrafter:
        """Load ``config.json`` + ``model.safetensors`` (the z-lab layout; ``model.`` prefixes accepted)."""
        from safetensors.torch import load_file

        path = Path(path)
        model = cls(DFlashConfig.from_pretrained(path))
        sd = {k.removeprefix("model."): v for k, v in load_file(path / "model.safetensors").items()}
        missing, unexpected = set(model.state_dict()) - set(sd), set(sd) - set(model.state_dict())
        if missing or unexpected:
            raise DrafterConfigError(
                f"{path}: checkpoint does not match its config: missing {sorted(missing)}, unexpected "
                f"{sorted(unexpected)}"
            )
        model.load_state_dict(sd)
        return model.to(dtype).eval()

    def save_pretrained(self, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        cfg = self.config.to_dict()
        cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
        (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        sd = {k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()}
        save_file(sd, path / "model.safetensors", metadata={"format": "pt"})


def published_weight_names(config: DFlashConfig) -> list[str]:
    """Tensor names of a z-lab DFlash checkpoint for this config (11 per layer + fc, hidden_norm, norm)."""
    per_layer = [
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
    ]  # fmt: skip
    if config.attention_bias:
        per_layer += [f"self_attn.{p}_proj.bias" for p in "qkvo"]
    names = [f"layers.{i}.{n}" for i in range(config.num_hidden_layers) for n in per_layer]
    return sorted(names + ["fc.weight", "hidden_norm.weight", "norm.weight"])


def context_features(hidden_states: Sequence[torch.Tensor], layer_ids: Sequence[int]) -> torch.Tensor:
    """cat_l HF ``hidden_states[l + 1]`` (the output of decoder layer l) along the last dim."""
    return torch.cat([hidden_states[layer + 1] for layer in layer_ids], dim=-1)
