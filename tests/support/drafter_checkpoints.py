"""Drafter checkpoints for the tiny Kimi target, in the formats SGLang loads, written to a folder for a test.

- :func:`write_eagle3`: ``LlamaForCausalLMEagle3`` (SGLang ``srt/models/llama_eagle3.py``): one decoder layer whose
  q/k/v take ``[input_layernorm(embed) ++ hidden_norm(h)]`` (2 x hidden), ``fc`` projecting the concatenated target
  aux hidden states (``eagle_config.eagle_aux_hidden_state_layer_ids``), a final ``norm`` and its own ``lm_head``
  over the full target vocabulary (no ``d2t``: draft ids are target ids). The embedding comes from the target.
- :func:`write_dflash`: ``DFlashDraftModel`` (``srt/models/dflash.py``, z-lab format, parsed by
  ``srt/speculative/dflash_utils.py::parse_dflash_draft_config``): Qwen3-style layers (q/k norm), non-causal over a
  block of ``block_size`` tokens, ``fc`` + ``hidden_norm`` over the target layers ``dflash_config.target_layer_ids``,
  ``mask_token_id`` the tiny vocabulary's ``[UNK]`` (Kimi's DFlash mask token); embedding and lm_head from the target.

``kind="random"`` draws every weight at random (acceptance ~1 token per step: verification is exercised, the
multi-token accept paths barely). ``kind="lens"`` (EAGLE3 only) makes the drafter read the target's hidden state
entering its last layer through the target's own final norm and lm_head, with small random attention and MLP
weights on top: a "logit lens" of the target that agrees with it often, so steps accept several tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sglang_kimi.assets import TINY_MODEL

MASK_TOKEN = "[UNK]"  # sglang_kimi.models.tiny.MASK_TOKEN_ID
MASK_TOKEN_ID = 4094


def target_text_config(target: Path = TINY_MODEL) -> dict:
    return json.loads((Path(target) / "config.json").read_text())["text_config"]


def _target_weight(target: Path, name: str) -> torch.Tensor:
    with safe_open(str(Path(target) / "model.safetensors"), "pt") as f:
        return f.get_tensor("language_model." + name).float()


def _randn(gen: torch.Generator, *shape: int, std: float = 0.02) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * std


def _write(path: Path, config: dict, weights: dict[str, torch.Tensor]) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous().to(torch.bfloat16) for k, v in weights.items()}, str(path / "model.safetensors"))
    return path


def _attention_and_mlp(
    gen, prefix: str, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, q_in: int, std: float
) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}.self_attn.q_proj.weight": _randn(gen, heads * head_dim, q_in, std=std),
        f"{prefix}.self_attn.k_proj.weight": _randn(gen, kv_heads * head_dim, q_in, std=std),
        f"{prefix}.self_attn.v_proj.weight": _randn(gen, kv_heads * head_dim, q_in, std=std),
        f"{prefix}.self_attn.o_proj.weight": _randn(gen, hidden, heads * head_dim, std=std),
        f"{prefix}.mlp.gate_proj.weight": _randn(gen, inter, hidden, std=std),
        f"{prefix}.mlp.up_proj.weight": _randn(gen, inter, hidden, std=std),
        f"{prefix}.mlp.down_proj.weight": _randn(gen, hidden, inter, std=std),
        f"{prefix}.input_layernorm.weight": 1 + _randn(gen, hidden, std=0.1),
        f"{prefix}.post_attention_layernorm.weight": 1 + _randn(gen, hidden, std=0.1),
    }


def write_eagle3(path: Path, *, kind: str = "random", seed: int = 0, target: Path = TINY_MODEL) -> Path:
    """An EAGLE3 drafter for the tiny target (GQA: 4 query heads, 2 KV heads, head_dim 64)."""
    if kind not in ("random", "lens"):
        raise ValueError(f"kind must be 'random' or 'lens', got {kind!r}")
    text = target_text_config(target)
    hidden, vocab = text["hidden_size"], text["vocab_size"]
    heads, kv_heads, head_dim, inter = 4, 2, 64, 512
    # SGLang adds 1 to these ids when the first is 1: the target captures the hidden states entering layers
    # 2, 4 and 5 (the last layer of the 6-layer target).
    aux_layer_ids = [1, 3, 4]
    gen = torch.Generator().manual_seed(seed)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": text["max_position_embeddings"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "draft_vocab_size": vocab,
        "target_hidden_size": hidden,
        "tie_word_embeddings": False,
        "bos_token_id": text["bos_token_id"],
        "eos_token_id": text["eos_token_id"],
        "pad_token_id": text["pad_token_id"],
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_layer_ids, "use_aux_hidden_state": True},
    }
    std = 0.02 if kind == "random" else 0.002
    weights = _attention_and_mlp(gen, "midlayer", hidden, heads, kv_heads, head_dim, inter, 2 * hidden, std)
    weights["midlayer.hidden_norm.weight"] = 1 + _randn(gen, hidden, std=0.1)
    if kind == "random":
        weights["fc.weight"] = _randn(gen, hidden, 3 * hidden, std=0.05)
        weights["norm.weight"] = 1 + _randn(gen, hidden, std=0.1)
        weights["lm_head.weight"] = _randn(gen, vocab, hidden, std=0.05)
    else:
        fc = torch.zeros(hidden, 3 * hidden)
        fc[:, 2 * hidden :] = torch.eye(hidden)  # pass the last aux state (entering the target's last layer)
        weights["fc.weight"] = fc
        weights["norm.weight"] = _target_weight(target, "model.norm.weight")
        weights["lm_head.weight"] = _target_weight(target, "lm_head.weight")
    return _write(path, config, weights)


def write_dflash(
    path: Path, *, seed: int = 0, block_size: int = 4, num_layers: int = 2, target: Path = TINY_MODEL
) -> Path:
    """A random DFlash drafter for the tiny target (Qwen3 layers: 4 query heads, 2 KV heads, head_dim 64)."""
    text = target_text_config(target)
    hidden, vocab = text["hidden_size"], text["vocab_size"]
    heads, kv_heads, head_dim, inter = 4, 2, 64, 512
    target_layer_ids = [1, 3, 4]
    gen = torch.Generator().manual_seed(seed)
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": text["max_position_embeddings"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "block_size": block_size,
        "num_target_layers": text["num_hidden_layers"],
        "dflash_config": {
            "target_layer_ids": target_layer_ids,
            "mask_token": MASK_TOKEN,
            "mask_token_id": MASK_TOKEN_ID,
        },
    }
    weights: dict[str, torch.Tensor] = {}
    for i in range(num_layers):
        prefix = f"layers.{i}"
        weights.update(_attention_and_mlp(gen, prefix, hidden, heads, kv_heads, head_dim, inter, hidden, 0.05))
        weights[f"{prefix}.self_attn.q_norm.weight"] = 1 + _randn(gen, head_dim, std=0.1)
        weights[f"{prefix}.self_attn.k_norm.weight"] = 1 + _randn(gen, head_dim, std=0.1)
    weights["norm.weight"] = 1 + _randn(gen, hidden, std=0.1)
    weights["fc.weight"] = _randn(gen, hidden, len(target_layer_ids) * hidden, std=0.05)
    weights["hidden_norm.weight"] = 1 + _randn(gen, hidden, std=0.1)
    return _write(path, config, weights)
