"""Every speculative start-up checked before any weight loads (an AROUND hook on SGLang's
``handle_speculative_decoding``).

The drafter against the target (``drafter_checks``: the draft path, the pairing and the checkpoint's tensors), the
tree budget, the EAGLE draft shape flags, relaxed acceptance thresholds where they would not be applied, speculative
flags SGLang would not read, the KV scale setting, and that the attention backends can serve the mode (on CPU, the
draft worker's too, and ``triton`` only under Triton's interpreter, for every launch). Each problem is one
:class:`~sglang_kimi.errors.SpeculativeConfigError` naming the values and the fix. In tree mode the verify window
is sized here.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from sglang_kimi.environment_check import check_environment
from sglang_kimi.errors import SpeculativeConfigError
from sglang_kimi.hooks import hook
from sglang_kimi.models import kv_scales
from sglang_kimi.platform.cpu import KIMI_CPU_BACKEND
from sglang_kimi.settings import (
    ADAPTIVE_CONFIG_FLAG,
    ADAPTIVE_FLAG,
    ADAPTIVE_PROFILE_FLAG,
    CPU_SPECULATIVE_BACKENDS,
    DEBUG_GREEDY_VERIFY_ENV,
    MAX_TREE_BUDGET,
    STATIC_TREE_BACKENDS,
    TREE_BUDGET_FLAG,
    TREE_MASK_BACKENDS,
    attention_dp_size,
    debug_greedy_verify,
    plugin_args,
)
from sglang_kimi.speculative import drafter_checks
from sglang_kimi.speculative.dispatch_capacity import check_dispatch_capacity
from sglang_kimi.version import sglang_at_least

logger = logging.getLogger("sglang_kimi")

DEFAULT_ADAPTIVE_EAGLE_STEPS = 7  # adaptive EAGLE3 without --speculative-num-steps: 0..7 drafts (SGLang's widest)


def _check_adaptive(cfg, algorithm: str | None, args):
    """What ``--speculative-kimi-adaptive`` can drive: DFLASH chains and trees (the plugin's worker, so the same
    needs as trees) and EAGLE3 chains (topk 1, through SGLang's own adaptive runtime). Returns its settings
    (``speculative/adaptive/config.py``)."""
    from sglang_kimi.speculative.adaptive.config import load_adaptive_config

    if not args.adaptive:
        given = [
            f
            for f, v in ((ADAPTIVE_CONFIG_FLAG, args.adaptive_config), (ADAPTIVE_PROFILE_FLAG, args.adaptive_profile))
            if v
        ]
        one = len(given) == 1
        raise SpeculativeConfigError(
            f"{' and '.join(given)} only appl{'ies' if one else 'y'} with {ADAPTIVE_FLAG}: add it, or drop "
            f"{'it' if one else 'them'}"
        )
    if args.adaptive_profile:
        from sglang_kimi.speculative.adaptive.profile import default_profile_folder, unwritable

        problem = unwritable(args.adaptive_profile)
        if problem:
            raise SpeculativeConfigError(
                f"{ADAPTIVE_PROFILE_FLAG}: {problem}; every start would profile again and keep nothing: pass a "
                f"file in a writable folder, or drop the flag for the default folder ({default_profile_folder()})"
            )
    if algorithm == "EAGLE3":
        _check_adaptive_eagle(cfg)
        return _check_step_costs(cfg, load_adaptive_config(args.adaptive_config), "eagle3-chain")
    if algorithm != "DFLASH":
        raise SpeculativeConfigError(
            f"{ADAPTIVE_FLAG} drives DFLASH chains, DFLASH trees and EAGLE3 chains, but --speculative-algorithm is "
            f"{algorithm}: use --speculative-algorithm DFLASH or EAGLE3"
        )
    if getattr(cfg, "speculative_adaptive", False):
        raise SpeculativeConfigError(
            f"SGLang's --speculative-adaptive does not drive DFLASH (it tunes EAGLE steps); with {ADAPTIVE_FLAG} "
            "the plugin chooses the widths: drop --speculative-adaptive"
        )
    _check_tree_verify(cfg, ADAPTIVE_FLAG, "drop the flag", TREE_MASK_BACKENDS)
    mode = "chain" if args.dflash_tree_budget is None else "tree"
    return _check_step_costs(cfg, load_adaptive_config(args.adaptive_config), mode)


def _check_step_costs(cfg, config, mode: str):
    """A step-costs table (the setting ``step_costs``) that does not describe this server (TP, shape of a rank, mode)
    is refused before weights load; its device is compared once the scheduler knows it (``adaptive/start.py``)."""
    if not config.step_costs:
        return config
    from sglang_kimi.speculative.adaptive.profile import StepCostsError, fitting_step_costs
    from sglang_kimi.speculators.configs import load_config_dict

    model = Path(cfg.model_path).expanduser()
    if not model.is_dir():  # a hub id: compared in the scheduler, with the config SGLang downloaded
        return config
    try:
        fitting_step_costs(
            config.step_costs,
            model_config=load_config_dict(model),
            tp=int(cfg.tp_size),
            ep=int(getattr(cfg, "ep_size", 1) or 1),
            moe_a2a_backend=getattr(cfg, "moe_a2a_backend", None),
            mode=mode,
        )
    except StepCostsError as e:
        raise SpeculativeConfigError(f"{ADAPTIVE_CONFIG_FLAG}: {e}") from e
    return config


def _check_adaptive_eagle(cfg) -> None:
    """Adaptive EAGLE3 runs SGLang's adaptive runtime (one state per step count, chains only) with the plugin's
    policy; the candidate steps come from the plugin's settings."""
    ok, sglang_version = sglang_at_least((0, 5, 22))
    if not ok:  # the plugin's policy profiles SGLang's runtime states over KVIndexTranslator.bind_runner_slots
        raise SpeculativeConfigError(
            f"{ADAPTIVE_FLAG} with EAGLE3 needs SGLang 0.5.22 or later; the installed SGLang is {sglang_version}: "
            f"upgrade SGLang, or drop {ADAPTIVE_FLAG}"
        )
    if cfg.speculative_eagle_topk not in (None, 1):
        raise SpeculativeConfigError(
            f"{ADAPTIVE_FLAG} with EAGLE3 adapts chains (--speculative-eagle-topk 1): SGLang's adaptive runtime "
            f"switches step counts of topk-1 chains only, but --speculative-eagle-topk is "
            f"{cfg.speculative_eagle_topk}: use --speculative-eagle-topk 1, or drop {ADAPTIVE_FLAG} for a static tree"
        )
    if cfg.speculative_adaptive_config:
        raise SpeculativeConfigError(
            f"--speculative-adaptive-config is SGLang's own policy file; with {ADAPTIVE_FLAG} the plugin writes "
            f"SGLang's candidate steps itself: drop --speculative-adaptive-config and give the steps as 'widths' in "
            f"{ADAPTIVE_CONFIG_FLAG}"
        )
    steps, tokens = cfg.speculative_num_steps, cfg.speculative_num_draft_tokens
    if steps is not None and tokens is not None and tokens != steps + 1:
        raise SpeculativeConfigError(
            f"{ADAPTIVE_FLAG} with EAGLE3 verifies chains of steps + 1 tokens, but --speculative-num-steps {steps} "
            f"and --speculative-num-draft-tokens {tokens}: drop --speculative-num-draft-tokens or set it to "
            f"{steps + 1}"
        )


def _prepare_adaptive_eagle(server_args, cfg, args, config) -> None:
    """Before SGLang resolves its speculative settings: the candidate steps (0..--speculative-num-steps, default
    0..7, or the configured widths), written as SGLang's adaptive config, and SGLang's adaptive mode turned on."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.speculative.adaptive_spec_params import adaptive_unsupported_reason

    from sglang_kimi.speculative.adaptive.config import resolve_widths, write_eagle_candidate_steps

    steps = cfg.speculative_num_steps
    if steps is None:
        steps = max(config.widths) if config.widths else DEFAULT_ADAPTIVE_EAGLE_STEPS
    widths = resolve_widths(config, steps, "EAGLE3 step count (--speculative-num-steps)")
    if max(widths) == 0:
        raise SpeculativeConfigError(
            f"{ADAPTIVE_FLAG}: the candidate widths {list(widths)} never speculate; add at least one step count > 0"
        )
    path = write_eagle_candidate_steps(widths)
    initial = config.initial_width if config.initial_width is not None else max(widths)
    declare_resolution(
        server_args,
        "sglang_kimi.adaptive_eagle",
        speculative_adaptive=True,
        speculative_adaptive_config=str(path),
        speculative_eagle_topk=1,
        speculative_num_steps=initial,
    )
    reason = adaptive_unsupported_reason(server_args)
    if reason is not None or not resolving_view(server_args).speculative_adaptive:
        raise SpeculativeConfigError(
            f"{ADAPTIVE_FLAG} with EAGLE3 runs SGLang's adaptive runtime, which refuses this server: {reason}; "
            f"drop {ADAPTIVE_FLAG} or the conflicting option"
        )
    server_args._sglang_kimi = dataclasses.replace(args, adaptive_widths=widths)
    logger.info(
        "sglang-kimi: adaptive speculation over EAGLE3 chains of up to %d steps: candidate widths %s (SGLang's "
        "adaptive runtime, the plugin's policy; starting at %d)",
        max(widths),
        list(widths),
        initial,
    )


def _resolve_adaptive(server_args, cfg, args, drafter, config) -> None:
    """The candidate widths: chain drafts 0..block-1 or tree budgets up to the budget (or the configured ones)."""
    from sglang_kimi.speculative.adaptive.config import default_tree_widths, resolve_widths

    if args.dflash_tree_budget is None:
        block = int(cfg.speculative_num_draft_tokens or drafter.block_size)
        if block < 2:
            raise SpeculativeConfigError(
                f"{ADAPTIVE_FLAG} chooses among 0..num-draft-tokens-1 drafts, but --speculative-num-draft-tokens is "
                f"{block}: raise it (e.g. to the drafter's block size)"
            )
        widths = resolve_widths(config, block - 1, "number of chain drafts (--speculative-num-draft-tokens - 1)")
        server_args._sglang_kimi = dataclasses.replace(args, dflash_tree_block=block, adaptive_widths=widths)
        mode = f"DFLASH chains of up to {block - 1} drafts"
    else:
        budget = args.dflash_tree_budget
        widths = resolve_widths(config, budget, f"tree budget ({TREE_BUDGET_FLAG})", default_tree_widths(budget))
        server_args._sglang_kimi = dataclasses.replace(args, adaptive_widths=widths)
        mode = f"DFLASH trees of up to {budget} nodes"
    logger.info("sglang-kimi: adaptive speculation over %s: candidate widths %s", mode, list(widths))


def _check_algorithm_name(name: str) -> None:
    """SGLang raises a bare ``ValueError`` (a traceback at start-up) for a name it does not know."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    try:
        SpeculativeAlgorithm.from_string(name)
    except ValueError:
        known = ", ".join(sorted(a.name for a in SpeculativeAlgorithm if a.name != "NONE"))
        raise SpeculativeConfigError(
            f"--speculative-algorithm {name} is not an algorithm SGLang knows: choose one of {known} (DFLASH with "
            f"{TREE_BUDGET_FLAG} for draft trees)"
        ) from None


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


# the algorithms SGLang drafts with EAGLE's worker, shaped by --speculative-num-steps / -eagle-topk / -num-draft-tokens
EAGLE_SHAPED_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")


def _check_eagle_shape(cfg, algorithm: str) -> None:
    """The EAGLE draft shape flags: none of them (SGLang picks), or steps with a top-k (and, for a tree, the draft
    tokens), each a count in the range SGLang can lay out. SGLang 0.5.23 dies on the other mixes with a bare
    TypeError or AssertionError at start-up, or on the first request (a tree window shorter than its steps or
    longer than its scored candidates)."""
    steps, topk, tokens = cfg.speculative_num_steps, cfg.speculative_eagle_topk, cfg.speculative_num_draft_tokens
    given = [
        f"{flag} {value}"
        for flag, value in (
            ("--speculative-num-steps", steps),
            ("--speculative-eagle-topk", topk),
            ("--speculative-num-draft-tokens", tokens),
        )
        if value is not None
    ]
    shapes = (
        "give --speculative-num-steps N with --speculative-eagle-topk 1 (a chain of N drafts), or with "
        "--speculative-eagle-topk K > 1 and --speculative-num-draft-tokens M (a tree of M drafted tokens), or none "
        "of the three (SGLang picks them)"
    )
    if steps is None and given:
        raise SpeculativeConfigError(f"{algorithm} with {' '.join(given)} but no --speculative-num-steps: {shapes}")
    if steps is not None and topk is None:
        raise SpeculativeConfigError(f"{algorithm} with {' '.join(given)} but no --speculative-eagle-topk: {shapes}")
    if topk is not None and topk > 1 and tokens is None:
        raise SpeculativeConfigError(
            f"{algorithm} tree (--speculative-eagle-topk {topk}) without --speculative-num-draft-tokens: {shapes}"
        )
    if steps is not None and steps < 0:
        raise SpeculativeConfigError(
            f"{algorithm} with --speculative-num-steps {steps}: the drafter's steps per round are a count: "
            "use 1 or more"
        )
    if topk is not None and topk < 1:
        raise SpeculativeConfigError(
            f"{algorithm} with --speculative-eagle-topk {topk}: use 1 (a chain) or more (a tree with that many "
            "children per node)"
        )
    if topk is not None and topk > 1:  # steps and tokens are given: checked above
        if steps < 1:
            raise SpeculativeConfigError(
                f"{algorithm} tree (--speculative-eagle-topk {topk}) with --speculative-num-steps {steps}: a tree "
                "is drafted in 1 or more steps"
            )
        # SGLang moves the accepted path, up to steps + 1 tokens, to the front of the request's verify window of
        # num_draft_tokens rows (_compact_accept_to_front): a shorter window failed the first verify.
        if tokens < steps + 1:
            raise SpeculativeConfigError(
                f"{algorithm} tree with --speculative-num-steps {steps} accepts up to {steps + 1} tokens a round, "
                f"which SGLang lays out in the verify window, but --speculative-num-draft-tokens is {tokens}: use "
                f"at least {steps + 1}, or fewer steps"
            )
        # The first step scores topk candidates, each later step topk x topk: the tree's drafts are the best
        # tokens - 1 of them (SGLang's organize_draft_results, a torch.topk that failed the first request when
        # asked for more than there are).
        candidates = topk + (steps - 1) * topk * topk
        if tokens - 1 > candidates:
            raise SpeculativeConfigError(
                f"{algorithm} tree with --speculative-num-steps {steps} and --speculative-eagle-topk {topk} drafts "
                f"at most {candidates} tokens ({topk} + ({steps} - 1) x {topk} x {topk}), but "
                f"--speculative-num-draft-tokens is {tokens}: use at most {candidates + 1} (the drafts and the "
                "verified token), or raise --speculative-num-steps or --speculative-eagle-topk"
            )


def _backends(cfg) -> list[tuple[str, str | None]]:
    return [
        ("--attention-backend", cfg.attention_backend),
        ("--decode-attention-backend", cfg.decode_attention_backend),
        ("--prefill-attention-backend", cfg.prefill_attention_backend),
    ]


def _check_tree_dp_attention(cfg, flag_name: str, attn_dp: int) -> None:
    """DP attention (``attn_dp`` groups): static DFLASH trees are served with it, as SGLang serves its DFLASH chains:
    each group drafts, ranks and verifies its own requests, an idle group joins the collectives with an empty
    verify. Adaptive widths are not: each group would choose its own width, and SGLang sizes every group's share of
    the DP gather with this group's one verify window."""
    where = f"DP attention (here over {attn_dp} groups: --attn-dp-size, or --dp-size with --enable-dp-attention)"
    if flag_name == ADAPTIVE_FLAG:
        raise SpeculativeConfigError(
            f"{flag_name} is not served with {where}: each attention group would choose its own width, but SGLang "
            "gives every group's share of the DP gather one verify window. Drop the flag for a fixed width "
            f"({TREE_BUDGET_FLAG} N serves DP attention), or drop DP attention"
        )
    if not getattr(cfg, "enable_dp_lm_head", False):
        raise SpeculativeConfigError(
            f"{flag_name} with {where} ranks each group's drafts with the target's LM head inside the group, which "
            "needs the head split over the attention group: add --enable-dp-lm-head"
        )


def _check_tree_verify(cfg, flag_name: str, drop: str, backends: tuple[str, ...]) -> None:
    """What the plugin's DFLASH tree worker needs, for draft trees and for adaptive widths (every width is verified
    as a tree): tree masks in the attention backends (``backends``: those of a static tree, or of a width that
    changes each step), page size 1, SGLang's KVLocPlan, the drafter's full KV cache (not SGLang's compact sliding
    window) and, under DP attention, a fixed width and a split LM head. The worker checks the backend SGLang chose,
    and the window and DP attention again, after the weights load (``workers/tree_attention.py``); here they are
    refused before."""
    window = getattr(cfg, "speculative_draft_window_size", None)  # SGLang 0.5.22+
    if window is not None:
        raise SpeculativeConfigError(
            f"{flag_name} drafts over the drafter's whole KV cache, but --speculative-draft-window-size "
            f"{window} asks for SGLang's compact sliding-window cache: drop "
            f"--speculative-draft-window-size (DFLASH chains serve it), or {drop}"
        )
    attn_dp = attention_dp_size(cfg)
    if attn_dp > 1:
        _check_tree_dp_attention(cfg, flag_name, attn_dp)
    for flag, backend in _backends(cfg):
        if backend is not None and backend not in backends:
            why = (
                "FlashAttention 3 keeps one verify width, and adaptive widths change it each step"
                if backend in STATIC_TREE_BACKENDS
                else f"{backend} verifies MLA chains only (a causal window, no tree mask)"
            )
            raise SpeculativeConfigError(
                f"{flag_name} verifies DFLASH drafts as trees, which needs an attention backend that applies tree "
                f"masks to MLA verify, but {flag} is {backend}: {why}. Use --attention-backend "
                f"{' or '.join(backends)}"
            )
    if cfg.page_size not in (None, 1):
        raise SpeculativeConfigError(
            f"{flag_name} commits the accepted path by reordering KV slots, which needs --page-size 1 "
            f"(got {cfg.page_size})"
        )
    ok, sglang_version = sglang_at_least((0, 5, 22))
    if not ok:  # the tree worker places its KV through KVLocPlan
        raise SpeculativeConfigError(
            f"{flag_name} needs SGLang 0.5.22 or later (KVIndexTranslator.plan / KVLocPlan); the installed "
            f"SGLang is {sglang_version}: upgrade SGLang, or {drop}"
        )


def _check_cpu_backends(cfg, algorithm: str | None) -> None:
    """On --device cpu: a ``triton`` backend only under Triton's interpreter (without it the first kernel launch ends
    the scheduler: "0 active drivers"), and, with a speculative algorithm, every backend of its steps (the draft
    worker's ``--speculative-draft-attention-backend`` too) serving verify and draft forwards."""
    if (cfg.device or "").lower() != "cpu":
        return
    from sglang_kimi.kernels.interpret import interpreter_requested

    backends = _backends(cfg)
    if algorithm is not None:
        backends.append(
            ("--speculative-draft-attention-backend", getattr(cfg, "speculative_draft_attention_backend", None))
        )
    for flag, backend in backends:
        if backend == "triton" and not interpreter_requested():
            raise SpeculativeConfigError(
                f"{flag} triton on --device cpu runs Triton kernels, which need a GPU or Triton's interpreter: set "
                "TRITON_INTERPRET=1 (float32, slow: for testing the GPU kernels on CPU), or use "
                f"{flag} {KIMI_CPU_BACKEND}"
            )
        if algorithm is not None and backend is not None and backend not in CPU_SPECULATIVE_BACKENDS:
            raise SpeculativeConfigError(
                f"--speculative-algorithm {algorithm} on --device cpu needs attention backends that serve "
                f"verify and draft forwards, but {flag} is {backend}: use {flag} "
                f"{' or '.join(CPU_SPECULATIVE_BACKENDS)} (triton only under TRITON_INTERPRET=1)"
            )


REJECTION_SAMPLING_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")  # the draft workers that give SGLang's sampler q


def _check_rejection_sampling(cfg, algorithm: str | None) -> None:
    """``--speculative-use-rejection-sampling`` is read only by SGLang's EAGLE draft workers (it verifies a chain
    against the drafter's probabilities). DFLASH, NGRAM and a launch without speculation served with the flag set
    and never read it; SGLang itself refuses it for its other algorithms."""
    if not getattr(cfg, "speculative_use_rejection_sampling", False) or algorithm in REJECTION_SAMPLING_ALGORITHMS:
        return
    if algorithm is None:
        return  # refused with the other speculative flags (_check_unused_speculative_flags)
    why = (
        "the plugin verifies DFLASH's sampled requests losslessly without it (the target-only rule, every device)"
        if algorithm == "DFLASH"
        else f"{algorithm} does not read it"
    )
    raise SpeculativeConfigError(
        f"--speculative-use-rejection-sampling with --speculative-algorithm {algorithm}: SGLang applies it to "
        f"EAGLE / EAGLE3 / NEXTN chains only and {why}: drop the flag"
    )


# SGLang's --speculative-* flags that one algorithm family alone reads (by field-name prefix), and flags that named
# algorithms never read; a flag outside these is left to SGLang
FLAG_FAMILIES = (("speculative_ngram_", "NGRAM"), ("speculative_dflash_", "DFLASH"), ("speculative_dspark_", "DSPARK"))
UNREAD_BY = {"speculative_token_map": ("DFLASH", "NGRAM")}  # EAGLE's reduced draft vocabulary


def _given_speculative_flags(server_args) -> dict[str, str]:
    """field -> flag of every ``--speculative-*`` flag given a value other than SGLang's parser default (the raw
    values given: SGLang's resolution writes its decisions apart), ``--speculative-algorithm`` and the plugin's own
    flags (kept apart from SGLang's record, checked by their own rules) left out."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(parser)
    given = {}
    for action in parser._actions:
        name = action.dest
        if not name.startswith("speculative_") or name == "speculative_algorithm" or not hasattr(server_args, name):
            continue
        if getattr(server_args, name) != action.default:
            given[name] = action.option_strings[0] if action.option_strings else name
    return given


def _check_unused_speculative_flags(server_args, algorithm: str | None) -> None:
    """SGLang served without a word flags it never read: every ``--speculative-*`` flag without
    ``--speculative-algorithm`` (a drafter path or steps given alone served autoregressively), and with one, the
    flags of another algorithm family (``--speculative-ngram-*`` outside NGRAM, SGLang's ``--speculative-dflash-*``
    outside DFLASH, ...) and EAGLE's ``--speculative-token-map`` with DFLASH or NGRAM."""
    given = _given_speculative_flags(server_args)
    if algorithm is None:
        unread = list(given.values())
    else:
        unread = []
        for name, flag in given.items():
            owners = [reader for prefix, reader in FLAG_FAMILIES if name.startswith(prefix)]
            if owners and algorithm not in owners:
                unread.append(f"{flag} ({owners[0]}'s)")
            elif algorithm in UNREAD_BY.get(name, ()):
                unread.append(f"{flag} (EAGLE's)")
    if not unread:
        return
    them = "it" if len(unread) == 1 else "them"
    if algorithm is None:
        raise SpeculativeConfigError(
            f"{', '.join(unread)} given without --speculative-algorithm: SGLang then serves without speculative "
            f"decoding and never reads {them}: add --speculative-algorithm (DFLASH or EAGLE3 for Kimi's drafters), "
            f"or drop {them}"
        )
    raise SpeculativeConfigError(
        f"{', '.join(unread)} given with --speculative-algorithm {algorithm}, which never reads {them} (SGLang "
        f"served without {them}): drop {them}"
    )


def _check_dflash_eagle_flags(cfg) -> None:
    """EAGLE's draft-shape flags with DFLASH: SGLang drafts a DFLASH block in one forward and overrides
    ``--speculative-num-steps`` and ``--speculative-eagle-topk`` to 1 with a log warning, so a tree asked for the
    EAGLE way was served as a chain."""
    given = [
        f"{flag} {value}"
        for flag, value in (
            ("--speculative-num-steps", cfg.speculative_num_steps),
            ("--speculative-eagle-topk", cfg.speculative_eagle_topk),
        )
        if value is not None and int(value) != 1
    ]
    if given:
        raise SpeculativeConfigError(
            f"{' and '.join(given)} do{'es' if len(given) == 1 else ''} not apply to --speculative-algorithm DFLASH, "
            "which drafts its whole block (--speculative-num-draft-tokens) in one forward: SGLang would set "
            f"{'it' if len(given) == 1 else 'them'} to 1 and serve a chain. For DFLASH draft trees pass "
            f"{TREE_BUDGET_FLAG} N; otherwise drop {'it' if len(given) == 1 else 'them'}"
        )


def _check_accept_thresholds(cfg, algorithm: str, args) -> None:
    """SGLang's relaxed acceptance (``--speculative-accept-threshold-single/-acc`` below 1) runs only in its CUDA
    tree-sampling kernel. Refused where it would not be what was asked: DFLASH draft trees and adaptive DFLASH (the
    plugin's tree verify has the lossless rule only) on every device, and any algorithm on CPU and ROCm, where
    sampled requests would be verified greedily (the target's argmax, not a sample). On CUDA it is served, logged
    as not lossless."""
    from sglang.srt.utils import is_hip

    single, acc = cfg.speculative_accept_threshold_single, cfg.speculative_accept_threshold_acc
    if single in (None, 1.0) and acc in (None, 1.0):
        return
    given = f"--speculative-accept-threshold-single {single} / --speculative-accept-threshold-acc {acc}"
    if algorithm == "DFLASH" and (args.dflash_tree_budget is not None or args.adaptive):
        raise SpeculativeConfigError(
            f"{given}: DFLASH draft trees and adaptive widths verify sampled requests with the lossless rule only "
            "(the plugin's tree verify has no relaxed acceptance): drop both thresholds"
        )
    kind = (cfg.device or "").lower()
    device = "CPU" if kind == "cpu" else "ROCm" if is_hip() else None
    if device is not None:
        raise SpeculativeConfigError(
            f"{given}: SGLang's relaxed acceptance runs only in its CUDA sampling kernel; on {device} sampled "
            "requests would be verified greedily (the target's argmax, not a sample): drop both thresholds (sampled "
            "requests are then verified losslessly)"
        )
    if kind not in ("", "cuda"):
        raise SpeculativeConfigError(
            f"{given}: SGLang's relaxed acceptance runs only in its CUDA sampling kernel, which --device {kind} does "
            "not have: drop both thresholds"
        )
    from sglang_kimi.platform.capabilities import flashinfer_installed

    if not flashinfer_installed():
        raise SpeculativeConfigError(
            f"{given}: SGLang's relaxed acceptance runs only in its CUDA sampling kernel, which it builds from "
            "FlashInfer's headers, and FlashInfer is not installed (the plugin then verifies sampled requests with "
            "the lossless rule): install FlashInfer (pip install flashinfer-python), or drop both thresholds"
        )
    logger.warning(
        "sglang-kimi: %s: sampled requests are accepted with SGLang's relaxed rule, so their tokens do not follow the "
        "target's distribution (greedy requests are unaffected)",
        given,
    )


def _check_tree_drafter(drafter) -> None:
    """DFLASH draft trees need per-position probabilities to rank; a DFlash2 drafter's selector scores each draft
    token given the one before it, which a DDTree does not rank (its chains are served, adaptive ones too)."""
    if drafter is not None and getattr(drafter, "has_selector", False):
        raise SpeculativeConfigError(
            f"{TREE_BUDGET_FLAG}: a DFlash2 drafter ({', '.join(drafter.architectures)}, candidate selector of rank "
            f"{drafter.selector_rank} over the top {drafter.selector_top_k}) is not served as a DDTree: its selector "
            "scores each draft token given the draft before it (an edge between consecutive positions' candidates), "
            "and a DDTree ranks each position's tokens on their own. Drop the flag for SGLang's DFlash2 chains, or "
            f"replace it with {ADAPTIVE_FLAG} for adaptive widths over them"
        )


def _resolve_speculative(original, server_args):
    """Around SGLang's ``handle_speculative_decoding``: the plugin's checks before, tree resolution after."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    cfg = resolving_view(server_args)
    args = plugin_args(server_args)
    algorithm = (cfg.speculative_algorithm or "").upper() or None
    if algorithm is not None:
        _check_algorithm_name(cfg.speculative_algorithm)
    _check_cpu_backends(cfg, algorithm)
    _check_unused_speculative_flags(server_args, algorithm)
    _check_rejection_sampling(cfg, algorithm)
    check_environment()
    # a registration's failure would only be logged; the attention backends are resolved by now
    draft_kv_dtype = (
        getattr(cfg, "speculative_draft_kv_cache_dtype", None) if algorithm not in (None, "NGRAM") else None
    )
    kv_scales.check_launch(cfg, draft_kv_dtype)
    if algorithm is not None:
        _check_accept_thresholds(cfg, algorithm, args)
    if args.dflash_tree_budget is not None:
        _check_tree_budget(args.dflash_tree_budget, algorithm)
        _check_tree_verify(cfg, TREE_BUDGET_FLAG, "drop the flag for DFLASH chains", STATIC_TREE_BACKENDS)
    adaptive = None
    if args.adaptive or args.adaptive_config or args.adaptive_profile:
        adaptive = _check_adaptive(cfg, algorithm, args)
    if algorithm is not None and debug_greedy_verify():
        logger.warning(
            "sglang-kimi: %s=1: sampled requests are verified GREEDILY (debugging only; output is not lossless)",
            DEBUG_GREEDY_VERIFY_ENV,
        )
    drafter = None
    if algorithm in EAGLE_SHAPED_ALGORITHMS and not args.adaptive and not getattr(cfg, "speculative_adaptive", False):
        _check_eagle_shape(cfg, algorithm)
    if algorithm == "DFLASH":
        _check_dflash_eagle_flags(cfg)
    if algorithm in ("DFLASH", "EAGLE3"):
        drafter_checks.check_draft_path(cfg.speculative_draft_model_path, algorithm)
        drafter = drafter_checks.check_pair(cfg, algorithm)
    if algorithm == "DFLASH" and args.dflash_tree_budget is not None:
        _check_tree_drafter(drafter)
    if algorithm in drafter_checks.OTHER_DRAFTING_ALGORITHMS:
        drafter_checks.check_other_drafter(cfg, algorithm)
    if algorithm == "NGRAM" and cfg.speculative_draft_model_path:
        raise SpeculativeConfigError(
            f"--speculative-algorithm NGRAM drafts from n-grams of the request itself and loads no drafter, but "
            f"--speculative-draft-model-path is {cfg.speculative_draft_model_path}: drop it, or pass "
            "--speculative-algorithm DFLASH or EAGLE3 for that drafter"
        )

    if args.adaptive and algorithm == "EAGLE3":
        _prepare_adaptive_eagle(server_args, cfg, args, adaptive)

    try:
        original(server_args)
    except ValueError as e:  # SGLang's own refusal of a setting, printed alone like the plugin's
        if isinstance(e, _startup_error_types()):
            raise
        raise SpeculativeConfigError(f"SGLang refused the speculative settings: {e}") from e

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
    if args.adaptive and algorithm == "EAGLE3":
        if not resolving_view(server_args).speculative_adaptive:  # SGLang switched its adaptive mode off
            raise SpeculativeConfigError(
                f"{ADAPTIVE_FLAG} with EAGLE3 needs SGLang's adaptive runtime, which this server's settings turned "
                f"off (see SGLang's warning above): drop {ADAPTIVE_FLAG} or the conflicting option"
            )
    elif args.adaptive:
        _resolve_adaptive(server_args, resolving_view(server_args), plugin_args(server_args), drafter, adaptive)
    if algorithm is not None:
        _check_dispatch_capacity(server_args, args)


def _check_dispatch_capacity(server_args, args) -> None:
    """The largest verify forward against the expert-parallel all-to-all's buffer, on the resolved settings."""
    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = resolving_view(server_args)
    window = int(cfg.speculative_num_draft_tokens or 1)
    try:  # SGLang 0.5.23: the largest window an adaptive algorithm may switch to
        from sglang.srt.arg_groups.overrides import max_speculative_num_draft_tokens

        window = max(window, int(max_speculative_num_draft_tokens(server_args) or 1))
    except ImportError:
        pass
    if args.dflash_tree_budget is not None:
        window_from = f"{TREE_BUDGET_FLAG} {args.dflash_tree_budget}, plus the verified token"
    else:
        window_from = f"--speculative-num-draft-tokens {window}"
    check_dispatch_capacity(cfg, window, window_from)


def install_validation(target: str):
    hook(target, _resolve_speculative, "AROUND")


# ---------------------------------------------------------------------------------------------------------------
# A refused start-up prints its message alone: the launcher raises the error out of SGLang's argument resolution,
# where Python would print a full traceback above the one line that matters.

STARTUP_ERRORS = (SpeculativeConfigError,)


def _startup_error_types() -> tuple[type, ...]:
    from sglang_kimi.speculators.configs import DrafterConfigError
    from sglang_kimi.speculators.pairing import DrafterMismatchError

    return (*STARTUP_ERRORS, DrafterConfigError, DrafterMismatchError, kv_scales.KVScalesError)


def _print_startup_error(previous):
    def excepthook(kind, value, traceback):
        if issubclass(kind, _startup_error_types()):
            import sys

            print(f"sglang-kimi: error: {value}", file=sys.stderr, flush=True)
            return
        previous(kind, value, traceback)

    excepthook.sglang_kimi = True
    return excepthook


def install_startup_error_printer(target: str):
    """``sys.excepthook``: an uncaught start-up error of the plugin (a setting that cannot be served, a drafter that
    does not fit) prints ``sglang-kimi: error: <message>`` without a traceback; every other exception as before."""
    import sys

    if not getattr(sys.excepthook, "sglang_kimi", False):
        sys.excepthook = _print_startup_error(sys.excepthook)
