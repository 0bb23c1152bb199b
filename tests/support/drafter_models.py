"""Shared by the drafter tests: the published config fixtures, scaled-down drafter configs, the embedded tiny
Kimi target run through the reference loop, and the trained drafter assets."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import torch

from support.paths import scripts_importable

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "drafters"
ASSET_BUDGET_BYTES = 3 * 1024 * 1024

scripts_importable()


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.config.json").read_text())


KIMI_TARGET = "moonshotai-Kimi-K2.6"
ZLAB_DFLASH = "z-lab-Kimi-K2.5-DFlash"
EAGLE3_GQA = "lightseekorg-kimi-k2.5-eagle3"
EAGLE3_MLA = "lightseekorg-kimi-k2.5-eagle3-mla"
EAGLE31_MLA = "lightseekorg-kimi-k2.6-eagle3.1-mla"
NVIDIA_EAGLE3 = "nvidia-Kimi-K2.5-Thinking-Eagle3"


def scaled_dflash(vocab: int = 32, hidden: int = 16, **overrides) -> dict:
    """The z-lab Kimi config with the same structure at a size that runs in milliseconds."""
    d = copy.deepcopy(fixture(ZLAB_DFLASH))
    d.update(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
             intermediate_size=2 * hidden, vocab_size=vocab, num_target_layers=4)  # fmt: skip
    d["dflash_config"] = {"target_layer_ids": [0, 1, 2], "mask_token_id": vocab - 2}
    d.update(overrides)
    return d


def scaled_eagle3(name: str = EAGLE3_GQA, vocab: int = 32, hidden: int = 16, draft_vocab: int = 24, **overrides):
    d = copy.deepcopy(fixture(name))
    d.update(hidden_size=hidden, num_attention_heads=4, intermediate_size=2 * hidden, vocab_size=vocab,
             draft_vocab_size=draft_vocab)  # fmt: skip
    if d["architectures"] == ["LlamaForCausalLMEagle3"]:
        d.update(num_key_value_heads=2, head_dim=8)
    else:
        d.update(num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
                 v_head_dim=8, max_position_embeddings=4096)  # fmt: skip
        d["rope_scaling"] = dict(d["rope_scaling"], factor=4.0, original_max_position_embeddings=256)
    d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_aux_hidden_state": True}
    d.update(overrides)
    return d


def randomize(module: torch.nn.Module, seed: int = 0, scale: float = 0.5) -> torch.nn.Module:
    """Random weights (norm weights around 1) so that every path of the module matters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if p.dim() == 1 else scale * noise / p.shape[-1] ** 0.5)
    return module


@functools.lru_cache(maxsize=1)
def tiny_compact(dtype: torch.dtype = torch.float64):
    """The embedded tiny Kimi target (compact implementation), in float64 for exact greedy comparisons."""
    from sglang_kimi.models import tiny
    from sglang_kimi.speculators.reference.deepseek_v3 import CompactDeepseekV3

    return CompactDeepseekV3.from_pretrained(tiny.TINY_MODEL, dtype=dtype)


@functools.lru_cache(maxsize=1)
def gsm8k_test_prompts(n: int = 3) -> list[list[int]]:
    import _drafter_common as common

    return common.gsm8k_prompts("test", n)
