"""The embedded tiny Kimi-K2.6 (sglang_kimi/assets/tiny-kimi-k2.6): format, tokenizer, reference parity, training.

Weight names are checked against what SGLang's KimiK25ForConditionalGeneration expects, derived here from the
config and SGLang's module layout (written out by hand, so this file does not import the SGLang model).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from support.data import gsm8k_items
from support.hf_reference import load_hf_reference

from sglang_kimi.models import tiny
from sglang_kimi.speculators.reference.deepseek_v3 import CompactDeepseekV3

ASSET = tiny.TINY_MODEL


def gsm8k_test(n: int) -> list[dict]:
    return gsm8k_items("test", n)


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads((ASSET / "config.json").read_text())


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ASSET))


@pytest.fixture(scope="module")
def checkpoint() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(ASSET / "model.safetensors")


@pytest.fixture(scope="module")
def compact() -> CompactDeepseekV3:
    return CompactDeepseekV3.from_pretrained(ASSET)


# ----------------------------------------------------------------------------------------------------------------
# format
# ----------------------------------------------------------------------------------------------------------------


def test_config_is_kimi_k26_format(config):
    assert config["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert config["model_type"] == "kimi_k25"
    assert "auto_map" not in config  # no remote code
    t = config["text_config"]
    assert t["architectures"] == ["DeepseekV3ForCausalLM"] and t["model_type"] == "kimi_k2"
    expected = {
        "vocab_size": 4096,
        "hidden_size": 256,
        "num_hidden_layers": 6,
        "first_k_dense_replace": 1,
        "intermediate_size": 512,
        "moe_layer_freq": 1,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "moe_intermediate_size": 128,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.827,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 128,
        "kv_lora_rank": 256,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
        "rope_theta": 50000.0,
        "rope_interleave": True,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "num_nextn_predict_layers": 0,
    }
    assert {k: t.get(k) for k in expected} == expected
    # the latent KV row is a shape SGLang's Triton MLA decode kernel special-cases (Kimi: 512 + 64 = 576)
    assert t["kv_lora_rank"] + t["qk_rope_head_dim"] == 288
    rs = t["rope_scaling"]
    assert rs["type"] == rs["rope_type"] == "yarn"
    assert rs["factor"] * rs["original_max_position_embeddings"] == t["max_position_embeddings"]
    assert (rs["mscale"], rs["mscale_all_dim"], rs["beta_fast"], rs["beta_slow"]) == (1.0, 1.0, 32, 1)
    assert (t["bos_token_id"], t["eos_token_id"], t["pad_token_id"]) == (tiny.BOS_ID, tiny.EOS_ID, tiny.PAD_ID)
    assert config["pad_token_id"] == tiny.PAD_ID
    assert config["media_placeholder_token_id"] == tiny.MEDIA_PLACEHOLDER_ID
    v = config["vision_config"]
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        assert v[k] == v["vt_" + k]  # real K2.6 spelling (vt_*) and SGLang's KimiK25VisionConfig spelling
    assert v["text_hidden_size"] == t["hidden_size"]
    gen = json.loads((ASSET / "generation_config.json").read_text())
    assert set(gen["eos_token_id"]) == {tiny.EOS_ID, tiny.IM_END_ID}


def test_sglang_config_class_parses_it(config):
    """SGLang's own KimiK25Config (used without remote code) builds the text and vision configs we intend."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    # load just sglang/srt/configs/kimi_k25.py (the package __init__ imports every model config: slow)
    path = Path(list(spec.submodule_search_locations)[0]) / "srt" / "configs" / "kimi_k25.py"
    mod_spec = importlib.util.spec_from_file_location("_sglang_kimi_k25_config", path)
    kimi_k25 = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(kimi_k25)
    cfg = kimi_k25.KimiK25Config.from_pretrained(str(ASSET))
    assert cfg.text_config.kv_lora_rank == 256 and cfg.text_config.n_routed_experts == 8
    assert cfg.vision_config.hidden_size == cfg.vision_config.vt_hidden_size == 64
    assert cfg.vision_config.num_hidden_layers == 1
    assert cfg.media_placeholder_token_id == tiny.MEDIA_PLACEHOLDER_ID


