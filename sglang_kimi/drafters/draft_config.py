"""``sglang-kimi drafter config``: SpecForge's draft-model config for a target, carrying every field the plugin checks
when it serves the trained drafter, so an export of it loads without edits.

SpecForge resolves a DFlash drafter's mask token at training time into its in-memory config only, and its
``export --to hf`` writes the ``--draft-config`` file back: a mask id absent from that file is absent from the export,
which the plugin then refuses. The config written here names the mask token (Kimi's ``[UNK]``, 163838; else the
tokenizer's mask or unknown token), the target layers the drafter reads (SGLang's default spread), the target's depth
(``num_target_layers``), full-attention layers only (the plugin serves no sliding-window DFlash layer) and the target
itself (``target_model_name_or_path``, which the plugin's pairing check reads).

Kimi-K2.x targets get the published Kimi-K2.5 drafters' geometry (``models/kimi_shapes.py``); other targets a
geometry scaled from their hidden size.
"""

from __future__ import annotations

import json
from pathlib import Path

from sglang_kimi.models.kimi_shapes import KIMI_K25_DFLASH, KIMI_K26_EAGLE3, KIMI_K26_TEXT, MASK_TOKEN_ID
from sglang_kimi.speculators.configs import build_target_layer_ids

MASK_TOKENS = ("<|mask|>", "[MASK]", "<mask>", "[UNK]", "<unk>")  # in order of preference


class DraftConfigError(ValueError):
    """A target the config cannot be written for; the message names the fix."""


def target_text_config(target: Path) -> dict:
    path = Path(target).expanduser() / "config.json"
    if not path.is_file():
        raise DraftConfigError(f"{target} has no config.json: give --target the target checkpoint's folder")
    config = json.loads(path.read_text())
    return dict(config.get("text_config") or config)  # Kimi's multimodal wrapper holds the text model there


def is_kimi(text: dict) -> bool:
    return (
        text.get("vocab_size") == KIMI_K26_TEXT["vocab_size"]
        and text.get("hidden_size") == KIMI_K26_TEXT["hidden_size"]
    )


def _token_ids(target: Path) -> dict[str, int]:
    """Special tokens' ids from the tokenizer's files (``tokenizer.json``'s added tokens, ``tokenizer_config.json``'s
    ``added_tokens_decoder``)."""
    ids: dict[str, int] = {}
    tokenizer = target / "tokenizer.json"
    if tokenizer.is_file():
        for token in json.loads(tokenizer.read_text()).get("added_tokens") or []:
            ids[token["content"]] = int(token["id"])
    config = target / "tokenizer_config.json"
    if config.is_file():
        for token_id, token in (json.loads(config.read_text()).get("added_tokens_decoder") or {}).items():
            ids.setdefault(token.get("content"), int(token_id))
    return ids


def mask_token_id(target: Path, text: dict, given: int | None = None) -> int:
    vocab = int(text["vocab_size"])
    if given is not None:
        if not 0 <= given < vocab:
            raise DraftConfigError(f"--mask-token-id {given} is outside the target's vocabulary (0..{vocab - 1})")
        return given
    ids = _token_ids(Path(target).expanduser())
    for token in MASK_TOKENS:
        if token in ids and ids[token] < vocab:
            return ids[token]
    if is_kimi(text):
        return MASK_TOKEN_ID
    raise DraftConfigError(
        f"{target}'s tokenizer names none of {', '.join(MASK_TOKENS)}: pass --mask-token-id, a token id the target "
        "never needs to draft (an unused special token)"
    )


