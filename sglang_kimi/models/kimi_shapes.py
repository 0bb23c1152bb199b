"""Kimi-K2.6 at its real shapes: the architecture, one tensor-parallel rank's share of it, proportionally shrunk
variants, the drafters' published shapes per rank, the per-rank shape a cost table is measured for, and the number of
distinct experts a forward of ``T`` tokens reads.

A *rank-shaped* model is a checkpoint config that one device serves at ``--tp 1`` and whose every tensor has the
shape of one rank's share of Kimi-K2.6 served at ``--tp N``: MLA with the rank's ``64 / N`` heads (``q_a_proj`` and
``kv_a_proj_with_mqa`` are replicated on every rank, as SGLang keeps them), the dense layer's intermediate ``18432 /
N``, and the MoE either tensor-parallel (``moe="tp"``: all 384 experts, each ``2048 / N`` wide, top-8, the shared
expert ``2048 / N`` wide) or expert-parallel (``moe="ep"``: the rank's ``384 / N`` whole experts, top-``8 / N``, so
that a token sends the rank as many expert rows on average as under EP, and the shared expert whole, as SGLang keeps it
under an all-to-all MoE backend). The vocabulary stays whole (163840): the drafter's mask token (163838) and Kimi's
special ids must exist, so the LM head is ``N`` times a rank's vocabulary shard (``docs/kimi-scale.md`` says what
that changes and how the projection corrects it). ``layers`` sets the depth (the first layer dense); ``scale``
divides every width (hidden, ranks, head dims, intermediates, expert count) for a CPU-sized variant of the same code.

Served with ``--load-format dummy`` (random weights; the drafters load the same way), acceptance is meaningless and
the cost is real. ``scripts/make_rank_shaped.py`` writes the folders.

Only the standard library is imported: the adaptive profile (serving) reads :func:`rank_signature`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

SOURCE = "moonshotai/Kimi-K2.6"

# Kimi-K2.6's text model (the published text_config's shape fields; moonshotai/Kimi-K2.6, config.json).
KIMI_K26_TEXT: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "kimi_k2",
    "vocab_size": 163840,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 0,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_shared_experts": 1,
    "n_routed_experts": 384,
    "ep_size": 1,
    "routed_scaling_factor": 2.827,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc",
    "n_group": 1,
    "topk_group": 1,
    "num_experts_per_tok": 8,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "hidden_act": "silu",
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "type": "yarn",
        "rope_type": "yarn",
        "factor": 64.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "rope_interleave": True,
    "attention_bias": False,
    "bos_token_id": 163584,
    "eos_token_id": 163585,
    "pad_token_id": 163839,
    "torch_dtype": "bfloat16",
}
BOS_ID, EOS_ID, IM_END_ID, MEDIA_PLACEHOLDER_ID, MASK_TOKEN_ID, PAD_ID = 163584, 163585, 163586, 163605, 163838, 163839

# z-lab/Kimi-K2.5-DFlash: 6 Qwen3 layers drafting blocks of 8 from target layers [1, 12, 24, 35, 47, 58], sharing
# the target's embedding and LM head (speculators/configs.py reads this format).
KIMI_K25_DFLASH: dict[str, Any] = {
    "hidden_size": 7168,
    "num_hidden_layers": 6,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 18432,
    "block_size": 8,
    "target_layer_ids": (1, 12, 24, 35, 47, 58),
    "mask_token_id": MASK_TOKEN_ID,
}

# lightseekorg/kimi-k2.6-eagle3 (eagle3.1, MLA attention): one decoder layer over target layers [1, 29, 57], a
# full-vocabulary head, per-chunk fc norms and a normed output.
KIMI_K26_EAGLE3: dict[str, Any] = {
    "hidden_size": 7168,
    "intermediate_size": 12288,
    "num_attention_heads": 64,
    "aux_layer_ids": (1, 29, 57),
    "draft_vocab_size": 163840,
}

MOE_TP, MOE_EP = "tp", "ep"
MOE_MODES = (MOE_TP, MOE_EP)

# widths a scaled-down variant rounds to (multiples keep SGLang's kernels on their usual tile sizes)
WIDTH_MULTIPLE = {"hidden": 32, "lora": 16, "head": 16, "intermediate": 16}


class RankShapeError(ValueError):
    """A rank shape that cannot be built: the message names the setting and the fix."""


@dataclass(frozen=True)
class RankShape:
    """One rank of Kimi-K2.6 at ``tp``-way tensor parallelism (MoE split as ``moe``), ``layers`` deep, every width
    divided by ``scale``."""

    tp: int = 8
    moe: str = MOE_TP
    layers: int = 61
    scale: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "layers", "scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise RankShapeError(f"{name} must be an integer, got {value!r}")
        if self.layers < 1:
            raise RankShapeError(f"layers must be at least 1 (the dense first layer), got {self.layers}")
        if self.scale < 1:
            raise RankShapeError(f"scale must be at least 1 (1 = Kimi-K2.6's own widths), got {self.scale}")
        if self.tp < 1:
            raise RankShapeError(f"tp must be at least 1, got {self.tp}")
        if self.moe not in MOE_MODES:
            raise RankShapeError(f"moe must be one of {list(MOE_MODES)} (tensor- or expert-parallel), got {self.moe!r}")
        t = KIMI_K26_TEXT
        problems = []
        if t["num_attention_heads"] % self.tp:
            problems.append(f"{t['num_attention_heads']} attention heads")
        if t["intermediate_size"] % self.tp:
            problems.append(f"the dense intermediate {t['intermediate_size']}")
        if self.moe == MOE_TP and t["moe_intermediate_size"] % self.tp:
            problems.append(f"the expert intermediate {t['moe_intermediate_size']} (--moe tp)")
        if self.moe == MOE_EP and t["n_routed_experts"] % self.tp:
            problems.append(f"{t['n_routed_experts']} routed experts (--moe ep)")
        if self.moe == MOE_EP and t["num_experts_per_tok"] % self.tp:
            problems.append(f"the top-{t['num_experts_per_tok']} routing (--moe ep: a rank's share of a token)")
        if KIMI_K25_DFLASH["num_attention_heads"] % self.tp:
            problems.append(f"the DFlash drafter's {KIMI_K25_DFLASH['num_attention_heads']} heads")
        if problems:
            raise RankShapeError(
                f"TP {self.tp} does not divide {', '.join(problems)} of Kimi-K2.6: use a TP size that divides "
                f"them (a power of two, up to {8 if self.moe == MOE_EP else 64} with --moe {self.moe})"
            )

    def width(self, value: int, kind: str) -> int:
        """``value / scale`` rounded to the kind's multiple (at least one multiple); ``value`` when scale is 1."""
        if self.scale == 1:
            return int(value)
        m = WIDTH_MULTIPLE[kind]
        return max(m, m * round(value / self.scale / m))

    def as_dict(self) -> dict:
        return asdict(self)


