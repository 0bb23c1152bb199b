"""Drafter checkpoint tensors: the names a published drafter's safetensors carry for its config, and the check that a
checkpoint folder holds them, read from the safetensors headers alone (no tensor data is loaded).

SGLang's drafter loaders (``DFlashDraftModel.load_weights``, ``LlamaForCausalLMEagle3.load_weights``) skip names
they do not know and never ask whether every parameter was written: a checkpoint missing a tensor, or one whose names
carry an unknown prefix, is served with those parameters left as allocated (uninitialized memory). The output stays
lossless (the target verifies every token), but the drafts are noise and the speed-up is gone, with no error.
:func:`check_checkpoint` refuses such a checkpoint before any weight loads.

Names are read as SGLang's loader for the architecture reads them (:func:`canonical_name`: where a ``model.``
prefix is accepted; ``midlayer.`` or ``layers.0.`` for EAGLE3's decoder layer). Optional names: EAGLE3's ``d2t`` /
``t2d`` when the draft vocabulary is the full one, its ``lm_head.weight`` when the config has no
``draft_vocab_size`` (SGLang takes the target's head). An EAGLE3 ``embed_tokens.weight`` (SpecForge saves the
target's) is allowed, and required only when the drafter's hidden size is not the target's (``target_hidden_size``):
SGLang then keeps the drafter's own embedding instead of sharing the target's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from .configs import GQA, DFlashConfig, Eagle3Config

SHOWN = 8  # names listed in an error before "and N more"


class DrafterCheckpointError(ValueError):
    """A drafter checkpoint whose tensors are not the ones its ``config.json`` calls for."""


SELECTOR_PREFIX = "candidate_selector."  # a DFlash2 drafter's selector tensors (SGLang's CandidateSelector)
SELECTOR_TENSORS = ("predecessor_codebook", "successor_codebook", "hidden_projection.weight")


def _dflash_names(config: DFlashConfig) -> list[str]:
    per_layer = [
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
    ]  # fmt: skip
    if config.attention_bias:
        per_layer += [f"self_attn.{p}_proj.bias" for p in "qkvo"]
    names = [f"layers.{i}.{n}" for i in range(config.num_hidden_layers) for n in per_layer]
    if config.has_selector:  # DFlash2's candidate selector
        names += [SELECTOR_PREFIX + n for n in SELECTOR_TENSORS]
    return sorted(names + ["fc.weight", "hidden_norm.weight", "norm.weight"])


def _eagle3_names(config: Eagle3Config) -> list[str]:
    attn = (
        ["q_proj", "k_proj", "v_proj", "o_proj"]
        if config.attention == GQA
        else ["q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"]
    )
    names = [f"midlayer.self_attn.{n}.weight" for n in attn]
    names += [f"midlayer.mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
    names += [f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")]
    names += ["fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"]
    if config.fc_bias:
        names.append("fc.bias")
    if config.fc_norm:
        names += [f"fc_norm.{i}.weight" for i in range(config.num_aux_hidden_states)]
    if config.norm_before_fc:
        names.append("input_norm.weight")
    return sorted(names)


def published_weight_names(config: DFlashConfig | Eagle3Config) -> list[str]:
    """Tensor names of a published checkpoint for this config: z-lab DFlash (11 per layer + fc, hidden_norm, norm),
    SpecForge / lightseek EAGLE3 (one ``midlayer``, fc, norm, lm_head, d2t, t2d)."""
    return _dflash_names(config) if isinstance(config, DFlashConfig) else _eagle3_names(config)


def expected_names(config: DFlashConfig | Eagle3Config) -> list[str]:
    """What SGLang's loader must find: the published names, plus an EAGLE3 drafter's own ``embed_tokens.weight``
    when its hidden size is not the target's (SGLang's ``set_embed`` then keeps the drafter's embedding rather than
    sharing the target's)."""
    names = published_weight_names(config)
    if isinstance(config, Eagle3Config) and config.target_hidden_size != config.hidden_size:
        names = sorted([*names, "embed_tokens.weight"])
    return names


def optional_names(config: DFlashConfig | Eagle3Config) -> set[str]:
    """Published names a checkpoint may leave out, SGLang supplying what they hold."""
    if isinstance(config, DFlashConfig):
        return set()
    optional = {"d2t", "t2d"} if config.draft_vocab_size == config.vocab_size else set()
    if config.lm_head_from_target:
        optional.add("lm_head.weight")
    return optional


def ignored_names(config: DFlashConfig | Eagle3Config) -> set[str]:
    """Names published checkpoints may carry beyond :func:`published_weight_names` (EAGLE3: the target's
    embedding)."""
    return set() if isinstance(config, DFlashConfig) else {"embed_tokens.weight"}


