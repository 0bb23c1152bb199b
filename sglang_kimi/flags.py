"""The plugin's server flags in SGLang's own parser (so ``python -m sglang.launch_server --help`` lists them)."""

from __future__ import annotations

from sglang_kimi.hooks import hook
from sglang_kimi.options import MAX_TREE_BUDGET, TREE_BUDGET_FLAG, TREE_MASK_BACKENDS, PluginArgs


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


def install_flag_help(target: str):
    hook(target, _add_plugin_flags, "AFTER")


def install_flag_parse(target: str):
    hook(target, _plugin_args_from_cli, "AROUND")
