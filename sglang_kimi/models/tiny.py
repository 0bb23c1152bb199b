"""The embedded tiny Kimi-K2.6: its config, its checkpoint format, a compact model and the HF reference.

The asset in ``sglang_kimi/assets/tiny-kimi-k2.6/`` is a scaled-down Kimi-K2.6 checkpoint in Kimi's own format:
``KimiK25ForConditionalGeneration`` (model_type ``kimi_k25``) wrapping a DeepSeek-V3 ``text_config`` (MLA,
1 dense + 5 MoE layers, noaux_tc sigmoid routing with ``e_score_correction_bias``, YaRN rope) and a one-block
MoonViT ``vision_config``; weight names are those of the real checkpoint (``language_model.model.layers.*``,
``vision_tower.*``, ``mm_projector.*``). It was trained on GSM8K text by ``scripts/make_tiny_model.py``.

Two ways to run the text model in PyTorch:

- :class:`TinyKimiLM`: a compact implementation (batched over experts), used for training and fast feature
  extraction; ``tests/unit/test_tiny_model.py`` checks its logits against the HF reference.
- :func:`load_hf_reference`: transformers' ``DeepseekV3ForCausalLM`` loaded with the same weights: the
  reference for SGLang parity tests and drafter training.

Only torch (and transformers / safetensors inside the loaders) is imported: no SGLang.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

TINY_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "tiny-kimi-k2.6"
TEXT_PREFIX = "language_model."  # real-checkpoint prefix of every text weight

# Vocabulary: byte-level BPE ids 0..3839, then 256 specials laid out like Kimi's (163584 + offset).
VOCAB_SIZE = 4096
NUM_BPE_TOKENS = 3840
BOS_ID = 3840  # [BOS]            (Kimi 163584)
EOS_ID = 3841  # [EOS]            (Kimi 163585)
IM_END_ID = 3842  # <|im_end|>     (Kimi 163586): ends every chat turn
MEDIA_PLACEHOLDER_ID = 3861  # <|media_pad|> (Kimi 163605)
UNK_ID = 4094  # [UNK]            (Kimi 163838): the DFlash mask token
MASK_TOKEN_ID = UNK_ID
PAD_ID = 4095  # [PAD]            (Kimi 163839)

# Named specials by offset from NUM_BPE_TOKENS; every other slot is <|reserved_token_{offset}|>.
SPECIAL_TOKENS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>",
    17: "<|im_middle|>",
    18: "<|media_begin|>",
    19: "<|media_content|>",
    20: "<|media_end|>",
    21: "<|media_pad|>",
    22: "<think>",
    23: "</think>",
    254: "[UNK]",
    255: "[PAD]",
}


def special_token_list() -> list[str]:
    """The 256 special tokens in id order (ids NUM_BPE_TOKENS..VOCAB_SIZE-1)."""
    n = VOCAB_SIZE - NUM_BPE_TOKENS
    return [SPECIAL_TOKENS.get(i, f"<|reserved_token_{i}|>") for i in range(n)]


# DeepSeek-V3 text config (Kimi-K2.6's structure, scaled down). kv_lora_rank + qk_rope_head_dim = 288 is a shape
# SGLang's Triton MLA decode kernel special-cases (like Kimi's 512 + 64 = 576).
TEXT_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "kimi_k2",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_nextn_predict_layers": 0,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "ep_size": 1,
    "routed_scaling_factor": 2.827,
    "kv_lora_rank": 256,
    "q_lora_rank": 128,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "qk_nope_head_dim": 64,
    "topk_method": "noaux_tc",
    "n_group": 1,
    "topk_group": 1,
    "num_experts_per_tok": 2,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "use_cache": True,
    "pad_token_id": PAD_ID,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pretraining_tp": 1,
    "tie_word_embeddings": False,
    "rope_theta": 50000.0,
    # SGLang's CPU rope (get_rope_cpu) requires a YaRN block; same structure as Kimi's (factor 64, orig 4096).
    "rope_scaling": {
        "type": "yarn",
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "rope_interleave": True,  # False crashes SGLang's CPU decode
    "attention_bias": False,
    "attention_dropout": 0.0,
    "torch_dtype": "bfloat16",
}

# MoonViT + patch-merger projector, one tiny block. The real K2.6 config spells the tower dims vt_*;
# SGLang's KimiK25VisionConfig (used when no remote code is loaded) reads the unprefixed names for the tower
# and vt_hidden_size for the projector, so both spellings are written.
VISION_CONFIG = {
    "patch_size": 14,
    "init_pos_emb_height": 16,
    "init_pos_emb_width": 16,
    "init_pos_emb_time": 4,
    "pos_emb_type": "divided_fixed",
    "vt_num_attention_heads": 2,
    "vt_num_hidden_layers": 1,
    "vt_hidden_size": 64,
    "vt_intermediate_size": 128,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "merge_kernel_size": [2, 2],
    "video_attn_type": "spatial_temporal",
    "merge_type": "sd2_tpool",
    "mm_projector_type": "patchmerger",
    "mm_hidden_size": 64,
    "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-5,
    "text_hidden_size": 256,
}


def kimi_config() -> dict:
    """The top-level config.json, in Kimi-K2.6's format (no auto_map: no remote code)."""
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "ignore_index": -100,
        "media_placeholder_token_id": MEDIA_PLACEHOLDER_ID,
        "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "text_config": dict(TEXT_CONFIG),
        "vision_config": dict(VISION_CONFIG),
    }