def spread_layer_ids(published: Sequence[int], layers: int, first: int = 0) -> list[int]:
    """Capture layers for a ``layers``-deep target, from ids published for Kimi-K2.6's 61 layers: each id moved in
    proportion into ``first .. layers - 2`` (SGLang cannot capture the output of the last layer), the published ids
    themselves at 61 layers. When that repeats a layer (a shallow target), as many distinct layers as were published
    spread evenly over the range instead, or every layer of the range when it holds fewer."""
    last = KIMI_K26_TEXT["num_hidden_layers"] - 2
    top = layers - 2
    if top < first:
        raise RankShapeError(
            f"a drafter reads target layers {first} and up: the target needs at least {first + 2} layers, got {layers}"
        )
    ids = [min(top, max(first, round(i * top / last))) for i in published]
    if len(set(ids)) == len(ids):
        return ids
    n = min(len(published), top - first + 1)
    return [first + round(i * (top - first) / (n - 1)) for i in range(n)] if n > 1 else [first]


def rank_text_config(shape: RankShape) -> dict:
    """The rank's ``text_config`` (DeepSeek-V3 format, as Kimi-K2.6's)."""
    t = dict(KIMI_K26_TEXT)
    t["rope_scaling"] = dict(t["rope_scaling"])
    tp, s = shape.tp, shape
    heads = t["num_attention_heads"] // tp
    experts, top_k, moe_inter = t["n_routed_experts"], t["num_experts_per_tok"], t["moe_intermediate_size"]
    if shape.moe == MOE_TP:
        moe_inter //= tp
    else:  # the rank's whole experts, and its share of a token's routed rows
        experts //= tp
        top_k //= tp
    if shape.scale > 1:  # fewer experts, the share a token routes to kept
        scaled = max(2, round(experts / shape.scale))
        top_k = max(1, round(top_k * scaled / experts))
        experts = scaled
    t.update(
        hidden_size=s.width(t["hidden_size"], "hidden"),
        intermediate_size=s.width(t["intermediate_size"] // tp, "intermediate"),
        moe_intermediate_size=s.width(moe_inter, "intermediate"),
        num_hidden_layers=shape.layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        n_routed_experts=experts,
        num_experts_per_tok=top_k,
        q_lora_rank=s.width(t["q_lora_rank"], "lora"),
        kv_lora_rank=s.width(t["kv_lora_rank"], "lora"),
        qk_rope_head_dim=s.width(t["qk_rope_head_dim"], "head"),
        qk_nope_head_dim=s.width(t["qk_nope_head_dim"], "head"),
        v_head_dim=s.width(t["v_head_dim"], "head"),
        first_k_dense_replace=min(t["first_k_dense_replace"], shape.layers),
    )
    return t


# MoonViT, abridged: never built (text-only serving), present because the wrapper's config carries one. Both
# spellings of the tower's dims are written, as SGLang's KimiK25VisionConfig reads the unprefixed ones.
_VISION = {"patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64, "init_pos_emb_time": 4,
           "pos_emb_type": "divided_fixed", "vt_num_attention_heads": 16, "vt_num_hidden_layers": 27,
           "vt_hidden_size": 1152, "vt_intermediate_size": 4304, "num_attention_heads": 16, "num_hidden_layers": 27,
           "hidden_size": 1152, "intermediate_size": 4304, "merge_kernel_size": [2, 2],
           "video_attn_type": "spatial_temporal", "merge_type": "sd2_tpool", "mm_projector_type": "patchmerger",
           "mm_hidden_size": 1152, "projector_hidden_act": "gelu", "projector_ln_eps": 1e-5}  # fmt: skip


def kimi_k25_config(text: dict, vision: dict, *, bos: int, eos: int, pad: int, media_placeholder: int) -> dict:
    """A ``config.json`` in Kimi-K2.5/K2.6's own format: the ``KimiK25ForConditionalGeneration`` wrapper around a
    DeepSeek-V3 ``text_config`` and a MoonViT ``vision_config`` (no auto_map: no remote code)."""
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "ignore_index": -100,
        "media_placeholder_token_id": media_placeholder,
        "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "text_config": text,
        "vision_config": vision,
    }


