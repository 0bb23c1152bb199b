"""Speculative algorithms for Kimi: the plugin's server flags, start-up validation and worker selection.

``--speculative-algorithm DFLASH`` keeps SGLang's own chain worker; the plugin flag
``--speculative-dflash-tree-budget N`` (listed in ``python -m sglang.launch_server --help``) switches it to DDTree
draft trees (:class:`sglang_kimi.workers.dflash_tree.DFlashTreeWorker`). SGLang's ``ServerArgs`` is a closed record,
so the flag's value rides on it as bookkeeping (``server_args._sglang_kimi``, which SGLang pickles into every
subprocess like its own ``_launch_command``).

Every speculative start-up is also checked here, before any weight loads: the drafter against the target
(``speculators.pairing.validate_pair``: algorithm, vocab, hidden size, layer ids, mask token, block size), the
draft path, the tree budget, and that the attention backend can take a tree mask. Each problem is one error that
names the values and the fix.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from sglang_kimi.plugin import hook, target_of

logger = logging.getLogger("sglang_kimi")

TREE_BUDGET_FLAG = "--speculative-dflash-tree-budget"
# A verify window of budget + 1 <= 64 nodes: one 64-bit ancestor-mask word per node (kernels/tree_mla_attention).
MAX_TREE_BUDGET = 63
# Attention backends that apply an arbitrary tree mask to MLA verify (TARGET_VERIFY with a FULL_MASK custom mask).
# FlashInfer-MLA, trtllm-mla, FlashMLA, cutedsl-mla and fa3 verify chains only with Kimi's MLA.
TREE_MASK_BACKENDS = ("triton", "kimi_cpu")
# Attention backends that serve speculative decoding (TARGET_VERIFY, draft extend, EAGLE multi-step draft, DFLASH's
# non-causal draft block) on --device cpu: the plugin's kimi_cpu, and triton under TRITON_INTERPRET=1. SGLang's
# torch_native has no TARGET_VERIFY (the first verify fails in _run_sdpa_forward_extend) and intel_amx needs the
# compiled CPU sgl_kernel.
CPU_SPECULATIVE_BACKENDS = ("kimi_cpu", "triton")


@dataclass(frozen=True)
class PluginArgs:
    """The plugin's own server options (set from the command line, completed at start-up)."""

    dflash_tree_budget: int | None = None  # DDTree nodes below the root; None = DFlash chains
    dflash_tree_block: int | None = None  # the drafter's block in tree mode (resolved at start-up)


def plugin_args(server_args) -> PluginArgs:
    return getattr(server_args, "_sglang_kimi", None) or PluginArgs()


# Debugging only: makes every plugin verification greedy, even for sampled requests (NOT lossless). It exists so
# that tests and the GSM8K gate can show they fail on a broken verifier; a warning is logged at start-up.
DEBUG_GREEDY_VERIFY_ENV = "SGLANG_KIMI_DEBUG_GREEDY_VERIFY"


def debug_greedy_verify() -> bool:
    return os.environ.get(DEBUG_GREEDY_VERIFY_ENV, "0") == "1"


class SpeculativeConfigError(ValueError):
    """A speculative decoding setting that cannot be served; the message names the values and the fix."""


# ---------------------------------------------------------------------------------------------------------------
# The plugin's flags


def _add_plugin_flags(result, parser):
    group = parser.add_argument_group("sglang-kimi", "Options added by the sglang-kimi plugin.")
    group.add_argument(
        TREE_BUDGET_FLAG,
        type=int,
        default=None,
        metavar="N",
        help="DFLASH draft trees (DDTree): verify the N most likely draft prefixes of each DFlash block as one tree "
        f"instead of a chain (1..{MAX_TREE_BUDGET}; the verify window is N + 1 tokens). Needs an attention backend "
        f"that applies tree masks: {', '.join(TREE_MASK_BACKENDS)}.",
    )
    return result


def _plugin_args_from_cli(original, cls, args):
    server_args = original(cls, args)
    server_args._sglang_kimi = PluginArgs(dflash_tree_budget=getattr(args, "speculative_dflash_tree_budget", None))
    return server_args


def install_flag_help():
    hook(target_of("plugin-flags"), _add_plugin_flags, "AFTER")


def install_flag_parse():
    hook(target_of("plugin-flags-parse"), _plugin_args_from_cli, "AROUND")


# ---------------------------------------------------------------------------------------------------------------
# Start-up validation and resolution


def _check_draft_path(path: str | None, algorithm: str) -> None:
    if path is None:
        raise SpeculativeConfigError(
            f"--speculative-algorithm {algorithm} needs --speculative-draft-model-path (a {algorithm} drafter "
            "checkpoint folder or hub id)"
        )
    local = Path(path).expanduser()
    if local.exists():
        if not (local / "config.json").exists():
            raise SpeculativeConfigError(
                f"--speculative-draft-model-path {path} has no config.json: point it at a drafter checkpoint folder"
            )
        return
    if path.startswith(("/", ".", "~")) or path.count("/") != 1:
        raise SpeculativeConfigError(
            f"--speculative-draft-model-path {path} does not exist: pass an existing drafter folder or a hub id"
        )


def _load_config(path: str, trust_remote_code: bool, revision: str | None):
    """A checkpoint's HF config through SGLang's own loader (local folder or hub id; Kimi's wrapper config)."""
    from sglang.srt.utils.hf_transformers_utils import get_config

    return get_config(path, trust_remote_code=trust_remote_code, revision=revision)


