"""Triton kernels for Kimi speculative verify, each with a torch twin (the CPU path and test oracle), and the MoE /
AITER tuning overrides.

- ``tree_mla_attention``: tree-masked absorbed-MLA attention over the paged latent cache (split-KV prefix + tree
  part merged by log-sum-exp); twin ``tree_mla_attention_ref`` (what the ``kimi_cpu`` backend runs).
- ``tree_verify``: greedy and target-only sampled tree verification in SGLang's layout; the algorithm, its twin and
  the entry point that launches it are ``speculators/verify.py``.
- ``ddtree_build``: best-first DDTree construction, one program per request; the algorithm and its twin are
  ``speculators/ddtree.py``.
- ``moe_configs``: fused-MoE Triton config tables for the verify shapes and the ``get_moe_configs`` hook that serves
  them; ``moe_tuner``: ``sglang-kimi tune moe``, the offline sweep that writes them.
- ``aiter_overrides``: AITER environment switches for the verify shape on ROCm.
- ``interpret``: running the kernels on CPU tensors through Triton's interpreter (tests only).
- ``resource_report``: compile the kernels offline for sm_90 / gfx942 / gfx950; registers, spills, shared memory.

Importing this package is cheap: no module here imports triton or SGLang until used.
"""

from __future__ import annotations


def active_overrides() -> list[dict]:
    """What the kernel-side overrides do in this process, and why (for ``sglang-kimi doctor``).

    One dict per item, each with ``kind`` ("moe-config" | "aiter-env"), ``active`` and ``why``; MoE rows name the
    table key and file, AITER rows the variable, its value and who set it (``set_by``: "plugin" or "user").
    """
    from sglang_kimi.kernels.aiter_overrides import aiter_override_state
    from sglang_kimi.kernels.moe_configs import moe_override_state

    return moe_override_state() + aiter_override_state()