def rank_target_config(shape: RankShape) -> dict:
    """The target's ``config.json``: Kimi-K2.6's wrapper (``KimiK25ForConditionalGeneration``) around the rank's
    text config, with ``rank_shape`` recording what it stands for (read by :func:`rank_signature`)."""
    text = rank_text_config(shape)
    vision = dict(_VISION, text_hidden_size=text["hidden_size"])
    config = kimi_k25_config(text, vision, bos=BOS_ID, eos=EOS_ID, pad=PAD_ID, media_placeholder=MEDIA_PLACEHOLDER_ID)
    return dict(config, rank_shape=dict(shape.as_dict(), source=SOURCE))


@dataclass(frozen=True)
class StepMode:
    """A speculative mode at a fixed width, as the step-cost tables name it: ``ar``, ``chain-K`` (K drafts),
    ``tree-N`` (a DDTree of budget N) or ``eagle3-S`` (S EAGLE3 steps)."""

    name: str
    family: str  # ar, chain, tree, eagle3
    width: int  # drafts per step (chain, eagle3), tree budget (tree), 0 (ar)

    @property
    def window(self) -> int:
        """Tokens per request in the target's forward of a step."""
        return self.width + 1


def parse_step_mode(name: str) -> StepMode:
    """Raises ValueError naming the accepted spellings."""
    if name == "ar":
        return StepMode("ar", "ar", 0)
    family, _, width = name.partition("-")
    if family not in ("chain", "tree", "eagle3") or not width.isdigit() or int(width) < 1:
        raise ValueError(
            f"mode {name!r}: use ar, chain-K (K drafts), tree-N (budget N) or eagle3-S (S steps), K, N, S >= 1"
        )
    return StepMode(name, family, int(width))


