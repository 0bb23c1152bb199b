"""Does this drafter fit this target? Config-only checks, cheap enough to run before any weight loads.

:func:`validate_pair` reads the target's ``config.json`` (a Kimi wrapper with ``text_config`` inside, or a plain
DeepSeek-V3 config; dict, HF config object or path) and a drafter's (DFlash, z-lab format; EAGLE3, SpecForge /
lightseek format incl. the MLA variant) and raises one :class:`DrafterMismatchError` listing every mismatch, each
with both values and the fix::

    validate_pair("moonshotai/Kimi-K2.6/config.json", "z-lab/Kimi-K2.5-DFlash", num_draft_tokens=8,
                  expected_algorithm="DFLASH")

A drafter config that cannot be parsed at all raises :class:`DrafterConfigError`. Both are ``ValueError``s.

:func:`pairing_warnings` adds what works but loses acceptance: a drafter trained for another Kimi release or
another quantization of the target, with the expected impact (logged at server start-up, never refused).

Capture convention (SGLang's DeepSeek-V3 target, ``deepseek_v2.py``): a drafter "target layer id" l is the output
of decoder layer l, captured at the *input* of layer l + 1; capture points run 0..L-1, so the output of the last
layer (l = L-1) can never be captured and ids must lie in 0..L-2.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .configs import (
    DFLASH,
    DFLASH_ARCHITECTURES,
    EAGLE3,
    EAGLE3_ARCHITECTURES,
    DFlashConfig,
    Eagle3Config,
    drafter_algorithm,
    load_config_dict,
    parse_drafter_config,
)


@dataclass(frozen=True)
class Mismatch:
    """One way a drafter does not fit: the field, the drafter's value, the target's (or requested) value, the fix."""

    field: str
    draft: Any
    target: Any
    fix: str

    def __str__(self) -> str:
        return f"{self.field}: drafter has {self.draft}, target has {self.target}. Fix: {self.fix}"


class DrafterMismatchError(ValueError):
    """A drafter that does not fit its target or the requested settings; ``problems`` lists every mismatch."""

    def __init__(self, problems: Sequence[Mismatch], algorithm: str | None = None) -> None:
        self.problems = list(problems)
        self.algorithm = algorithm
        what = f"{algorithm} drafter" if algorithm else "drafter"
        lines = [f"{what} does not fit the target model:"] + [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


# ---------------------------------------------------------------------------------------------------------------
# Reading configs
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetInfo:
    """What the checks need from the target's text model config (``text_config`` of a Kimi wrapper, else the
    config itself)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    architectures: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, target_config: Any) -> TargetInfo:
        if isinstance(target_config, TargetInfo):
            return target_config
        if not isinstance(target_config, (Mapping, str, Path)) and getattr(target_config, "text_config", None):
            target_config = target_config.text_config  # HF wrapper object: its text config
        d = load_config_dict(target_config)
        top_arch = tuple(d.get("architectures") or ())
        text = d.get("text_config") or d
        if not isinstance(text, Mapping):
            text = load_config_dict(text)
        missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers") if text.get(k) is None]
        if missing:
            raise ValueError(f"target config has no {', '.join(missing)} (looked in text_config, then top level)")
        return cls(
            vocab_size=int(text["vocab_size"]),
            hidden_size=int(text["hidden_size"]),
            num_hidden_layers=int(text["num_hidden_layers"]),
            architectures=top_arch or tuple(text.get("architectures") or ()),
        )

    @property
    def capturable_layer_ids(self) -> range:
        """Layer ids whose output SGLang's DeepSeek-V3 target can capture (0..L-2)."""
        return range(self.num_hidden_layers - 1)


# ---------------------------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------------------------

_ARCHS = {DFLASH: DFLASH_ARCHITECTURES, EAGLE3: EAGLE3_ARCHITECTURES}
DRAFTER_EXAMPLES = {DFLASH: "z-lab/Kimi-K2.5-DFlash", EAGLE3: "lightseekorg/kimi-k2.5-eagle3"}