def checkpoint_weight_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor name (as in the real Kimi-K2.6 checkpoint) and its shape, derived from a config.json dict."""
    t, v = config["text_config"], config["vision_config"]
    hid, nh = t["hidden_size"], t["num_attention_heads"]
    qk = t["qk_nope_head_dim"] + t["qk_rope_head_dim"]
    shapes: dict[str, tuple[int, ...]] = {
        "language_model.model.embed_tokens.weight": (t["vocab_size"], hid),
        "language_model.model.norm.weight": (hid,),
        "language_model.lm_head.weight": (t["vocab_size"], hid),
    }
    for i in range(t["num_hidden_layers"]):
        p = f"language_model.model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (hid,),
                p + "post_attention_layernorm.weight": (hid,),
                p + "self_attn.q_a_proj.weight": (t["q_lora_rank"], hid),
                p + "self_attn.q_a_layernorm.weight": (t["q_lora_rank"],),
                p + "self_attn.q_b_proj.weight": (nh * qk, t["q_lora_rank"]),
                p + "self_attn.kv_a_proj_with_mqa.weight": (t["kv_lora_rank"] + t["qk_rope_head_dim"], hid),
                p + "self_attn.kv_a_layernorm.weight": (t["kv_lora_rank"],),
                p + "self_attn.kv_b_proj.weight": (nh * (t["qk_nope_head_dim"] + t["v_head_dim"]), t["kv_lora_rank"]),
                p + "self_attn.o_proj.weight": (hid, nh * t["v_head_dim"]),
            }
        )
        is_moe = i >= t["first_k_dense_replace"] and i % t["moe_layer_freq"] == 0
        if not is_moe:
            inter = t["intermediate_size"]
            for n in ("gate_proj", "up_proj"):
                shapes[p + f"mlp.{n}.weight"] = (inter, hid)
            shapes[p + "mlp.down_proj.weight"] = (hid, inter)
            continue
        e, inter = t["n_routed_experts"], t["moe_intermediate_size"]
        shapes[p + "mlp.gate.weight"] = (e, hid)
        shapes[p + "mlp.gate.e_score_correction_bias"] = (e,)
        for j in range(e):
            shapes[p + f"mlp.experts.{j}.gate_proj.weight"] = (inter, hid)
            shapes[p + f"mlp.experts.{j}.up_proj.weight"] = (inter, hid)
            shapes[p + f"mlp.experts.{j}.down_proj.weight"] = (hid, inter)
        sh = inter * t["n_shared_experts"]
        shapes[p + "mlp.shared_experts.gate_proj.weight"] = (sh, hid)
        shapes[p + "mlp.shared_experts.up_proj.weight"] = (sh, hid)
        shapes[p + "mlp.shared_experts.down_proj.weight"] = (hid, sh)

    vh, vi, ps = v["vt_hidden_size"], v["vt_intermediate_size"], v["patch_size"]
    shapes.update(
        {
            "vision_tower.patch_embed.proj.weight": (vh, 3, ps, ps),
            "vision_tower.patch_embed.proj.bias": (vh,),
            "vision_tower.patch_embed.pos_emb.weight": (v["init_pos_emb_height"], v["init_pos_emb_width"], vh),
            "vision_tower.encoder.final_layernorm.weight": (vh,),
            "vision_tower.encoder.final_layernorm.bias": (vh,),
        }
    )
    for i in range(v["vt_num_hidden_layers"]):
        p = f"vision_tower.encoder.blocks.{i}."
        for n, shape in {
            "norm0": (vh,),
            "norm1": (vh,),
            "wqkv": (3 * vh, vh),
            "wo": (vh, vh),
            "mlp.fc0": (vi, vh),
            "mlp.fc1": (vh, vi),
        }.items():
            shapes[p + n + ".weight"] = shape
            shapes[p + n + ".bias"] = (shape[0],)
    mh, mw = v["merge_kernel_size"]
    merged = vh * mh * mw
    shapes.update(
        {
            "mm_projector.pre_norm.weight": (vh,),
            "mm_projector.pre_norm.bias": (vh,),
            "mm_projector.proj.0.weight": (merged, merged),
            "mm_projector.proj.0.bias": (merged,),
            "mm_projector.proj.2.weight": (v["text_hidden_size"], merged),
            "mm_projector.proj.2.bias": (v["text_hidden_size"],),
        }
    )
    return shapes


# ---------------------------------------------------------------------------------------------------------------
# Compact DeepSeek-V3 text model (same math as transformers' DeepseekV3ForCausalLM, experts batched)
# ---------------------------------------------------------------------------------------------------------------


def yarn_inv_freq(t: dict) -> tuple[torch.Tensor, float, float]:
    """YaRN (DeepSeek variant) for the rope dims: (inv_freq [rope/2], cos/sin scale, softmax-scale multiplier)."""
    rs = t["rope_scaling"]
    dim, base = t["qk_rope_head_dim"], float(t["rope_theta"])
    factor, orig = float(rs["factor"]), rs["original_max_position_embeddings"]

    def mscale(scale: float, m: float) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    def corr_dim(rot: float) -> float:
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(corr_dim(rs.get("beta_fast", 32))), 0)
    high = min(math.ceil(corr_dim(rs.get("beta_slow", 1))), dim - 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 0.001)).clamp(0, 1)
    extrapolate = 1 - ramp  # 1 = keep the original frequency (high-frequency dims)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    m, m_all = float(rs.get("mscale", 1)), float(rs.get("mscale_all_dim", 0))
    cos_scale = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor, 1.0)
    softmax_mult = mscale(factor, m_all) ** 2 if m_all else 1.0
    return inv_freq, cos_scale, softmax_mult


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class MLA(nn.Module):
    """Multi-head latent attention, non-absorbed (training) form; rope dims interleaved as in DeepSeek."""

    def __init__(self, t: dict):
        super().__init__()
        hid, self.nh = t["hidden_size"], t["num_attention_heads"]
        self.nope, self.rope, self.vdim = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
        self.kv_lora = t["kv_lora_rank"]
        self.q_a_proj = nn.Linear(hid, t["q_lora_rank"], bias=False)
        self.q_a_layernorm = RMSNorm(t["q_lora_rank"], 1e-6)
        self.q_b_proj = nn.Linear(t["q_lora_rank"], self.nh * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hid, self.kv_lora + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, 1e-6)
        self.kv_b_proj = nn.Linear(self.kv_lora, self.nh * (self.nope + self.vdim), bias=False)
        self.o_proj = nn.Linear(self.nh * self.vdim, hid, bias=False)
        _, _, softmax_mult = yarn_inv_freq(t)
        self.scale = (self.nope + self.rope) ** -0.5 * softmax_mult

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # interleaved pairs (x0, x1), (x2, x3) ... rotated by one frequency each; output de-interleaved
        # [evens' | odds'] exactly like HF (q and k get the same permutation, so q.k is unchanged).
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape  # cos/sin: [s, rope/2]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, s, self.nh, -1).transpose(1, 2)
        q_nope, q_rot = q.split([self.nope, self.rope], dim=-1)  # [b, h, s, *]
        kv_nope, k_rot = self.kv_a_proj_with_mqa(x).split([self.kv_lora, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(kv_nope)).view(b, s, self.nh, -1).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.vdim], dim=-1)
        q_rot = self.rotate(q_rot, cos, sin)
        k_rot = self.rotate(k_rot.unsqueeze(1), cos, sin).expand(b, self.nh, s, self.rope)
        q = torch.cat([q_nope, q_rot], dim=-1)
        k = torch.cat([k_nope, k_rot], dim=-1)
        # v padded to the q/k head dim selects torch's fused CPU attention kernel (~2.5x faster than the math path)
        pad = q.shape[-1] - self.vdim
        o = F.scaled_dot_product_attention(q, k, F.pad(v, (0, pad)), is_causal=True, scale=self.scale)
        o = o[..., : self.vdim]
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.nh * self.vdim))


class DenseMLP(nn.Module):
    def __init__(self, hid: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hid, inter, bias=False)
        self.up_proj = nn.Linear(hid, inter, bias=False)
        self.down_proj = nn.Linear(inter, hid, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """DeepSeek-V3 MoE: noaux_tc sigmoid routing (bias picks experts, never weights them) + shared expert."""

    def __init__(self, t: dict):
        super().__init__()
        hid, inter, e = t["hidden_size"], t["moe_intermediate_size"], t["n_routed_experts"]
        self.top_k, self.n_group, self.topk_group = t["num_experts_per_tok"], t["n_group"], t["topk_group"]
        self.norm_topk_prob, self.scaling = t["norm_topk_prob"], t["routed_scaling_factor"]
        self.gate_weight = nn.Parameter(torch.zeros(e, hid))  # checkpoint: mlp.gate.weight
        self.register_buffer("e_score_correction_bias", torch.zeros(e))  # checkpoint: mlp.gate.e_score_...
        self.w_gate = nn.Parameter(torch.zeros(e, inter, hid))  # experts.E.gate_proj.weight
        self.w_up = nn.Parameter(torch.zeros(e, inter, hid))  # experts.E.up_proj.weight
        self.w_down = nn.Parameter(torch.zeros(e, hid, inter))  # experts.E.down_proj.weight
        self.shared_experts = DenseMLP(hid, inter * t["n_shared_experts"])
        self.last_load: torch.Tensor | None = None  # tokens per expert in the last forward (for bias updates)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, hid] -> (topk_weights [n, k] fp32, topk_idx [n, k])."""
        scores = F.linear(x.float(), self.gate_weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias
        n, e = choice.shape
        if self.n_group > 1:
            grouped = choice.view(n, self.n_group, e // self.n_group)
            group_scores = grouped.topk(2, dim=-1)[0].sum(-1)
            keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(self.topk_group, dim=-1)[1], 1)
            choice = choice.masked_fill(~keep.bool().repeat_interleave(e // self.n_group, dim=1), float("-inf"))
        idx = choice.topk(self.top_k, dim=-1)[1]
        w = scores.gather(1, idx)
        if self.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return w * self.scaling, idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        w, idx = self.route(x)
        out = torch.zeros_like(x)
        flat = idx.flatten()  # [n*k]: token t's j-th expert at t*k+j
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.w_gate.shape[0])
        self.last_load = counts.detach()
        tok = order // self.top_k
        wt = w.flatten()[order].to(x.dtype)
        start = 0
        for e, c in enumerate(counts.tolist()):
            if c == 0:
                continue
            t_e = tok[start : start + c]
            h = x[t_e]
            h = F.silu(F.linear(h, self.w_gate[e])) * F.linear(h, self.w_up[e])
            out.index_add_(0, t_e, F.linear(h, self.w_down[e]) * wt[start : start + c, None])
            start += c
        return (out + self.shared_experts(x)).view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, t: dict, i: int):
        super().__init__()
        self.input_layernorm = RMSNorm(t["hidden_size"], t["rms_norm_eps"])
        self.self_attn = MLA(t)
        self.post_attention_layernorm = RMSNorm(t["hidden_size"], t["rms_norm_eps"])
        is_moe = i >= t["first_k_dense_replace"] and i % t["moe_layer_freq"] == 0
        self.mlp = MoE(t) if is_moe else DenseMLP(t["hidden_size"], t["intermediate_size"])

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyKimiLM(nn.Module):
    """Compact DeepSeek-V3 causal LM over the tiny Kimi text config (no KV cache: training / scoring)."""

    def __init__(self, text_config: dict | None = None):
        super().__init__()
        t = dict(text_config or TEXT_CONFIG)
        self.config = t
        self.embed_tokens = nn.Embedding(t["vocab_size"], t["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(t, i) for i in range(t["num_hidden_layers"]))
        self.norm = RMSNorm(t["hidden_size"], t["rms_norm_eps"])
        self.lm_head = nn.Linear(t["hidden_size"], t["vocab_size"], bias=False)
        inv_freq, cos_scale, _ = yarn_inv_freq(t)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.cos_scale = cos_scale

    def rope(self, seq_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.arange(seq_len, dtype=torch.float32, device=self.inv_freq.device)[:, None] * self.inv_freq
        return (freqs.cos() * self.cos_scale).to(dtype), (freqs.sin() * self.cos_scale).to(dtype)

    def forward(self, input_ids: torch.Tensor, output_hidden_states: bool = False):
        """input_ids [b, s] -> logits [b, s, vocab] (and, if asked, the residual stream after each layer)."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rope(input_ids.shape[1], x.dtype)
        hidden = [x]
        for layer in self.layers:
            x = layer(x, cos, sin)
            hidden.append(x)
        logits = self.lm_head(self.norm(x))
        return (logits, hidden) if output_hidden_states else logits

    def moe_layers(self) -> list[MoE]:
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, MoE)]

    # -- checkpoint format -----------------------------------------------------------------------------------

    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        """Text weights under the real Kimi-K2.6 names (``language_model.``...), one tensor per expert."""
        out: dict[str, torch.Tensor] = {}
        for name, t in self.state_dict().items():
            if name.startswith("lm_head."):
                out[TEXT_PREFIX + name] = t
                continue
            if ".mlp.gate_weight" in name:
                out[TEXT_PREFIX + "model." + name.replace("mlp.gate_weight", "mlp.gate.weight")] = t
            elif ".mlp.e_score_correction_bias" in name:
                out[TEXT_PREFIX + "model." + name.replace("mlp.e_score", "mlp.gate.e_score")] = t
            elif ".mlp.w_" in name:
                prefix, kind = name.split(".mlp.w_")
                for e in range(t.shape[0]):
                    out[TEXT_PREFIX + f"model.{prefix}.mlp.experts.{e}.{kind}_proj.weight"] = t[e]
            else:
                out[TEXT_PREFIX + "model." + name] = t
        return out

    def load_checkpoint_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        own: dict[str, torch.Tensor] = {}
        experts: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
        for name, t in sd.items():
            if not name.startswith(TEXT_PREFIX):
                continue
            name = name[len(TEXT_PREFIX) :]
            name = name[len("model.") :] if name.startswith("model.") else name
            if ".mlp.experts." in name:
                prefix, rest = name.split(".mlp.experts.")
                e, kind = rest.split(".")[:2]
                experts.setdefault((prefix, kind.replace("_proj", "")), {})[int(e)] = t
                continue
            own[name.replace("mlp.gate.weight", "mlp.gate_weight").replace("mlp.gate.e_score", "mlp.e_score")] = t
        for (prefix, kind), per in experts.items():
            own[f"{prefix}.mlp.w_{kind}"] = torch.stack([per[e] for e in range(len(per))])
        self.load_state_dict(own, strict=True)

    @classmethod
    def from_pretrained(cls, path: str | Path = TINY_MODEL_DIR, dtype: torch.dtype = torch.float32) -> "TinyKimiLM":
        from safetensors.torch import load_file

        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        model = cls(cfg["text_config"])
        sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(path / "model.safetensors").items()}
        model.load_checkpoint_state_dict(sd)
        # the correction bias stays fp32 (as in the real checkpoint and HF's _keep_in_fp32_modules_strict)
        for moe in model.moe_layers():
            moe.e_score_correction_bias = moe.e_score_correction_bias.float()
        return model.to(dtype).eval() if dtype != torch.float32 else model.eval()


# ---------------------------------------------------------------------------------------------------------------
# HF reference
# ---------------------------------------------------------------------------------------------------------------


def hf_text_config(path: str | Path = TINY_MODEL_DIR):
    """transformers' DeepseekV3Config for the text model (rope_scaling becomes rope_parameters in v5)."""
    from transformers import DeepseekV3Config

    t = dict(json.loads((Path(path) / "config.json").read_text())["text_config"])
    t.pop("model_type", None)
    t.pop("torch_dtype", None)
    return DeepseekV3Config(**t)


def load_hf_reference(path: str | Path = TINY_MODEL_DIR, dtype: torch.dtype = torch.float32):
    """(transformers ``DeepseekV3ForCausalLM``, ``PreTrainedTokenizerFast``) with the tiny model's text weights.

    Weights are read from the Kimi-format checkpoint (``language_model.`` prefix stripped) and the per-expert
    tensors are fused into transformers' 3-D ``experts.gate_up_proj`` [E, 2I, H] / ``experts.down_proj``
    [E, H, I]. Stored bf16 weights are upcast to ``dtype``; ``e_score_correction_bias`` stays fp32.
    Experts run through transformers' eager loop so fp32 results are exact and deterministic.
    """
    from safetensors.torch import load_file
    from transformers import DeepseekV3ForCausalLM, PreTrainedTokenizerFast

    path = Path(path)
    config = hf_text_config(path)
    config._experts_implementation = "eager"
    config._attn_implementation = "eager"
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(config)
    sd: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, t in load_file(path / "model.safetensors").items():
        if not name.startswith(TEXT_PREFIX):
            continue
        name = name[len(TEXT_PREFIX) :]
        t = t.float() if name.endswith("e_score_correction_bias") else t.to(dtype)
        if ".mlp.experts." in name:
            prefix, rest = name.split(".mlp.experts.")
            e, kind = rest.split(".")[:2]
            experts.setdefault(prefix, {}).setdefault(kind, {})[int(e)] = t
        else:
            sd[name] = t
    for prefix, kinds in experts.items():
        n = len(kinds["gate_proj"])
        sd[f"{prefix}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([kinds["gate_proj"][e], kinds["up_proj"][e]], dim=0) for e in range(n)]
        )
        sd[f"{prefix}.mlp.experts.down_proj"] = torch.stack([kinds["down_proj"][e] for e in range(n)])
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    if missing or unexpected:
        raise RuntimeError(f"tiny checkpoint does not match DeepseekV3ForCausalLM: {missing=} {unexpected=}")
    # non-persistent buffers (rope inv_freq) were created on meta: rebuild them on CPU
    rotary = type(model.model.rotary_emb)(config=config)
    model.model.rotary_emb = rotary
    model = model.to(dtype)
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None:
            gate.e_score_correction_bias = gate.e_score_correction_bias.float()
    model.eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    return model, tokenizer