def rank_dflash_config(shape: RankShape) -> dict:
    """The DFlash drafter's ``config.json`` (z-lab format): Kimi-K2.5-DFlash's layers with the rank's heads and
    intermediate, capturing the target layers :func:`spread_layer_ids` gives for ``shape.layers``."""
    d, text = KIMI_K25_DFLASH, rank_text_config(shape)
    rope = dict(KIMI_K26_TEXT["rope_scaling"])
    rope.pop("type")
    ids = spread_layer_ids(d["target_layer_ids"], shape.layers)
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_act": "silu",
        "hidden_size": text["hidden_size"],
        "num_hidden_layers": d["num_hidden_layers"],
        "num_attention_heads": d["num_attention_heads"] // shape.tp,
        "num_key_value_heads": max(1, d["num_key_value_heads"] // shape.tp),
        "head_dim": shape.width(d["head_dim"], "head"),
        "intermediate_size": shape.width(d["intermediate_size"] // shape.tp, "intermediate"),
        "vocab_size": text["vocab_size"],
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "max_position_embeddings": text["max_position_embeddings"],
        "rope_theta": text["rope_theta"],
        "rope_scaling": rope,
        "block_size": d["block_size"],
        "num_target_layers": shape.layers,
        "dflash_config": {"mask_token_id": d["mask_token_id"], "target_layer_ids": ids},
        "torch_dtype": "bfloat16",
    }


def rank_eagle3_config(shape: RankShape) -> dict:
    """The EAGLE3 drafter's ``config.json`` (``Eagle3DeepseekV2ForCausalLM``, Kimi-K2.6 EAGLE3's MLA layer): the
    rank's heads and intermediate, the target's MLA ranks, aux layers from :func:`spread_layer_ids`."""
    e, text = KIMI_K26_EAGLE3, rank_text_config(shape)
    # ids starting at 1, which SGLang reads as layer outputs (captured at the next layer's input)
    if shape.layers < len(e["aux_layer_ids"]) + 2:
        raise RankShapeError(
            f"an EAGLE3 drafter reads {len(e['aux_layer_ids'])} distinct target layers from layer 1 on: the target "
            f"needs at least {len(e['aux_layer_ids']) + 2} layers, got {shape.layers}"
        )
    ids = spread_layer_ids(e["aux_layer_ids"], shape.layers, first=1)
    rope = dict(KIMI_K26_TEXT["rope_scaling"])
    return {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": text["hidden_size"],
        "intermediate_size": shape.width(e["intermediate_size"] // shape.tp, "intermediate"),
        "num_hidden_layers": 1,
        "num_attention_heads": e["num_attention_heads"] // shape.tp,
        "num_key_value_heads": e["num_attention_heads"] // shape.tp,
        **{k: text[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")},
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "vocab_size": text["vocab_size"],
        "draft_vocab_size": e["draft_vocab_size"],
        "torch_dtype": "bfloat16",
        "rope_theta": text["rope_theta"],
        "rope_scaling": rope,
        "max_position_embeddings": text["max_position_embeddings"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        "fc_norm": True,
        "norm_output": True,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }


# ---------------------------------------------------------------------------------------------------------------
# The per-rank shape a step cost belongs to
# ---------------------------------------------------------------------------------------------------------------


def text_config_of(config: Mapping) -> Mapping:
    """The text model's config: ``text_config`` of a Kimi wrapper, else the config itself."""
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def represented_tp(config: Mapping, tp: int = 1) -> int:
    """The TP size a served model stands for: a rank-shaped model's recorded ``rank_shape.tp`` times the TP it is
    served at (1 for a plain checkpoint's)."""
    meta = config.get("rank_shape")
    return int(tp) * (int(meta.get("tp", 1)) if isinstance(meta, Mapping) else 1)


def rank_signature(config: Mapping, tp: int = 1, ep: int = 1, shared_replicated: bool = False) -> dict:
    """What one rank holds and computes per token when ``config`` is served at ``--tp tp --ep-size ep``: the shapes
    a step's cost depends on. A rank-shaped model served at TP 1 and Kimi-K2.6 served at the TP it stands for give
    the same signature (the depth, the vocabulary and the shared expert aside, which differ when they differ).
    ``shared_replicated``: the shared expert is whole on every rank (SGLang's all-to-all MoE backends)."""
    t = text_config_of(config)
    tp, ep = int(tp), int(ep)
    if tp < 1 or ep < 1 or tp % ep:
        raise ValueError(f"tp {tp} and ep {ep}: both must be >= 1 and ep must divide tp")
    moe_tp = tp // ep
    heads = int(t["num_attention_heads"])
    experts, top_k = int(t.get("n_routed_experts") or 0), int(t.get("num_experts_per_tok") or 0)
    moe_inter = int(t.get("moe_intermediate_size") or 0)
    shared = moe_inter * int(t.get("n_shared_experts") or 0)
    held = experts // ep
    return {
        "hidden_size": int(t["hidden_size"]),
        "num_hidden_layers": int(t["num_hidden_layers"]),
        "first_k_dense_replace": int(t.get("first_k_dense_replace") or 0),
        "attention_heads": heads // tp,
        "q_lora_rank": int(t.get("q_lora_rank") or 0),
        "kv_lora_rank": int(t.get("kv_lora_rank") or 0),
        "qk_nope_head_dim": int(t.get("qk_nope_head_dim") or 0),
        "qk_rope_head_dim": int(t.get("qk_rope_head_dim") or 0),
        "v_head_dim": int(t.get("v_head_dim") or 0),
        "dense_intermediate": int(t["intermediate_size"]) // tp,
        "routed_experts": held,
        "routed_per_token": round(top_k * held / experts, 6) if experts else 0.0,
        "moe_intermediate": moe_inter // moe_tp,
        "shared_intermediate": shared if shared_replicated else shared // tp,
        "vocab_size": int(t["vocab_size"]) // tp,
    }


def expected_distinct_experts(experts: int, top_k: float, tokens: float) -> float:
    """The expected number of distinct experts ``tokens`` tokens route to, each choosing ``top_k`` of ``experts``
    uniformly at random: an expert is missed by one token with probability ``1 - top_k / experts``, by all of them
    with that to the power ``tokens``, so ``E[distinct] = experts * (1 - (1 - top_k / experts) ** tokens)``."""
    if experts <= 0 or tokens <= 0:
        return 0.0
    p = min(1.0, top_k / experts)
    return experts * (1.0 - math.pow(1.0 - p, tokens))
