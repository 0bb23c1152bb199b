"""The plugin's own server options and switches (a leaf module: imports nothing of the plugin).

``--speculative-dflash-tree-budget N`` (added to SGLang's parser by ``parser_flags.py``) switches DFLASH to DDTree draft
trees; ``--speculative-kimi-adaptive`` chooses the draft width of every step from measured acceptance and cost.
SGLang's ``ServerArgs`` is a closed record, so the plugin's values ride on it as bookkeeping
(``server_args._sglang_kimi``, pickled into every subprocess like SGLang's own ``_launch_command``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TREE_BUDGET_FLAG = "--speculative-dflash-tree-budget"
ADAPTIVE_FLAG = "--speculative-kimi-adaptive"
ADAPTIVE_CONFIG_FLAG = "--speculative-kimi-adaptive-config"
ADAPTIVE_PROFILE_FLAG = "--speculative-kimi-adaptive-profile"
# A verify window of budget + 1 <= 64 nodes: one 64-bit ancestor-mask word per node (kernels/tree_mla_attention).
MAX_TREE_BUDGET = 63
# Attention backends that apply a tree mask to MLA verify (TARGET_VERIFY with a FULL_MASK custom mask) at any verify
# width, and those that serve a static tree's fixed width too (fa3: SGLang's EAGLE-tree path on Hopper). FlashInfer-
# MLA, trtllm-mla, FlashMLA, cutedsl-mla and AITER verify chains only with Kimi's MLA
# (speculative/workers/tree_attention.py).
TREE_MASK_BACKENDS = ("triton", "kimi_cpu")
STATIC_TREE_BACKENDS = (*TREE_MASK_BACKENDS, "fa3")
# Attention backends that serve speculative decoding (TARGET_VERIFY, draft extend, EAGLE multi-step draft, DFLASH's
# non-causal draft block) on --device cpu: the plugin's kimi_cpu, and triton under TRITON_INTERPRET=1. SGLang's
# torch_native has no TARGET_VERIFY (the first verify fails in _run_sdpa_forward_extend) and intel_amx needs the
# compiled CPU sgl_kernel.
CPU_SPECULATIVE_BACKENDS = ("kimi_cpu", "triton")

# Debugging only: makes every plugin verification greedy, even for sampled requests (NOT lossless). It exists so
# that tests and the GSM8K gate can show they fail on a broken verifier; a warning is logged at start-up.
DEBUG_GREEDY_VERIFY_ENV = "SGLANG_KIMI_DEBUG_GREEDY_VERIFY"
# A DFLASH tree server's drafter graphs (speculative/workers/drafter_graph.py): unset or 1 captured, 0 the drafter
# eager, check captured and every replayed draft recomputed eagerly (a GPU check, not for serving).
DRAFT_GRAPHS_ENV = "SGLANG_KIMI_DRAFT_GRAPHS"
DRAFT_GRAPHS_VALUES = ("", "1", "0", "check")
# Recording only: a file a DFLASH tree server appends each request's accepted path of every step to
# (speculative/acceptance_trace.py; scripts/record_acceptance.py reads it).
ACCEPTANCE_TRACE_ENV = "SGLANG_KIMI_ACCEPTANCE_TRACE"
# 0: the hardening group (hardening/registrations.py) is not registered and SGLang's own API behaviour stays.
HARDENING_ENV = "SGLANG_KIMI_HARDENING"


@dataclass(frozen=True)
class PluginArgs:
    """The plugin's own server options (set from the command line, completed at start-up)."""

    dflash_tree_budget: int | None = None  # DDTree nodes below the root; None = DFlash chains
    dflash_tree_block: int | None = None  # the drafter's block in tree mode (resolved at start-up)
    adaptive: bool = False  # choose the draft width per batch bucket (speculators/policy.py)
    adaptive_config: str | None = None  # JSON policy settings (speculative/adaptive/config.py)
    adaptive_profile: str | None = None  # cost-profile file (speculative/adaptive/profile.py); None: default cache
    adaptive_widths: tuple[int, ...] | None = None  # candidate widths (resolved at start-up)


def plugin_args(server_args) -> PluginArgs:
    return getattr(server_args, "_sglang_kimi", None) or PluginArgs()


def attention_dp_size(cfg) -> int:
    """The attention data-parallel width of SGLang's resolved settings ``cfg``: 0.5.23 rewrites ``--dp-size N
    --enable-dp-attention`` into ``attn_dp_size = N`` (and the flag off) before the speculative settings are
    resolved, and takes ``--attn-dp-size N`` as it is; earlier releases keep the flag with ``dp_size``."""
    width = int(getattr(cfg, "attn_dp_size", 1) or 1)
    if getattr(cfg, "enable_dp_attention", False):
        width = max(width, int(getattr(cfg, "dp_size", 1) or 1), 2)
    return width


def debug_greedy_verify() -> bool:
    return os.environ.get(DEBUG_GREEDY_VERIFY_ENV, "0") == "1"
