"""The plugin's server flags in SGLang's own parser (so ``python -m sglang.launch_server --help`` lists them)."""

from __future__ import annotations

from sglang_kimi.hooks import hook
from sglang_kimi.settings import (
    ADAPTIVE_CONFIG_FLAG,
    ADAPTIVE_FLAG,
    ADAPTIVE_PROFILE_FLAG,
    MAX_TREE_BUDGET,
    STATIC_TREE_BACKENDS,
    TREE_BUDGET_FLAG,
    TREE_MASK_BACKENDS,
    PluginArgs,
)


def _add_plugin_flags(result, parser):
    group = parser.add_argument_group("sglang-kimi", "Options added by the sglang-kimi plugin.")
    group.add_argument(
        TREE_BUDGET_FLAG,
        type=int,
        default=None,
        metavar="N",
        help="DFLASH draft trees (DDTree): verify the N most likely draft prefixes of each DFlash block as one tree "
        f"instead of a chain (1..{MAX_TREE_BUDGET}; the verify window is N + 1 tokens). Needs an attention backend "
        f"that applies tree masks: {', '.join(STATIC_TREE_BACKENDS)} ({', '.join(TREE_MASK_BACKENDS)} with "
        f"{ADAPTIVE_FLAG}).",
    )
    group.add_argument(
        ADAPTIVE_FLAG,
        action="store_true",
        help="Adaptive speculation: choose each decode step's draft width for its batch size from the measured "
        "acceptance by draft position and the measured cost of a step (profiled at start-up, refined online). "
        "DFLASH chains: 0..num-draft-tokens-1 drafts; DFLASH trees: budgets up to "
        f"{TREE_BUDGET_FLAG}; EAGLE3 chains (topk 1): steps, through SGLang's own adaptive runtime. Width 0 "
        "(no speculation) is chosen where no width pays for itself. Output is unchanged (every width is verified "
        "losslessly). Reported in /server_info and Prometheus.",
    )
    group.add_argument(
        ADAPTIVE_CONFIG_FLAG,
        default=None,
        metavar="PATH",
        help="JSON settings of the adaptive policy: widths, buckets (batch sizes), explore_every, hysteresis, "
        "acceptance_decay, cost_decay, initial_width, profile_repeats (docs/adaptive.md). Default: every width, "
        "power-of-two buckets up to --max-running-requests.",
    )
    group.add_argument(
        ADAPTIVE_PROFILE_FLAG,
        default=None,
        metavar="PATH",
        help="Where the cost profile (the start-up profile and, saved once a minute while serving, the real "
        "steps' timings) is kept and reused at the next start (keyed by device, model, drafter and "
        "parallelism; a profile made for another setup is logged and replaced; a file that cannot be written is "
        "refused at start-up). Default: one file per setup "
        "under $XDG_CACHE_HOME/sglang-kimi/cost-profiles (~/.cache when unset).",
    )
    return result


def _plugin_args_from_cli(original, cls, args):
    server_args = original(cls, args)
    server_args._sglang_kimi = PluginArgs(
        dflash_tree_budget=getattr(args, "speculative_dflash_tree_budget", None),
        adaptive=bool(getattr(args, "speculative_kimi_adaptive", False)),
        adaptive_config=getattr(args, "speculative_kimi_adaptive_config", None),
        adaptive_profile=getattr(args, "speculative_kimi_adaptive_profile", None),
    )
    return server_args


def install_flag_help(target: str):
    hook(target, _add_plugin_flags, "AFTER")


def install_flag_parse(target: str):
    hook(target, _plugin_args_from_cli, "AROUND")
