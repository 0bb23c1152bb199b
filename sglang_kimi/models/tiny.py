"""The embedded tiny Kimi-K2.6: its paths, vocabulary, config and checkpoint format.

The asset in ``sglang_kimi/assets/tiny-kimi-k2.6/`` is a scaled-down Kimi-K2.6 checkpoint in Kimi's own format:
``KimiK25ForConditionalGeneration`` (model_type ``kimi_k25``) wrapping a DeepSeek-V3 ``text_config`` (MLA,
1 dense + 5 MoE layers, noaux_tc sigmoid routing with ``e_score_correction_bias``, YaRN rope) and a one-block
MoonViT ``vision_config``; weight names are those of the real checkpoint (``language_model.model.layers.*``,
``vision_tower.*``, ``mm_projector.*``). It was trained on GSM8K text by ``scripts/make_tiny_model.py``.

Two ways to run the text model in PyTorch:

- ``CompactDeepseekV3.from_pretrained(TINY_MODEL)`` (:mod:`sglang_kimi.speculators.reference.deepseek_v3`,
  reference code, not imported here): the compact implementation (experts batched, explicit positions / masks / KV
  cache), used for training, feature extraction and the reference decode loop; ``tests/unit/test_tiny_model.py``
  checks its logits against the HF reference.
- ``load_hf_reference`` in ``tests/support/hf_reference.py`` (test code, not in the package): transformers'
  ``DeepseekV3ForCausalLM`` loaded with the same weights: the reference of the SGLang parity tests and the drafter
  tests.

No SGLang is imported here.
"""

from __future__ import annotations

from sglang_kimi.assets import TINY_MODEL  # noqa: F401 (the tiny model's path, read as ``tiny.TINY_MODEL``)

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
    from sglang_kimi.models.kimi_shapes import kimi_k25_config

    return kimi_k25_config(
        dict(TEXT_CONFIG),
        dict(VISION_CONFIG),
        bos=BOS_ID,
        eos=EOS_ID,
        pad=PAD_ID,
        media_placeholder=MEDIA_PLACEHOLDER_ID,
    )


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
