"""The plugin's environment variables, checked once at start-up, before any weight loads.

Each variable is read where it acts (``models/kv_scales.py``, ``models/cost_probe.py``, ``settings.py``,
``kernels/aiter_overrides.py``, ``kernels/moe_configs.py``), and each of those reads an unexpected spelling as
"unset": a misspelt name (``SGLANG_KIMI_KV_SCALE``), a value outside the ones it knows
(``SGLANG_KIMI_DEBUG_GREEDY_VERIFY=true``) or a table folder that does not exist served without a word.
:func:`check_environment` refuses those, naming the fix. ``SGLANG_KIMI_KV_SCALES`` has its own check
(``kv_scales.check_setting`` and ``check_kv_dtype``).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping

from sglang_kimi.errors import SpeculativeConfigError
from sglang_kimi.kernels.aiter_overrides import DISABLE_ENV as AITER_OVERRIDES_ENV
from sglang_kimi.kernels.aiter_overrides import OFF_VALUES as AITER_OFF_VALUES
from sglang_kimi.kernels.moe_configs import USER_DIR_ENV as MOE_CONFIG_DIR_ENV
from sglang_kimi.kernels.moe_configs import user_table_dir
from sglang_kimi.models.cost_probe import ENV as COST_PROBE_ENV
from sglang_kimi.models.kv_scales import ENV as KV_SCALES_ENV
from sglang_kimi.settings import (
    ACCEPTANCE_TRACE_ENV,
    DEBUG_GREEDY_VERIFY_ENV,
    DRAFT_GRAPHS_ENV,
    DRAFT_GRAPHS_VALUES,
    HARDENING_ENV,
)

PREFIX = "SGLANG_KIMI_"
AITER_ON_VALUES = ("1", "true", "yes", "on")  # aiter_overrides keeps the overrides for any value not off

# name -> what it takes (for the errors)
VARIABLES = {
    KV_SCALES_ENV: "a calibrate-kv scale file, or dynamic / observe / off",
    DEBUG_GREEDY_VERIFY_ENV: "1 (debugging only: sampled requests verified greedily) or 0",
    AITER_OVERRIDES_ENV: "0 to turn the ROCm AITER overrides off, 1 to keep them",
    MOE_CONFIG_DIR_ENV: "the folder of `sglang-kimi tune moe` tables",
    HARDENING_ENV: "0 to leave SGLang's own API behaviour (the hardening group off), 1 to keep the fixes",
    COST_PROBE_ENV: "1 to time every forward and count the experts each MoE layer reads (bench/bench_step_cost.py)",
    DRAFT_GRAPHS_ENV: "0 to run a DFLASH tree server's drafter eager, check to recompute each replayed draft, or 1",
    ACCEPTANCE_TRACE_ENV: "a file to append each tree step's accepted paths to (scripts/record_acceptance.py)",
}


class EnvironmentSettingError(SpeculativeConfigError):
    """A plugin environment variable that would be read as unset; the message names the fix."""


def _sglang_variables() -> set[str]:
    """SGLang's own variables under the plugin's prefix (its Kimi-K3 switches), declared in ``sglang.srt.environ``."""
    try:
        from sglang.srt.environ import envs
    except ImportError:
        return set()
    return {name for name in dir(type(envs)) if name.startswith(PREFIX)}


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`EnvironmentSettingError` for a plugin variable the plugin would read as unset."""
    env = os.environ if environ is None else environ
    for name in sorted(n for n in env if n.startswith(PREFIX) and n not in VARIABLES):
        close = difflib.get_close_matches(name, VARIABLES, n=1, cutoff=0.85)
        if close and name not in _sglang_variables():
            raise EnvironmentSettingError(
                f"{name} is not a variable sglang-kimi reads: did you mean {close[0]} ({VARIABLES[close[0]]})? "
                f"Rename it, or unset it"
            )
    greedy = env.get(DEBUG_GREEDY_VERIFY_ENV, "")
    if greedy not in ("", "0", "1"):
        raise EnvironmentSettingError(
            f"{DEBUG_GREEDY_VERIFY_ENV}={greedy}: only 1 turns it on (sampled requests verified greedily, not "
            f"lossless): set 1 or 0, or unset it"
        )
    probe = env.get(COST_PROBE_ENV, "")
    if probe not in ("", "0", "1"):
        raise EnvironmentSettingError(
            f"{COST_PROBE_ENV}={probe}: only 1 turns the cost probe on (forwards timed between device "
            f"synchronisations): set 1 or 0, or unset it"
        )
    graphs = env.get(DRAFT_GRAPHS_ENV, "")
    if graphs not in DRAFT_GRAPHS_VALUES:
        raise EnvironmentSettingError(
            f"{DRAFT_GRAPHS_ENV}={graphs}: set 1 (the DFLASH tree drafter's CUDA graphs, the default), 0 (the drafter "
            f"eager) or check (graphs, each replayed draft recomputed eagerly), or unset it"
        )
    trace = env.get(ACCEPTANCE_TRACE_ENV, "")
    if trace and not os.path.isdir(os.path.dirname(os.path.abspath(trace))):
        raise EnvironmentSettingError(
            f"{ACCEPTANCE_TRACE_ENV}={trace}: its folder does not exist; name a file in an existing folder, or unset it"
        )
    hardening = env.get(HARDENING_ENV, "")
    if hardening not in ("", "0", "1"):
        raise EnvironmentSettingError(
            f"{HARDENING_ENV}={hardening}: set 0 to turn the hardening fixes off (SGLang's own API behaviour), 1 to "
            f"keep them, or unset it"
        )
    aiter = env.get(AITER_OVERRIDES_ENV)  # lower-cased, as aiter_overrides reads it
    if aiter and aiter.lower() not in AITER_ON_VALUES + AITER_OFF_VALUES:
        raise EnvironmentSettingError(
            f"{AITER_OVERRIDES_ENV}={env[AITER_OVERRIDES_ENV]}: set 0 (or false / no / off) to turn the AITER "
            f"overrides off, 1 to keep them"
        )
    if MOE_CONFIG_DIR_ENV in env and not user_table_dir(env).is_dir():  # the folder moe_configs reads
        raise EnvironmentSettingError(
            f"{MOE_CONFIG_DIR_ENV}={env[MOE_CONFIG_DIR_ENV]} is not a folder, so no tuned MoE table would be read "
            f"from it: point it at the folder `sglang-kimi tune moe` wrote (a path as it is: no ~), or unset it"
        )
