"""AITER / FlyDSL environment overrides for the MoE at the speculative-verify shape on ROCm.

On ROCm, SGLang's MoE runs AITER's 2-stage fused MoE (``aiter.fused_moe``; FlyDSL kernels on gfx94x/gfx95x).
Its tile choices were made for decode (M = batch) and prefill; speculative verify runs it at M = batch x 4..16.
Two switches are published for exactly this case, from AMD's Kimi-K2.5 (W4A8, EAGLE3 with 4 draft tokens, i.e. M = 4
tokens per request at verify) TPOT study on MI308X, "Kimi-K2.5 TPOT optimization summary" (amd-afde.top,
BD-study/kimi-k2.5), which reports a -17.2% median TPOT for five patches, two of them behind these variables:

============================  =====  ==================================================================
variable                      value  effect (per that report)
============================  =====  ==================================================================
AITER_FLYDSL_STAGE2_TILE_K    256    stage-2 (down-projection) MoE GEMM tile_k forced to 256 (AITER 511df6a)
FLYDSL_MOE_STAGE1_SCHED       0      stage-1 MoE GEMM without the manual scheduler hints (sched_barrier /
                                     sched_mfma / ...); LLVM's own schedule is faster at M=4 (FlyDSL a1d8312)
============================  =====  ==================================================================

Caveats, stated plainly: both variables are read by the AITER / FlyDSL revisions named above; a build without those
changes ignores them (setting them is then harmless and changes nothing). Their numbers were measured on MI308X
with W4A8 weights; on MI300X/MI325X/MI350X they are starting points to confirm with ``bench/bench_kernels.py``.

Rules: applied only on ROCm (``torch.version.hip``), never over a value the user set (the user's value is reported
as such), and all of them can be turned off with ``SGLANG_KIMI_AITER_OVERRIDES=0``. AITER reads some switches when it
is imported, so :func:`apply_aiter_env` must run before SGLang imports AITER: the plugin calls it from
``register()``, which SGLang runs in each process before building the model; if AITER was already imported, the
state records that the values may come too late.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

DISABLE_ENV = "SGLANG_KIMI_AITER_OVERRIDES"
OFF_VALUES = ("0", "false", "no", "off")  # DISABLE_ENV values (lower-cased) that turn the overrides off
SOURCE = "AMD Kimi-K2.5 TPOT optimization report (MI308X, W4A8, EAGLE3 4 draft tokens; amd-afde.top BD-study)"


@dataclass(frozen=True)
class EnvOverride:
    name: str
    value: str
    why: str


AITER_ENV_OVERRIDES: tuple[EnvOverride, ...] = (
    EnvOverride(
        "AITER_FLYDSL_STAGE2_TILE_K",
        "256",
        "stage-2 MoE GEMM tile_k 256 at the verify shape (AITER 511df6a)",
    ),
    EnvOverride(
        "FLYDSL_MOE_STAGE1_SCHED",
        "0",
        "stage-1 MoE GEMM without manual scheduler hints: faster at M=4 per request (FlyDSL a1d8312)",
    ),
)

# name -> {"value", "set_by": "plugin" | "user", "why", "note"}; filled by apply_aiter_env() in this process
APPLIED: dict[str, dict] = {}


def _is_rocm() -> bool:
    import torch

    return bool(getattr(torch.version, "hip", None))


def apply_aiter_env(environ=None, is_rocm: bool | None = None):
    """Set the AITER overrides the user has not set. Returns None, or why it skipped.

    ``environ`` and ``is_rocm`` exist for tests (default: ``os.environ`` and ``torch.version.hip``).
    """
    env = os.environ if environ is None else environ
    rocm = _is_rocm() if is_rocm is None else is_rocm
    if not rocm:
        return "not ROCm (torch.version.hip is unset)"
    if env.get(DISABLE_ENV, "1").lower() in OFF_VALUES:
        return f"disabled by {DISABLE_ENV}={env[DISABLE_ENV]}"
    late = "aiter" in sys.modules
    for o in AITER_ENV_OVERRIDES:
        if o.name in env:
            APPLIED[o.name] = {"value": env[o.name], "set_by": "user", "why": o.why, "note": ""}
            continue
        env[o.name] = o.value
        APPLIED[o.name] = {
            "value": o.value,
            "set_by": "plugin",
            "why": o.why,
            "note": "set after aiter was imported: values aiter reads at import are not affected" if late else "",
        }
    return None


def aiter_override_state() -> list[dict]:
    """What the AITER overrides did in this process, for ``active_overrides``."""
    if not APPLIED:
        return [
            {
                "kind": "aiter-env",
                "active": False,
                "why": "not applied in this process (not ROCm, disabled, or apply_aiter_env() not called)",
            }
        ]
    return [
        {"kind": "aiter-env", "name": name, "active": True, "source": SOURCE, **state}
        for name, state in sorted(APPLIED.items())
    ]


def install_aiter_env(target: str):
    """Table entry ``aiter-verify-env`` (its target is the environment, nothing in SGLang)."""
    return apply_aiter_env()
