"""Drafter / target pairing warnings: a drafter trained for another Kimi release or another quantization.

``speculators.pairing.validate_pair`` raises on what cannot work (vocab, hidden size, layer ids, block size).
:func:`pairing_warnings` adds what works but loses acceptance, with the expected impact, and
:func:`log_pairing_warnings` logs them at start-up (called from ``algorithms._resolve_speculative``).

How a drafter declares its target. Published drafter configs carry no standard "target" field (z-lab DFlash:
``dflash_config`` = ``target_layer_ids`` + ``mask_token_id``; SpecForge EAGLE3: ``eagle_config`` with the aux layer
ids), so the declared target is, first found:

1. an explicit field: ``target_model_name_or_path`` / ``target_model`` / ``base_model_name_or_path`` /
   ``base_model`` at the top level or inside ``dflash_config`` / ``eagle_config`` (SpecForge-style training
   configs and some exports write them);
2. the drafter config's ``_name_or_path`` when it names a repo (``z-lab/Kimi-K2.5-DFlash``);
3. the drafter's path or hub id as served (``--speculative-draft-model-path lightseekorg/kimi-k2.5-eagle3``): every
   published Kimi drafter is named after its target (``z-lab/Kimi-K2.5-DFlash``, ``z-lab/Kimi-K2.6-DFlash``,
   ``lightseekorg/kimi-k2.5-eagle3(-mla)``, ``lightseekorg/kimi-k2.6-eagle3``, ``nvidia/Kimi-K2.5-Thinking-Eagle3``).

The Kimi release is read from that name (``K2.5``, ``K2.6``, also spelled ``k2_6``/``k26``), and the target's
quantization when the name says it (``MXFP4``, ``NVFP4``, ``W4A8``, ``FP8``; Moonshot's own releases are INT4).
The served target's release comes from its path / ``_name_or_path``, its quantization from its
``quantization_config``. Nothing is warned when either side does not say.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("sglang_kimi")

# Published: K2.5 DFlash drafter on a K2.6 target, 8xMI300X, vLLM (field.md B4, the Hot Aisle report).
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
            f"with --speculative-num-draft-tokens {num_draft_tokens} expect a net slowdown; "
            if num_draft_tokens and num_draft_tokens > 3
            else ""
        )
        warnings.append(
            f"the drafter was trained for Kimi-{drafter_release} ({declared}, from its {source}) but the target is "
            f"Kimi-{target_release} ({target}): drafts carry over poorly between releases; {K25_ON_K26_FINDING}. "
            f"{advice}Use a drafter trained for Kimi-{target_release}, or lower --speculative-num-draft-tokens to 2."
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


def check_pairing(
    target_config: Any,
    draft_config: Any,
    *,
    num_draft_tokens: int | None = None,
    expected_algorithm: str | None = None,
    target_path: str | None = None,
    draft_path: str | None = None,
) -> list[str]:
    """``validate_pair`` (raises ``DrafterMismatchError`` on what cannot work, e.g. another vocab), then the
    warnings of :func:`pairing_warnings`."""
    from sglang_kimi.speculators.pairing import validate_pair

    validate_pair(target_config, draft_config, num_draft_tokens=num_draft_tokens, expected_algorithm=expected_algorithm)
    return pairing_warnings(target_config, draft_config, num_draft_tokens=num_draft_tokens, target_path=target_path,
                            draft_path=draft_path)


def log_pairing_warnings(cfg) -> list[str]:
    """At start-up (``algorithms._resolve_speculative``, after ``_check_pair``): log one warning per finding."""
    from sglang_kimi.algorithms import _load_config

    target = _load_config(cfg.model_path, cfg.trust_remote_code, cfg.revision)
    draft = _load_config(cfg.speculative_draft_model_path, cfg.trust_remote_code, cfg.speculative_draft_model_revision)
    found = pairing_warnings(
        target,
        draft,
        num_draft_tokens=cfg.speculative_num_draft_tokens,
        target_path=cfg.model_path,
        draft_path=cfg.speculative_draft_model_path,
    )
    for message in found:
        logger.warning("sglang-kimi: %s", message)
    return found
