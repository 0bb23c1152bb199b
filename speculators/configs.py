"""Drafter configs as serving reads them: DFlash (z-lab format) and EAGLE3 (SpecForge / lightseek format, GQA or
MLA attention), parsed once into frozen dataclasses with one clear error per bad field.

The drafter modules (``speculators/reference/``) and SGLang's own loaders read the same files; serving imports only
this module (and ``pairing.py``), never the modules.

DFlash (``DFlashDraftModel``): a stack of Qwen3 decoder layers with non-causal attention that drafts a block of
``block_size`` positions in one pass, fed by the target's hidden states at ``dflash_config.target_layer_ids``;
``dflash_config.mask_token_id`` fills the block after its first token. EAGLE3 (``LlamaForCausalLMEagle3``, or
``Eagle3DeepseekV2ForCausalLM`` with MLA): one decoder layer over the target's aux hidden states
(``eagle_config.eagle_aux_hidden_state_layer_ids``) with a reduced draft vocabulary mapped by ``d2t``.

RoPE scaling (YaRN) is read as SGLang's ``get_rope`` reads it; :func:`yarn_attention_factor` is the factor folded into
cos/sin: ``yarn_get_mscale(f, mscale) / yarn_get_mscale(f, mscale_all_dim)`` when both are given, else the legacy
``1 + 0.1 ln f`` (1.416 for f = 64). Transformers 5 computes the same.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DFLASH = "DFLASH"
EAGLE3 = "EAGLE3"
# DFlash2: the DFlash backbone and a candidate selector over each position's top-k (SGLang's DFlash2DraftModel and
# its aliases)
DFLASH2_ARCHITECTURES = ("DFlash2DraftModel", "DFlash2BeamDraftModel", "MiniMaxDFlash2DraftModel")
DFLASH_ARCHITECTURES = ("DFlashDraftModel", *DFLASH2_ARCHITECTURES)
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")

DEFAULT_BLOCK_SIZE = 16  # SGLang's default when a config has no block_size
DEFAULT_MASK_TOKEN = "<|MASK|>"  # SGLang's default dflash_config.mask_token

GQA, MLA = "gqa", "mla"
ARCHITECTURE_ATTENTION = {"LlamaForCausalLMEagle3": GQA, "Eagle3DeepseekV2ForCausalLM": MLA}
# A LlamaForCausalLMEagle3 config that sets norm_output says which meaning it was trained with (see
# check_norm_output_meaning): "sglang" = the next draft step reads the normed output.
NORM_OUTPUT_MEANING_KEY = "norm_output_meaning"
SGLANG_NORM_OUTPUT = "sglang"


class DrafterConfigError(ValueError):
    """A drafter ``config.json`` that cannot be parsed: a missing or invalid field, an unknown architecture."""


def load_config_dict(source: Any) -> dict:
    """A ``config.json`` as a dict, from a dict, a path (folder or file) or an HF config object (``to_dict()``)."""
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise DrafterConfigError(f"no config.json at {source!s}")
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise DrafterConfigError(f"{path} is not valid JSON: {e}") from e
    to_dict = getattr(source, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise TypeError(f"expected a config dict, a path or an HF config object, got {type(source).__name__}")


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
    # DFlash2: dflash_config.selector_rank / selector_top_k (0 = no candidate selector)
    selector_rank: int = 0
    selector_top_k: int = 0
    extra: dict = field(default_factory=dict, compare=False)  # every other config.json field, kept on save

    # -- parsing ---------------------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: Mapping) -> DFlashConfig:
        d = dict(d)
        archs = tuple(d.get("architectures") or ())
        if not any(a in DFLASH_ARCHITECTURES for a in archs):
            raise DrafterConfigError(
                f"not a DFlash drafter config: architectures {list(archs)} (expected one of "
                f"{list(DFLASH_ARCHITECTURES)})"
            )
        dc = d.get("dflash_config") or {}
        if not isinstance(dc, Mapping):
            raise DrafterConfigError(f"dflash_config must be an object, got {dc!r}")
        hidden = _get(d, "hidden_size", int)
        heads = _get(d, "num_attention_heads", int)
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise DrafterConfigError(f"hidden_act {act!r} is not supported (DFlash drafters use silu)")
        if d.get("use_gemma_norm") or dc.get("conv_kernel_size") or dc.get("projector_type"):
            raise DrafterConfigError(
                "this DFlash variant (gemma norm, grouped conv or Domino projector) is not the z-lab format this "
                "module implements"
            )
        selector_rank = _get({"n": dc.get("selector_rank") or 0}, "n", int, where="dflash_config.selector_rank")
        selector_top_k = _get({"n": dc.get("selector_top_k") or 0}, "n", int, where="dflash_config.selector_top_k")
        if bool(selector_rank) != bool(selector_top_k) or min(selector_rank, selector_top_k) < 0:
            raise DrafterConfigError(
                f"dflash_config.selector_rank {selector_rank} and selector_top_k {selector_top_k}: a candidate "
                "selector needs both, positive"
            )
        dflash2 = any(a in DFLASH2_ARCHITECTURES for a in archs)
        if dflash2 != bool(selector_rank):
            raise DrafterConfigError(
                f"architectures {list(archs)} with dflash_config.selector_rank {selector_rank}: a DFlash2 drafter "
                f"({' / '.join(DFLASH2_ARCHITECTURES)}) has a candidate selector (selector_rank and selector_top_k), "
                "a DFlashDraftModel none"
            )
        layer_types = d.get("layer_types")
        if layer_types is not None and any(t != "full_attention" for t in layer_types):
            raise DrafterConfigError(
                f"only full_attention layers are served, got layer_types {layer_types} (a sliding-window layer would "
                "attend to less context than it was trained with): train the drafter with full-attention layers "
                "(`sglang-kimi drafter config` writes SpecForge draft configs with them)"
            )
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
                "dflash_config.mask_token_id is missing: add the token id the drafter was trained with to its "
                "config.json (Kimi: 163838, [UNK]). SpecForge's `export --to hf` writes back the --draft-config "
                "file, without an id it resolved at training time; `sglang-kimi drafter config` writes draft "
                "configs that carry it"
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
            selector_rank=selector_rank,
            selector_top_k=selector_top_k,
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
        if self.selector_rank:
            dc.update(selector_rank=self.selector_rank, selector_top_k=self.selector_top_k)
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
    def has_selector(self) -> bool:
        """DFlash2: drafts are a walk over each position's top ``selector_top_k`` candidates, scored by a candidate
        selector (unary logits plus a rank-``selector_rank`` score of each edge between consecutive positions)."""
        return self.selector_rank > 0

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

    def summary(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "extra"}


@dataclass(frozen=True)
class Eagle3Config:
    """An EAGLE3 drafter ``config.json``, parsed once (``LlamaForCausalLMEagle3`` or the MLA
    ``Eagle3DeepseekV2ForCausalLM``); errors name the field (:class:`~.pairing.DrafterConfigError`)."""

    architecture: str
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    num_key_value_heads: int = 0  # GQA; 0 = num_attention_heads
    head_dim: int = 0  # GQA; 0 = hidden_size // num_attention_heads
    aux_layer_ids: tuple[int, ...] | None = None  # eagle_config.eagle_aux_hidden_state_layer_ids, as written
    num_aux_hidden_states: int = 3
    target_hidden_size: int = 0  # 0 = hidden_size
    has_target_hidden_size: bool = False
    fc_norm: bool = False  # eagle3.1: per-chunk RMSNorm before fc (also spelled use_aux_norm)
    norm_output: bool = False  # eagle3.1: the next step's h is the normed output
    norm_before_fc: bool = False  # one RMSNorm over the concatenated features before fc
    fc_bias: bool = False  # config "bias"
    lm_head_from_target: bool = False  # draft_vocab_size absent: SGLang loads lm_head from the target
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    # MLA (Eagle3DeepseekV2ForCausalLM)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = True
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def attention(self) -> str:
        return ARCHITECTURE_ATTENTION[self.architecture]

    @property
    def architectures(self) -> tuple[str, ...]:
        return (self.architecture,)

    @classmethod
    def from_dict(cls, d: Mapping) -> Eagle3Config:
        d = dict(d)
        archs = [a for a in (d.get("architectures") or ()) if a in ARCHITECTURE_ATTENTION]
        if not archs:
            raise DrafterConfigError(
                f"not an EAGLE3 drafter config: architectures {d.get('architectures')} (expected one of "
                f"{sorted(ARCHITECTURE_ATTENTION)})"
            )
        arch = archs[0]
        if _get(d, "num_hidden_layers", int, 1) != 1:
            raise DrafterConfigError(
                f"EAGLE3 drafters have one decoder layer, got num_hidden_layers {d['num_hidden_layers']}"
            )
        if d.get("hidden_act", "silu") != "silu":
            raise DrafterConfigError(f"hidden_act {d.get('hidden_act')!r} is not supported (silu)")
        if d.get("tie_word_embeddings"):
            raise DrafterConfigError(
                "tie_word_embeddings is not supported for EAGLE3 drafters (Kimi drafts have a head)"
            )
        ec = d.get("eagle_config") or {}
        if not isinstance(ec, Mapping):
            raise DrafterConfigError(f"eagle_config must be an object, got {ec!r}")
        if ec.get("use_aux_hidden_state", True) is False:
            raise DrafterConfigError("eagle_config.use_aux_hidden_state false (EAGLE-2 style) is not EAGLE3")
        ids = ec.get("eagle_aux_hidden_state_layer_ids", d.get("eagle_aux_hidden_state_layer_ids"))
        if ids is not None:
            if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(i, int) for i in ids):
                raise DrafterConfigError(
                    f"eagle_config.eagle_aux_hidden_state_layer_ids must be a non-empty int list, got {ids!r}"
                )
            ids = tuple(int(i) for i in ids)
        num_aux = d.get("num_aux_hidden_states")
        num_aux = int(num_aux) if num_aux is not None else (len(ids) if ids else 3)
        hidden = _get(d, "hidden_size", int)
        heads = _get(d, "num_attention_heads", int)
        vocab = _get(d, "vocab_size", int)
        draft_vocab = d.get("draft_vocab_size")
        theta, scaling = normalize_rope_scaling(d)
        target_hidden = d.get("target_hidden_size")
        mla: dict[str, Any] = {}
        if arch == "Eagle3DeepseekV2ForCausalLM":
            mla = {
                k: _get(d, k, int)
                for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
            }
            mla["rope_interleave"] = _get(d, "rope_interleave", bool, True)
        known = {
            "architectures", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "draft_vocab_size", "num_hidden_layers", "eagle_config",
            "eagle_aux_hidden_state_layer_ids", "num_aux_hidden_states", "target_hidden_size", "fc_norm",
            "use_aux_norm", "norm_output", "norm_before_fc", "bias", "rms_norm_eps", "rope_theta", "rope_scaling",
            "rope_parameters", "max_position_embeddings", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
            "qk_rope_head_dim", "v_head_dim", "rope_interleave", "hidden_act", "tie_word_embeddings",
            NORM_OUTPUT_MEANING_KEY,
        }  # fmt: skip
        cfg = cls(
            architecture=arch,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=_get(d, "num_key_value_heads", int, heads),
            head_dim=_get(d, "head_dim", int, hidden // heads),
            intermediate_size=_get(d, "intermediate_size", int),
            vocab_size=vocab,
            draft_vocab_size=vocab if draft_vocab is None else _get(d, "draft_vocab_size", int),
            aux_layer_ids=ids,
            num_aux_hidden_states=num_aux,
            target_hidden_size=hidden if target_hidden is None else int(target_hidden),
            has_target_hidden_size=target_hidden is not None,
            fc_norm=bool(d.get("fc_norm") or d.get("use_aux_norm")),
            norm_output=bool(d.get("norm_output", False)),
            # LlamaForCausalLMEagle3 only: SGLang's MLA draft has no input_norm
            norm_before_fc=arch == "LlamaForCausalLMEagle3"
            and bool(ec.get("norm_before_fc", d.get("norm_before_fc", False))),
            fc_bias=bool(d.get("bias", False)),
            lm_head_from_target=draft_vocab is None,
            rms_norm_eps=_get(d, "rms_norm_eps", float, 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=_get(d, "max_position_embeddings", int, 2048),
            extra={k: v for k, v in d.items() if k not in known},
            **mla,
        )
        if cfg.attention == GQA and cfg.num_attention_heads % cfg.num_key_value_heads:
            raise DrafterConfigError(
                f"num_attention_heads {heads} is not a multiple of num_key_value_heads {cfg.num_key_value_heads}"
            )
        if ids is not None and len(ids) != num_aux:
            raise DrafterConfigError(
                f"num_aux_hidden_states {num_aux} disagrees with eagle_aux_hidden_state_layer_ids {list(ids)}"
            )
        check_norm_output_meaning(arch, d)
        return cfg

    @classmethod
    def from_pretrained(cls, path: str | Path) -> Eagle3Config:
        return cls.from_dict(load_config_dict(path))

    def to_dict(self) -> dict:
        """The config.json content in the layout SGLang's loaders read."""
        d = dict(self.extra)
        d.update(
            architectures=[self.architecture],
            hidden_size=self.hidden_size,
            num_hidden_layers=1,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            rms_norm_eps=self.rms_norm_eps,
            hidden_act="silu",
            tie_word_embeddings=False,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            rope_scaling=None if self.rope_scaling is None else dict(self.rope_scaling),
        )
        if self.attention == GQA:
            d.update(num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim)
            d.setdefault("model_type", "llama")
        else:
            d.update(
                num_key_value_heads=self.num_attention_heads,
                q_lora_rank=self.q_lora_rank,
                kv_lora_rank=self.kv_lora_rank,
                qk_nope_head_dim=self.qk_nope_head_dim,
                qk_rope_head_dim=self.qk_rope_head_dim,
                v_head_dim=self.v_head_dim,
                rope_interleave=self.rope_interleave,
            )
            d.setdefault("model_type", "kimi_k2")
        if not self.lm_head_from_target:
            d["draft_vocab_size"] = self.draft_vocab_size
        if self.has_target_hidden_size:
            d["target_hidden_size"] = self.target_hidden_size
        if self.fc_norm:
            d["fc_norm"] = True
        if self.norm_output:
            d["norm_output"] = True
            if self.architecture == "LlamaForCausalLMEagle3":
                d[NORM_OUTPUT_MEANING_KEY] = SGLANG_NORM_OUTPUT
        if self.fc_bias:
            d["bias"] = True
        ec = dict(d.get("eagle_config") or {})
        ec["use_aux_hidden_state"] = True
        if self.aux_layer_ids is not None:
            ec["eagle_aux_hidden_state_layer_ids"] = list(self.aux_layer_ids)
        if self.norm_before_fc:
            ec["norm_before_fc"] = True
        d["eagle_config"] = ec
        return d

    # -- derived ---------------------------------------------------------------------------------------------

    def capture_points(self, target_num_layers: int) -> list[int]:
        """SGLang's ``layers_to_capture`` (capture at the input of layer c) for a target of that depth."""
        ids = self.aux_layer_ids
        if ids is None:
            return [2, target_num_layers // 2, target_num_layers - 3]
        return [i + 1 for i in ids] if ids[0] == 1 else list(ids)

    def resolve_target_layer_ids(self, target_num_layers: int) -> list[int]:
        """The captured features as layer-output ids l (HF ``hidden_states[l + 1]``; -1 = the embeddings)."""
        return [c - 1 for c in self.capture_points(target_num_layers)]


def check_norm_output_meaning(architecture: str, d: Mapping) -> None:
    """Refuses a ``LlamaForCausalLMEagle3`` config that sets ``norm_output`` without saying which meaning it has.

    The key means two things. In SGLang (and here) the drafter's logits always come from its normed output, and
    ``norm_output: true`` makes the next draft step read that normed output instead of the pre-norm one (EAGLE3.1).
    SpecForge's EAGLE3 trainer always feeds the pre-norm output back and reads the key as "norm before the LM
    head": true (its default) is SGLang's default behaviour, false an LM head over the un-normed output, which
    SGLang cannot serve. A SpecForge export with the key set would load and draft worse than it was trained to,
    silently. SpecForge exports only this architecture, so the MLA drafter (``Eagle3DeepseekV2ForCausalLM``) is
    not checked; a config whose ``norm_output_meaning`` is ``"sglang"`` was trained with SGLang's meaning.
    """
    if architecture != "LlamaForCausalLMEagle3" or "norm_output" not in d:
        return
    meaning = d.get(NORM_OUTPUT_MEANING_KEY)
    if meaning == SGLANG_NORM_OUTPUT:
        return
    if meaning is not None:
        raise DrafterConfigError(
            f"{NORM_OUTPUT_MEANING_KEY} {meaning!r} is not understood: the one value is {SGLANG_NORM_OUTPUT!r} (the "
            "next draft step reads the normed output); for a SpecForge-trained drafter remove both keys"
        )
    value = d["norm_output"]
    if value is True:
        specforge = (
            "remove norm_output from config.json: SpecForge trained the LM head on the normed output and fed the "
            "pre-norm output back, which is exactly what SGLang serves without the key"
        )
    else:
        specforge = (
            f"norm_output {json.dumps(value)} there means an LM head over the un-normed output, which SGLang cannot "
            "serve: train it again without norm_output (SpecForge's default norms before the head)"
        )
    raise DrafterConfigError(
        f'norm_output is ambiguous in an EAGLE3 drafter config: SGLang reads it as "the next draft step reads the '
        'normed output" (EAGLE3.1), SpecForge\'s trainer as "norm before the LM head" (it always feeds the pre-norm '
        f"output back), and the drafter would silently draft worse than it was trained to. If SpecForge trained it, "
        f"{specforge}. If it was trained to feed its normed output back, add "
        f'"{NORM_OUTPUT_MEANING_KEY}": "{SGLANG_NORM_OUTPUT}" to config.json'
    )


def drafter_algorithm(draft_config: Any) -> str:
    """``"DFLASH"`` or ``"EAGLE3"`` from a drafter config's ``architectures``."""
    if isinstance(draft_config, DFlashConfig):
        return DFLASH
    if isinstance(draft_config, Eagle3Config):
        return EAGLE3
    archs = list(load_config_dict(draft_config).get("architectures") or [])
    if any(a in DFLASH_ARCHITECTURES for a in archs):
        return DFLASH
    if any(a in EAGLE3_ARCHITECTURES for a in archs):
        return EAGLE3
    raise DrafterConfigError(
        f"unknown drafter architectures {archs}: expected one of {list(DFLASH_ARCHITECTURES)} (DFLASH) or "
        f"{list(EAGLE3_ARCHITECTURES)} (EAGLE3)"
    )


def parse_drafter_config(draft_config: Any) -> DFlashConfig | Eagle3Config:
    """The parsed :class:`~.dflash.DFlashConfig` or :class:`~.eagle3.Eagle3Config` of a drafter config."""
    if isinstance(draft_config, (DFlashConfig, Eagle3Config)):
        return draft_config
    d = load_config_dict(draft_config)
    return DFlashConfig.from_dict(d) if drafter_algorithm(d) == DFLASH else Eagle3Config.from_dict(d)