def indefinite_article(name: str) -> str:
    """The indefinite article before an algorithm's name as it is read out: "an EAGLE3", "a DFLASH"."""
    return "an" if name[:1].upper() in "AEIOU" else "a"


def _check_vocab(algorithm: str, cfg: Any, target: TargetInfo, problems: list[Mismatch]) -> None:
    if cfg.vocab_size != target.vocab_size:
        problems.append(
            Mismatch(
                "vocab_size",
                cfg.vocab_size,
                target.vocab_size,
                f"use {indefinite_article(algorithm)} {algorithm} drafter trained for this target (its vocab_size "
                f"must equal the target's {target.vocab_size}); the drafter is for a different tokenizer",
            )
        )


def _check_layer_ids(field: str, layer_ids: Sequence[int], target: TargetInfo, problems: list[Mismatch]) -> None:
    allowed = target.capturable_layer_ids
    bad = [layer for layer in layer_ids if layer not in allowed]
    if bad:
        problems.append(
            Mismatch(
                field,
                f"{list(layer_ids)} (out of range: {bad})",
                f"num_hidden_layers {target.num_hidden_layers} (capturable layer outputs 0..{allowed.stop - 1}; "
                "SGLang captures the output of layer l at the input of layer l+1)",
                "use a drafter trained for this target; its layer ids must name layers the target has",
            )
        )


def _dflash_problems(
    cfg: DFlashConfig, target: TargetInfo, num_draft_tokens: int | None, flag: str = "--speculative-num-draft-tokens"
) -> list[Mismatch]:
    problems: list[Mismatch] = []
    _check_vocab(DFLASH, cfg, target, problems)
    if cfg.hidden_size != target.hidden_size:
        problems.append(
            Mismatch(
                "hidden_size",
                cfg.hidden_size,
                target.hidden_size,
                "DFlash embeds its block with the target's embed_tokens and reads out with the target's lm_head, "
                f"so its hidden_size must equal the target's {target.hidden_size}; use a drafter trained for "
                "this target",
            )
        )
    if cfg.num_target_layers is not None and cfg.num_target_layers != target.num_hidden_layers:
        problems.append(
            Mismatch(
                "num_target_layers",
                cfg.num_target_layers,
                f"num_hidden_layers {target.num_hidden_layers}",
                f"the drafter was trained on a {cfg.num_target_layers}-layer target; use a DFlash drafter trained "
                f"for this {target.num_hidden_layers}-layer target",
            )
        )
    _check_layer_ids(
        "dflash_config.target_layer_ids", cfg.resolve_target_layer_ids(target.num_hidden_layers), target, problems
    )
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        problems.append(
            Mismatch(
                "dflash_config.mask_token_id",
                cfg.mask_token_id,
                f"vocab_size {target.vocab_size} (valid ids 0..{target.vocab_size - 1})",
                "set dflash_config.mask_token_id to a token id inside the target vocabulary (Kimi: [UNK] 163838); "
                "SGLang cannot grow the target embedding for a new mask token",
            )
        )
    if num_draft_tokens is not None:
        if num_draft_tokens > cfg.block_size:
            problems.append(
                Mismatch(
                    "block_size",
                    cfg.block_size,
                    f"{flag} {num_draft_tokens} requested",
                    f"pass {flag} {cfg.block_size} or less: the drafter was trained on "
                    f"blocks of {cfg.block_size} (root + {cfg.block_size - 1} drafts) and has never predicted "
                    "further positions",
                )
            )
        elif num_draft_tokens < 2:
            problems.append(
                Mismatch(
                    "block_size",
                    cfg.block_size,
                    f"{flag} {num_draft_tokens} requested",
                    f"pass {flag} between 2 and {cfg.block_size} (the block counts the "
                    "root, so fewer than 2 drafts nothing)",
                )
            )
    return problems