def _check_pair(cfg, algorithm: str, num_draft_tokens: int | None):
    from sglang_kimi.speculators.pairing import validate_pair

    target = _load_config(cfg.model_path, cfg.trust_remote_code, cfg.revision)
    draft = _load_config(cfg.speculative_draft_model_path, cfg.trust_remote_code, cfg.speculative_draft_model_revision)
    return validate_pair(target, draft, num_draft_tokens=num_draft_tokens, expected_algorithm=algorithm)


def _check_tree_budget(budget: int, algorithm: str | None) -> None:
    if algorithm != "DFLASH":
        raise SpeculativeConfigError(
            f"{TREE_BUDGET_FLAG} is for DFLASH draft trees, but --speculative-algorithm is {algorithm}: pass "
            f"--speculative-algorithm DFLASH, or use --speculative-eagle-topk > 1 for EAGLE3 trees"
        )
    if not 1 <= budget <= MAX_TREE_BUDGET:
        raise SpeculativeConfigError(
            f"{TREE_BUDGET_FLAG} {budget} is outside 1..{MAX_TREE_BUDGET}: pick a node budget in that range"
        )


def _check_tree_backend(cfg) -> None:
    for flag, backend in (
        ("--attention-backend", cfg.attention_backend),
        ("--decode-attention-backend", cfg.decode_attention_backend),
        ("--prefill-attention-backend", cfg.prefill_attention_backend),
    ):
        if backend is not None and backend not in TREE_MASK_BACKENDS:
            raise SpeculativeConfigError(
                f"DFLASH draft trees need an attention backend that applies tree masks to MLA verify, but "
                f"{flag} is {backend}: use --attention-backend {' or '.join(TREE_MASK_BACKENDS)}"
            )
    if cfg.page_size not in (None, 1):
        raise SpeculativeConfigError(
            f"DFLASH draft trees commit the accepted path by reordering KV slots, which needs --page-size 1 "
            f"(got {cfg.page_size})"
        )
    if cfg.enable_deterministic_inference:
        raise SpeculativeConfigError(
            "DFLASH draft trees do not support --enable-deterministic-inference (per-request sampling seeds)"
        )


def _check_cpu_backend(cfg, algorithm: str) -> None:
    """On --device cpu, every attention backend a speculative step uses must serve verify and draft forwards."""
    if (cfg.device or "").lower() != "cpu":
        return
    for flag, backend in (
        ("--attention-backend", cfg.attention_backend),
        ("--decode-attention-backend", cfg.decode_attention_backend),
        ("--prefill-attention-backend", cfg.prefill_attention_backend),
    ):
        if backend is not None and backend not in CPU_SPECULATIVE_BACKENDS:
            raise SpeculativeConfigError(
                f"--speculative-algorithm {algorithm} on --device cpu needs an attention backend that serves "
                f"verify and draft forwards, but {flag} is {backend}: use --attention-backend "
                f"{' or '.join(CPU_SPECULATIVE_BACKENDS)} (triton only under TRITON_INTERPRET=1)"
            )


def _resolve_speculative(original, server_args):
    """Around SGLang's ``handle_speculative_decoding``: the plugin's checks before, tree resolution after."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    cfg = resolving_view(server_args)
    args = plugin_args(server_args)
    algorithm = (cfg.speculative_algorithm or "").upper() or None
    if algorithm is not None:
        _check_cpu_backend(cfg, algorithm)
    if args.dflash_tree_budget is not None:
        _check_tree_budget(args.dflash_tree_budget, algorithm)
        _check_tree_backend(cfg)
    if algorithm is not None and debug_greedy_verify():
        logger.warning(
            "sglang-kimi: %s=1: sampled requests are verified GREEDILY (debugging only; output is not lossless)",
            DEBUG_GREEDY_VERIFY_ENV,
        )
    drafter = None
    if algorithm in ("DFLASH", "EAGLE3"):
        _check_draft_path(cfg.speculative_draft_model_path, algorithm)
        drafter = _check_pair(cfg, algorithm, cfg.speculative_num_draft_tokens)
        from sglang_kimi.models.pairing_notes import log_pairing_warnings

        log_pairing_warnings(cfg)  # drafter trained for another Kimi release / quantization: logged, not refused

    original(server_args)

    if args.dflash_tree_budget is not None:
        cfg = resolving_view(server_args)
        block = min(int(cfg.speculative_num_draft_tokens or drafter.block_size), args.dflash_tree_budget + 1)
        window = args.dflash_tree_budget + 1
        declare_resolution(server_args, "sglang_kimi.dflash_tree", speculative_num_draft_tokens=window)
        server_args._sglang_kimi = dataclasses.replace(args, dflash_tree_block=block)
        logger.info(
            "sglang-kimi: DFLASH draft trees, budget %d: drafter block %d, verify window %d tokens",
            args.dflash_tree_budget,
            block,
            window,
        )


def install_validation():
    hook(target_of("speculative-validation"), _resolve_speculative, "AROUND")


# ---------------------------------------------------------------------------------------------------------------
# Worker selection


def _create_worker(original, algorithm, server_args):
    if algorithm.is_dflash() and plugin_args(server_args).dflash_tree_budget is not None:
        from sglang_kimi.workers.dflash_tree import DFlashTreeWorker

        return DFlashTreeWorker
    return original(algorithm, server_args)


def install_worker_selection():
    hook(target_of("dflash-tree-worker"), _create_worker, "AROUND")