def sglang_param_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Parameters of SGLang's KimiK25ForConditionalGeneration (unfused, checkpoint view), from the config."""
    t, v = config["text_config"], config["vision_config"]
    h, nh, v_sz = t["hidden_size"], t["num_attention_heads"], t["vocab_size"]
    qk = t["qk_nope_head_dim"] + t["qk_rope_head_dim"]
    out = {"model.embed_tokens.weight": (v_sz, h), "model.norm.weight": (h,), "lm_head.weight": (v_sz, h)}
    for i in range(t["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_a_proj.weight": (t["q_lora_rank"], h),
            p + "self_attn.q_a_layernorm.weight": (t["q_lora_rank"],),
            p + "self_attn.q_b_proj.weight": (nh * qk, t["q_lora_rank"]),
            p + "self_attn.kv_a_proj_with_mqa.weight": (t["kv_lora_rank"] + t["qk_rope_head_dim"], h),
            p + "self_attn.kv_a_layernorm.weight": (t["kv_lora_rank"],),
            p + "self_attn.kv_b_proj.weight": (nh * (t["qk_nope_head_dim"] + t["v_head_dim"]), t["kv_lora_rank"]),
            p + "self_attn.o_proj.weight": (h, nh * t["v_head_dim"]),
        }
        if i < t["first_k_dense_replace"]:
            mlp = {"gate_proj": t["intermediate_size"], "up_proj": t["intermediate_size"]}
            out |= {p + f"mlp.{n}.weight": (d, h) for n, d in mlp.items()}
            out[p + "mlp.down_proj.weight"] = (h, t["intermediate_size"])
            continue
        e, m = t["n_routed_experts"], t["moe_intermediate_size"]
        out |= {p + "mlp.gate.weight": (e, h), p + "mlp.gate.e_score_correction_bias": (e,)}
        for j in range(e):
            out |= {p + f"mlp.experts.{j}.{n}.weight": (m, h) for n in ("gate_proj", "up_proj")}
            out[p + f"mlp.experts.{j}.down_proj.weight"] = (h, m)
        s = m * t["n_shared_experts"]
        out |= {p + f"mlp.shared_experts.{n}.weight": (s, h) for n in ("gate_proj", "up_proj")}
        out[p + "mlp.shared_experts.down_proj.weight"] = (h, s)
    out = {"language_model." + k: s for k, s in out.items()}
    # MoonViT3dPretrainedModel + K2VLMultiModalProjector parameter names (after SGLang's wqkv/wo/proj renames)
    vh, vi, ps = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    out |= {
        "vision_tower.patch_embed.proj.weight": (vh, 3, ps, ps),
        "vision_tower.patch_embed.proj.bias": (vh,),
        "vision_tower.patch_embed.pos_emb.weight": (v["init_pos_emb_height"], v["init_pos_emb_width"], vh),
        "vision_tower.encoder.final_layernorm.weight": (vh,),
        "vision_tower.encoder.final_layernorm.bias": (vh,),
    }
    for i in range(v["num_hidden_layers"]):
        p = f"vision_tower.encoder.blocks.{i}."
        for n, shape in {
            "norm0": (vh,),
            "norm1": (vh,),
            "attn.qkv_proj": (3 * vh, vh),
            "attn.proj": (vh, vh),
            "mlp.fc0": (vi, vh),
            "mlp.fc1": (vh, vi),
        }.items():
            out |= {p + n + ".weight": shape, p + n + ".bias": (shape[0],)}
    merged = v["vt_hidden_size"] * math.prod(v["merge_kernel_size"])
    out |= {
        "mm_projector.pre_norm.weight": (v["vt_hidden_size"],),
        "mm_projector.pre_norm.bias": (v["vt_hidden_size"],),
        "mm_projector.linear_1.weight": (merged, merged),
        "mm_projector.linear_1.bias": (merged,),
        "mm_projector.linear_2.weight": (v["text_hidden_size"], merged),
        "mm_projector.linear_2.bias": (v["text_hidden_size"],),
    }
    return out


def sglang_rename(name: str) -> str:
    """KimiK25ForConditionalGeneration.load_weights' renames for vision weights."""
    if "vision_tower" in name or "mm_projector" in name:
        return (
            name.replace("wqkv.", "attn.qkv_proj.")
            .replace("wo.", "attn.proj.")
            .replace("mm_projector.proj.0", "mm_projector.linear_1")
            .replace("mm_projector.proj.2", "mm_projector.linear_2")
        )
    return name


def test_weights_use_real_checkpoint_names_and_cover_sglang(config, checkpoint):
    got = {sglang_rename(k): tuple(v.shape) for k, v in checkpoint.items()}
    want = sglang_param_shapes(config)
    assert set(got) == set(want), f"missing {set(want) - set(got)}; unexpected {set(got) - set(want)}"
    assert got == want
    assert all(
        k.startswith(("language_model.model.", "language_model.lm_head.", "vision_tower.", "mm_projector."))
        for k in checkpoint
    )
    for k, v in checkpoint.items():
        assert v.dtype == (torch.float32 if k.endswith("e_score_correction_bias") else torch.bfloat16), k


def test_asset_size_under_budget():
    size = sum(f.stat().st_size for f in ASSET.rglob("*") if f.is_file())
    assert size < 20e6, f"tiny model assets are {size / 1e6:.2f} MB"


# ----------------------------------------------------------------------------------------------------------------
# tokenizer
# ----------------------------------------------------------------------------------------------------------------


def test_tokenizer_vocab_and_special_ids(tokenizer):
    assert len(tokenizer) == tiny.VOCAB_SIZE == 4096
    ids = tokenizer.convert_tokens_to_ids
    assert ids("[BOS]") == tokenizer.bos_token_id == tiny.BOS_ID == 3840
    assert ids("[EOS]") == tokenizer.eos_token_id == tiny.EOS_ID == 3841
    assert ids("<|im_end|>") == tiny.IM_END_ID
    assert ids("<|im_user|>") == 3843 and ids("<|im_assistant|>") == 3844
    assert ids("<|im_system|>") == 3850 and ids("<|im_middle|>") == 3857
    assert ids("<|media_pad|>") == tiny.MEDIA_PLACEHOLDER_ID
    assert ids("[UNK]") == tokenizer.unk_token_id == tiny.MASK_TOKEN_ID == 4094
    assert ids("[PAD]") == tokenizer.pad_token_id == tiny.PAD_ID == 4095
    assert max(tokenizer.get_vocab().values()) == 4095
    assert tokenizer("Question:", add_special_tokens=True)["input_ids"][0] != tiny.BOS_ID  # no implicit BOS


def test_tokenizer_round_trips_gsm8k(tokenizer):
    for r in gsm8k_test(20):
        text = f"Question: {r['question']}\nAnswer: {r['answer']}\n\n"
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert max(ids) < tiny.NUM_BPE_TOKENS
        assert tokenizer.decode(ids) == text
    # digits are split one by one
    assert len(tokenizer.encode("12345", add_special_tokens=False)) == 5


def test_chat_template_renders_kimi_style(tokenizer):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
        "<|im_user|>user<|im_middle|>What is 2+3?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>"
    )
    ids = tokenizer.apply_chat_template(msgs[1:], tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids[0] == 3843 and ids[-1] == 3857


# ----------------------------------------------------------------------------------------------------------------
# HF reference and the compact implementation
# ----------------------------------------------------------------------------------------------------------------


def test_hf_reference_matches_compact_model(compact):
    hf, tok = load_hf_reference()
    assert type(hf).__name__ == "DeepseekV3ForCausalLM" and len(tok) == 4096
    torch.manual_seed(0)
    ids = torch.randint(0, tiny.VOCAB_SIZE, (2, 96))
    with torch.no_grad():
        ref = hf(ids).logits
        got = compact(ids)
    assert ref.dtype == got.dtype == torch.float32
    err = (ref - got).abs().max().item()
    assert err < 1e-4 * max(1.0, ref.abs().max().item()), err
    # real GSM8K text too (routing on in-distribution hidden states)
    text = "Question: Tom has 3 boxes with 12 pens each. How many pens?\nAnswer: 3*12=<<3*12=36>>36\n#### 36"
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, compact(ids), atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_cached_and_masked_forward_equal_the_causal_forward(compact, tokenizer):
    """The forward's other paths (a KV cache: prefill then one token; explicit positions and a left-padding mask)
    compute what the plain causal call does.

    Equal up to float32 rounding, not bit for bit: the prefill, the cached step and the full recompute multiply
    matrices of different row counts, and an explicit mask takes torch's math attention kernel instead of the fused
    causal one, so sums run in other orders (measured: logits within 2.7e-5 of |logit| <= 21, ~14 ulps; hidden
    states within 5e-5 of |h| <= 330, ~2 ulps). Hiding one key from a row moves its logits by far more (2.8 for the
    previous token).
    """
    text = "Question: Tom has 3 boxes with 12 pens each. How many pens?\nAnswer: 3*12=<<3*12=36>>36\n#### 36"
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])  # [1, n]
    n = ids.shape[1]
    full, hidden = compact(ids, output_hidden_states=True)  # [1, n, V], L + 1 x [1, n, H]

    cache = compact.new_cache()
    prefill, hidden_pre = compact(ids[:, :-1], cache=cache, output_hidden_states=True)
    step, hidden_step = compact(ids[:, -1:], cache=cache, output_hidden_states=True)  # position n-1, sees all n
    assert cache.length == n and cache.keys[0].shape[1] >= n
    assert (torch.cat([prefill, step], 1) - full).abs().max() < 1e-4
    for h, a, b in zip(hidden, hidden_pre, hidden_step):
        assert (torch.cat([a, b], 1) - h).abs().max() < 2e-4
    cache.crop(n - 1)  # forget the last token: running it again gives the same row
    assert torch.equal(compact(ids[:, -1:], cache=cache), step)

    # left padding (3 pad tokens that no real row sees) with explicit positions and mask
    pad = 3
    padded = torch.cat([torch.full((1, pad), tiny.PAD_ID), ids], 1)  # [1, pad + n]
    valid = torch.arange(pad + n) >= pad
    mask = torch.ones(pad + n, pad + n, dtype=torch.bool).tril() & valid | torch.eye(pad + n, dtype=torch.bool)
    positions = (torch.arange(pad + n) - pad).clamp(min=0)
    got = compact(padded, positions[None], mask[None])[:, pad:]
    assert (got - full).abs().max() < 1e-4
    mask[-1, -2] = False  # the last row no longer sees the token before it
    assert (compact(padded, positions[None], mask[None])[0, -1] - full[0, -1]).abs().max() > 0.1