def _eagle3_problems(cfg: Eagle3Config, target: TargetInfo, num_draft_tokens: int | None) -> list[Mismatch]:
    problems: list[Mismatch] = []
    _check_vocab(EAGLE3, cfg, target, problems)
    if cfg.draft_vocab_size > cfg.vocab_size:
        problems.append(
            Mismatch(
                "draft_vocab_size",
                cfg.draft_vocab_size,
                f"vocab_size {cfg.vocab_size}",
                "draft_vocab_size is a subset of the target vocabulary (d2t maps it in); fix the drafter's config",
            )
        )
    if cfg.target_hidden_size != target.hidden_size:
        field = "target_hidden_size" if cfg.has_target_hidden_size else "hidden_size"
        problems.append(
            Mismatch(
                field,
                cfg.target_hidden_size,
                target.hidden_size,
                f"fc projects {cfg.num_aux_hidden_states} x the target's hidden states "
                f"({cfg.num_aux_hidden_states} x {target.hidden_size} = "
                f"{cfg.num_aux_hidden_states * target.hidden_size} inputs, the drafter expects "
                f"{cfg.num_aux_hidden_states * cfg.target_hidden_size}); use an EAGLE3 drafter trained for this target",
            )
        )
    _check_layer_ids(
        "eagle_config.eagle_aux_hidden_state_layer_ids (as layer outputs)",
        cfg.resolve_target_layer_ids(target.num_hidden_layers),
        target,
        problems,
    )
    if num_draft_tokens is not None and num_draft_tokens < 1:
        problems.append(
            Mismatch(
                "num_draft_tokens",
                "any >= 1",
                f"--speculative-num-draft-tokens {num_draft_tokens} requested",
                "pass --speculative-num-draft-tokens >= 2 (it counts the root)",
            )
        )
    return problems


def validate_pair(
    target_config: Any,
    draft_config: Any,
    *,
    num_draft_tokens: int | None = None,
    expected_algorithm: str | None = None,
    draft_tokens_flag: str = "--speculative-num-draft-tokens",
) -> DFlashConfig | Eagle3Config:
    """Check a drafter against its target; return the parsed drafter config or raise :class:`DrafterMismatchError`.

    target_config: the target's config (Kimi wrapper or DeepSeek-V3; dict, HF config object or path).
    draft_config: the drafter's config (dict, path, HF config object, or an already parsed config).
    num_draft_tokens: SGLang's ``--speculative-num-draft-tokens`` (DFlash: the block, root included).
    draft_tokens_flag: the flag that set ``num_draft_tokens``, named in the errors (DFlash: SGLang's
    ``--speculative-dflash-block-size`` sets it too).
    expected_algorithm: SGLang's ``--speculative-algorithm`` (``"DFLASH"`` or ``"EAGLE3"``); a drafter of the
    other kind is one mismatch, reported with the algorithm that fits it.

    Checks (DFlash): vocab_size, hidden_size, num_target_layers, target_layer_ids within the target's capturable
    layers, mask_token_id inside the vocab, num_draft_tokens <= block_size. (EAGLE3): vocab_size,
    draft_vocab_size <= vocab_size, target hidden size, aux layer ids within the target's capturable layers.
    """
    algorithm = drafter_algorithm(draft_config)
    target = TargetInfo.from_config(target_config)
    if expected_algorithm is not None and expected_algorithm.upper() != algorithm:
        archs = list(getattr(parse_drafter_config(draft_config), "architectures", ()))
        wanted = expected_algorithm.upper()
        hint = (
            f"point --speculative-draft-model-path at {indefinite_article(wanted)} {wanted} drafter (architectures "
            f"{list(_ARCHS[wanted])}, e.g. {DRAFTER_EXAMPLES[wanted]})"
            if wanted in _ARCHS
            else f"use one of {sorted(_ARCHS)}"
        )
        raise DrafterMismatchError(
            [
                Mismatch(
                    "speculative algorithm",
                    f"{algorithm} (architectures {archs})",
                    f"--speculative-algorithm {expected_algorithm}",
                    f"pass --speculative-algorithm {algorithm}, or {hint}",
                )
            ],
            algorithm,
        )
    cfg = parse_drafter_config(draft_config)
    problems = (
        _dflash_problems(cfg, target, num_draft_tokens, draft_tokens_flag)
        if algorithm == DFLASH
        else _eagle3_problems(cfg, target, num_draft_tokens)
    )
    if problems:
        raise DrafterMismatchError(problems, algorithm)
    return cfg