def canonical_name(config: DFlashConfig | Eagle3Config, name: str) -> str:
    """A checkpoint name in :func:`published_weight_names`' spelling, read as SGLang's loader for the config's
    architecture reads it: DFlash and GQA EAGLE3 take an optional ``model.`` prefix (GQA EAGLE3 not on
    ``lm_head``, which sits outside ``model.`` there); the MLA EAGLE3 loader prefixes every name but ``lm_head``
    itself, so a ``model.`` in its checkpoint is not read. EAGLE3's decoder layer is ``midlayer.`` or
    ``layers.0.``; ``d2t`` / ``t2d`` are found under any prefix."""
    if isinstance(config, DFlashConfig):
        return name.removeprefix("model.")
    for table in ("d2t", "t2d"):
        if name == table or name.endswith(f".{table}"):
            return table
    if config.attention == GQA and not name.startswith("model.lm_head."):
        name = name.removeprefix("model.")
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0.") :]
    return name


def is_quantized(config: DFlashConfig | Eagle3Config) -> bool:
    """A checkpoint exported quantized (``quantization_config`` in its config.json): a linear layer's ``weight``
    may be stored as other tensors of the same module (``weight_packed``, ``qweight``, scales)."""
    return "quantization_config" in config.extra


def name_problems(config: DFlashConfig | Eagle3Config, names: Iterable[str]) -> tuple[list[str], list[str]]:
    """(missing, unexpected): published names absent from ``names``, and names no loader reads. In a quantized
    checkpoint a published ``<module>.weight`` counts as present when any tensor of that module is, and the
    module's other tensors are expected."""
    have = {canonical_name(config, n) for n in names}
    published = set(expected_names(config))
    missing = published - have - optional_names(config)
    unexpected = have - published - ignored_names(config)
    if is_quantized(config):
        modules = {n.removesuffix("weight") for n in published if n.endswith(".weight")}
        stored = {m for m in modules if any(h.startswith(m) for h in have)}
        missing = {n for n in missing if n.removesuffix("weight") not in stored}
        unexpected = {n for n in unexpected if not any(n.startswith(m) for m in stored)}
    return sorted(missing), sorted(unexpected)


def _shown(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def safetensors_files(folder: Path) -> list[Path]:
    """The checkpoint's safetensors files: those its ``model.safetensors.index.json`` lists (a listed file that is
    absent is an error), else every ``*.safetensors`` in the folder."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            listed = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise DrafterCheckpointError(f"{index} is not a safetensors index (no weight_map): {e}") from e
        absent = [f for f in listed if not (folder / f).is_file()]
        if absent:
            raise DrafterCheckpointError(
                f"{folder}: the shards {_shown(absent)} listed in model.safetensors.index.json are absent: "
                "download the whole checkpoint"
            )
        return [folder / f for f in listed]
    return sorted(folder.glob("*.safetensors"))


def tensor_names(files: list[Path]) -> list[str]:
    """Every tensor name in these safetensors files, from their headers."""
    from safetensors import SafetensorError, safe_open

    names: list[str] = []
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                names += list(f.keys())
        except (SafetensorError, OSError) as e:
            raise DrafterCheckpointError(
                f"{path} is not a readable safetensors file ({e}): download or export it again"
            ) from e
    return names


def check_checkpoint(folder: str | Path, config: DFlashConfig | Eagle3Config) -> list[str]:
    """Raise :class:`DrafterCheckpointError` when the checkpoint in ``folder`` lacks a tensor its config calls for,
    holds no weights at all, or a file cannot be read. Returns warnings: names no loader reads, or that there is no
    safetensors file (a ``.bin`` checkpoint is not checked)."""
    folder = Path(folder)
    files = safetensors_files(folder)
    if not files:
        if not any(folder.glob("*.bin")) and not any(folder.glob("*.pt")):
            raise DrafterCheckpointError(
                f"{folder} holds no weights (no *.safetensors, *.bin or *.pt file): point at the drafter's "
                "checkpoint folder, weights included"
            )
        return [f"{folder} has no safetensors file: its tensor names were not checked"]
    return check_names(config, tensor_names(files), str(folder))


def check_names(config: DFlashConfig | Eagle3Config, names: Iterable[str], where: str) -> list[str]:
    """Raise :class:`DrafterCheckpointError` when ``names`` (a checkpoint's tensor names, read at ``where``) lack
    one its config calls for; returns a warning naming those no loader reads."""
    missing, unexpected = name_problems(config, names)
    if missing:
        unread = f" (it has {_shown(unexpected)}, names SGLang's loader does not read)" if unexpected else ""
        raise DrafterCheckpointError(
            f"its safetensors lack {len(missing)} of the {len(expected_names(config))} tensors its "
            f"config.json calls for: {_shown(missing)}{unread}. SGLang would serve them uninitialized and the drafts "
            "would be noise: point at a complete drafter checkpoint (or one whose config matches its weights)"
        )
    if unexpected:
        return [f"{where}: tensors that SGLang's drafter loader does not read, ignored: {_shown(unexpected)}"]
    return []