def test_routing_bias_is_learned_and_selects_experts(compact):
    """noaux_tc: the correction bias changes which experts are picked (never their weights)."""
    torch.manual_seed(0)
    moes = compact.moe_layers()
    biases = torch.stack([m.e_score_correction_bias for m in moes])
    assert biases.dtype == torch.float32 and biases.abs().max() > 0.05
    _, hidden = compact(torch.randint(0, tiny.NUM_BPE_TOKENS, (1, 128)), output_hidden_states=True)
    changed = 0
    for i, layer in enumerate(compact.layers):
        if layer.mlp not in moes:
            continue
        cos_sin = compact.cos_sin(torch.arange(128), torch.float32)
        x = layer.post_attention_layernorm(hidden[i] + layer.self_attn(layer.input_layernorm(hidden[i]), *cos_sin))
        x = x.view(-1, x.shape[-1])
        w, idx = layer.mlp.route(x)
        saved = layer.mlp.e_score_correction_bias.clone()
        layer.mlp.e_score_correction_bias.zero_()
        w0, idx0 = layer.mlp.route(x)
        layer.mlp.e_score_correction_bias.copy_(saved)
        changed += (idx.sort(-1)[0] != idx0.sort(-1)[0]).any(-1).sum().item()
        # weights come from the unbiased sigmoid scores, normalised and scaled
        assert torch.allclose(w.sum(-1), torch.full_like(w[:, 0], 2.827), atol=1e-5)
    assert changed > 0


# ----------------------------------------------------------------------------------------------------------------
# it is trained
# ----------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_model_is_trained_on_gsm8k(compact, tokenizer):
    rows = gsm8k_test(8)
    tot, n = 0.0, 0
    for r in rows:
        p = tokenizer.encode(f"Question: {r['question']}\nAnswer:", add_special_tokens=False)
        a = tokenizer.encode(" " + r["answer"], add_special_tokens=False)
        logits = compact(torch.tensor([p + a]))[0, len(p) - 1 : -1]
        tot += torch.nn.functional.cross_entropy(logits, torch.tensor(a), reduction="sum").item()
        n += len(a)
    nll = tot / n
    assert nll < 2.5 < math.log(4096), f"mean answer NLL {nll:.3f} nats/token"

    out = tokenizer.encode(f"Question: {rows[0]['question']}\nAnswer:", add_special_tokens=False)
    start = len(out)
    for _ in range(64):
        nxt = int(compact(torch.tensor([out]))[0, -1].argmax())
        out.append(nxt)
        if nxt in (tiny.EOS_ID, tiny.IM_END_ID):
            break
    text = tokenizer.decode(out[start:])
    assert any(c.isdigit() for c in text) and ("=" in text or "<<" in text), text