# ---------------------------------------------------------------------------------------------------------------
# Warnings: a drafter that fits but was trained for another Kimi release or quantization
# ---------------------------------------------------------------------------------------------------------------
#
# How a drafter declares its target. Published drafter configs carry no standard "target" field (z-lab DFlash:
# ``dflash_config`` = ``target_layer_ids`` + ``mask_token_id``; SpecForge EAGLE3: ``eagle_config`` with the aux layer
# ids), so the declared target is, first found:
#
# 1. an explicit field: ``target_model_name_or_path`` / ``target_model`` / ``base_model_name_or_path`` /
#    ``base_model`` at the top level or inside ``dflash_config`` / ``eagle_config`` (SpecForge-style training
#    configs and some exports write them);
# 2. the drafter config's ``_name_or_path`` when it names a repo (``z-lab/Kimi-K2.5-DFlash``);
# 3. the drafter's path or hub id as served (``--speculative-draft-model-path lightseekorg/kimi-k2.5-eagle3``): every
#    published Kimi drafter is named after its target (``z-lab/Kimi-K2.5-DFlash``, ``z-lab/Kimi-K2.6-DFlash``,
#    ``lightseekorg/kimi-k2.5-eagle3(-mla)``, ``lightseekorg/kimi-k2.6-eagle3``, ``nvidia/Kimi-K2.5-Thinking-Eagle3``).
#
# The Kimi release is read from that name (``K2.5``, ``K2.6``, also spelled ``k2_6``/``k26``), and the target's
# quantization when the name says it (``MXFP4``, ``NVFP4``, ``W4A8``, ``FP8``; Moonshot's own releases are INT4).
# The served target's release comes from its path / ``_name_or_path``, its quantization from its
# ``quantization_config``. Nothing is warned when either side does not say.

# A published measurement: a Kimi-K2.5 DFlash drafter served on a Kimi-K2.6 target (vLLM, 8xMI300X).
K25_ON_K26_FINDING = (
    "published measurement (Kimi-K2.5 DFlash drafter on a Kimi-K2.6 target, 8xMI300X): acceptance 16% at 8 draft "
    "tokens, a net slowdown, vs 50% at 2 draft tokens"
)

EXPLICIT_TARGET_FIELDS = ("target_model_name_or_path", "target_model", "base_model_name_or_path", "base_model")
NESTED_CONFIGS = ("dflash_config", "eagle_config")
QUANT_TOKENS = ("mxfp4", "nvfp4", "w4a8", "fp8", "int4", "bf16")

_RELEASE = re.compile(r"kimi[-_ ]?k2(?:[._-]?(\d))?", re.IGNORECASE)


def kimi_release(name: str | None) -> str | None:
    """``"K2.5"``, ``"K2.6"`` (or ``"K2"``) from a model name or path; None when it names no Kimi release."""
    if not name:
        return None
    match = _RELEASE.search(str(name))
    if match is None:
        return None
    return f"K2.{match.group(1)}" if match.group(1) else "K2"


def quantization_in_name(name: str | None) -> str | None:
    """The quantization a model name states (``amd/Kimi-K2.5-MXFP4`` -> ``mxfp4``), else None."""
    if not name:
        return None
    tokens = set(re.split(r"[^a-z0-9]+", str(name).lower()))
    for q in QUANT_TOKENS:
        if q in tokens:
            return q
    return None


def _as_dict(config: Any) -> dict:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    d = dict(to_dict()) if callable(to_dict) else {}
    name = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)
    if name and not d.get("_name_or_path"):
        d["_name_or_path"] = name
    return d


def declared_target(draft_config: Any, draft_path: str | None = None) -> tuple[str | None, str]:
    """(the target name a drafter declares, where it was found) following the module's heuristic."""
    d = _as_dict(draft_config)
    for scope, fields in [("config", d)] + [(n, d.get(n) or {}) for n in NESTED_CONFIGS]:
        for field in EXPLICIT_TARGET_FIELDS:
            value = fields.get(field) if isinstance(fields, Mapping) else None
            if value:
                return str(value), f"{scope}.{field}"
    name = d.get("_name_or_path")
    if name and kimi_release(name):
        return str(name), "_name_or_path"
    if draft_path and kimi_release(draft_path):
        return str(draft_path), "draft model path"
    return None, "nothing"