def _geometry(hidden: int, kimi: dict) -> tuple[int, int, int, int]:
    """(heads, kv heads, head dim, intermediate) of a draft layer for a target of this hidden size."""
    head_dim = 128 if hidden >= 2048 else 64
    heads = max(1, hidden // head_dim)
    intermediate = round(hidden * kimi["intermediate_size"] / kimi["hidden_size"] / 16) * 16
    return heads, max(1, heads // 8), head_dim, intermediate


def dflash_config(target: Path, *, draft_layers: int | None = None, block_size: int | None = None,
                  mask_id: int | None = None, target_name: str | None = None) -> dict:  # fmt: skip
    text = target_text_config(target)
    layers, hidden = int(text["num_hidden_layers"]), int(text["hidden_size"])
    kimi = is_kimi(text)
    # a small target: no more draft layers than distinct layers to read (1 .. L-3)
    n = draft_layers or (KIMI_K25_DFLASH["num_hidden_layers"] if kimi else min(5, max(1, layers - 3)))
    if kimi:
        k = KIMI_K25_DFLASH
        heads, kv, head_dim, intermediate = (k["num_attention_heads"], k["num_key_value_heads"], k["head_dim"],
                                              k["intermediate_size"])  # fmt: skip
    else:
        heads, kv, head_dim, intermediate = _geometry(hidden, KIMI_K25_DFLASH)
    try:
        ids = build_target_layer_ids(layers, n)
    except ValueError as e:
        raise DraftConfigError(f"{target}: {e}") from None
    config = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "block_size": block_size or KIMI_K25_DFLASH["block_size"],
        "dflash_config": {"mask_token_id": mask_token_id(target, text, mask_id), "target_layer_ids": ids},
        "num_target_layers": layers,
        "target_model_name_or_path": target_name or _path_name(target),
        "hidden_size": hidden,
        "num_hidden_layers": n,
        "layer_types": ["full_attention"] * n,
        "use_sliding_window": False,
        "sliding_window": None,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": intermediate,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "vocab_size": int(text["vocab_size"]),
        "max_position_embeddings": int(text.get("max_position_embeddings", 4096)),
        "rms_norm_eps": 1e-6,
        "rope_theta": text.get("rope_theta", 10000.0),
        "rope_scaling": _rope(text),
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }
    for key in ("bos_token_id", "eos_token_id"):
        if key in text:
            config[key] = text[key]
    return config


def _path_name(target: Path) -> str:
    return str(Path(target).expanduser().resolve())


def _rope(text: dict) -> dict | None:
    rope = text.get("rope_scaling")
    if not isinstance(rope, dict):
        return None
    rope = dict(rope)
    rope.pop("type", None)  # transformers' Qwen3 reads rope_type
    return rope


def eagle3_config(target: Path, *, target_name: str | None = None, draft_vocab_size: int | None = None) -> dict:
    """SpecForge's EAGLE3 config (``LlamaForCausalLMEagle3``, one layer) reading SGLang's default capture layers.
    ``norm_output`` is left out on purpose: SpecForge reads it as "norm before the LM head" (its default), SGLang and
    the plugin as "feed the normed state back"."""
    text = target_text_config(target)
    layers, hidden, vocab = int(text["num_hidden_layers"]), int(text["hidden_size"]), int(text["vocab_size"])
    if layers < 5:
        raise DraftConfigError(f"{target}: an EAGLE3 drafter reads three distinct layers of a target of >= 5 layers")
    heads, kv, head_dim, _ = _geometry(hidden, KIMI_K25_DFLASH)
    if is_kimi(text):
        intermediate = KIMI_K26_EAGLE3["intermediate_size"]
    else:
        intermediate = round(hidden * KIMI_K26_EAGLE3["intermediate_size"] / KIMI_K26_EAGLE3["hidden_size"] / 16) * 16
    aux = [1, layers // 2 - 1, layers - 4]  # layer outputs: SGLang captures at the inputs 2, L/2, L-3
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
        "target_model_name_or_path": target_name or _path_name(target),
        "hidden_size": hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": intermediate,
        "hidden_act": "silu",
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab_size or vocab,
        "max_position_embeddings": int(text.get("max_position_embeddings", 4096)),
        "rms_norm_eps": float(text.get("rms_norm_eps", 1e-5)),
        "rope_theta": text.get("rope_theta", 10000.0),
        "rope_scaling": _rope(text),
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in text:
            config[key] = text[key]
    return config