def served_quantization(target_config: Any) -> str | None:
    """The served target's weight format from its ``quantization_config`` (``int4``, ``mxfp4``, ``nvfp4``,
    ``fp8``, ...), None for an unquantized checkpoint."""
    d = _as_dict(target_config)
    q = d.get("quantization_config") or (_as_dict(d.get("text_config") or {})).get("quantization_config")
    if not q:
        return None
    q = _as_dict(q)
    method = str(q.get("quant_method", "")).lower()
    if method in ("compressed-tensors", "compressed_tensors"):
        groups = [g.get("weights") or {} for g in (q.get("config_groups") or {}).values()]
        if "mxfp4" in str(q.get("format", "")):
            return "mxfp4"
        if any(w.get("type") == "int" and w.get("num_bits") == 4 for w in groups):
            acts = [g.get("input_activations") for g in (q.get("config_groups") or {}).values()]
            return "w4a8" if any(acts) else "int4"
        if any(w.get("type") == "float" and w.get("num_bits") == 8 for w in groups):
            return "fp8"
    if method == "quark":
        weight = (q.get("global_quant_config") or {}).get("weight") or {}
        weight = weight[0] if isinstance(weight, list) and weight else weight
        inputs = (q.get("global_quant_config") or {}).get("input_tensors") or {}
        if weight.get("dtype") == "fp4":
            return "w4a8" if str(inputs.get("dtype", "")).startswith("fp8") else "mxfp4"
        if str(weight.get("dtype", "")).startswith("fp8"):
            return "fp8"
    if method in ("modelopt", "modelopt_fp4") or "nvfp4" in str(q.get("quant_algo", "")).lower():
        return "nvfp4"
    if method == "fp8":
        return "fp8"
    return method or None


def _target_name(target_config: Any, target_path: str | None) -> str | None:
    return target_path or _as_dict(target_config).get("_name_or_path")


def pairing_warnings(
    target_config: Any,
    draft_config: Any,
    *,
    num_draft_tokens: int | None = None,
    target_path: str | None = None,
    draft_path: str | None = None,
) -> list[str]:
    """Warnings for a drafter trained for another Kimi release or another quantization of the target (empty when
    the drafter fits or when either side does not say). Errors (vocab, hidden size, ...) are validate_pair's."""
    warnings: list[str] = []
    declared, source = declared_target(draft_config, draft_path)
    if declared is None:
        return warnings
    target = _target_name(target_config, target_path)
    drafter_release, target_release = kimi_release(declared), kimi_release(target)
    if drafter_release and target_release and drafter_release != target_release:
        advice = (
            f"With --speculative-num-draft-tokens {num_draft_tokens} expect a net slowdown. "
            if num_draft_tokens and num_draft_tokens > 3
            else ""
        )
        warnings.append(
            f"the drafter was trained for Kimi-{drafter_release} ({declared}, from its {source}) but the target is "
            f"Kimi-{target_release} ({target}): drafts carry over poorly between releases; {K25_ON_K26_FINDING}. "
            f"{advice}Use a drafter trained for Kimi-{target_release}, lower --speculative-num-draft-tokens to 2, or "
            "let --speculative-kimi-adaptive choose the width per batch from the measured acceptance."
        )
    trained_on = quantization_in_name(declared) or ("int4" if drafter_release in ("K2.5", "K2.6") else None)
    served = served_quantization(target_config)
    if trained_on and served and trained_on != served and trained_on != "bf16":
        warnings.append(
            f"the drafter was trained on the {trained_on.upper()} checkpoint ({declared}, from its {source}) but the "
            f"served target is {served.upper()}: the target's hidden states and argmax differ slightly between "
            "quantizations, so expect somewhat lower acceptance than published for the drafter (output stays "
            "lossless); prefer a drafter trained on the served checkpoint"
        )
    return warnings
