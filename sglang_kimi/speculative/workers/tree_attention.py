"""The target's verify attention on a DFLASH tree server: the backend that runs ``TARGET_VERIFY`` must apply the
tree mask, or the verify sees every node attend to the nodes before it in the window (siblings included) and the
output differs from the non-speculative server's.

Which backends apply it (MLA, Kimi-K2.6's attention), read from the installed SGLang:

- ``triton`` and the plugin's ``kimi_cpu``: a FULL_MASK custom mask at any verify width (the tree worker writes the
  tree blocks in place, ``tree_verify_inputs.write_tree_mask``);
- ``fa3`` (FlashAttention 3, Hopper): through the path SGLang built for EAGLE trees (topk > 1). Its target verify
  then attends in two parts merged by their log-sum-exps: every node over the committed prefix, and each node
  alone over the window's slots its mask row selects, taken from the FULL_MASK by index arithmetic
  (``FlashAttentionBackend.init_forward_metadata``'s ``mask_extraction_indices``; ``tests/unit/
  test_tree_attention.py`` runs it on the plugin's mask and gets each node's ancestors back). The backend keeps
  one verify width, the one it was built with (``speculative_num_draft_tokens``: budget + 1), so FA3 serves static
  trees, not adaptive widths. :func:`prepare_tree_verify` switches that path on for the target's backend; the
  backend's ``topk`` is otherwise read only by EAGLE's multi-step draft decode, which a DFLASH target never runs;
- FlashInfer-MLA, FlashMLA, TRT-LLM MLA and cutedsl-MLA verify MLA chains only (a causal window, no custom mask),
  and AITER on ROCm likewise: refused.
"""

from __future__ import annotations

# The backend that runs TARGET_VERIFY takes a FULL_MASK custom mask at any verify width
MASKED_VERIFY_BACKENDS = ("TritonAttnBackend", "KimiCpuAttnBackend")
# FlashAttentionBackend's switch to its tree verify (any topk > 1; its value counts only in EAGLE's draft decode)
FA3_TREE_TOPK = 2


def verify_backend(attn_backend):
    """The backend that runs TARGET_VERIFY inside SGLang's wrappers (hybrid prefill / decode backends, two-batch
    overlap, hybrid linear attention), resolved as SGLang's DFLASH resolves it for its verify-mask policy."""
    from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend
    from sglang.srt.layers.attention.tbo_backend import TboAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    backend = attn_backend
    for _ in range(4):
        if isinstance(backend, HybridAttnBackend):
            backend = backend._select_backend(ForwardMode.TARGET_VERIFY)
        elif isinstance(backend, TboAttnBackend):
            backend = backend.primary
        elif getattr(backend, "full_attn_backend", None) is not None:
            backend = backend.full_attn_backend
        else:
            break
    return backend


def _is_fa3(backend) -> bool:
    try:
        from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend
    except ImportError:  # a build without FlashAttention
        return False
    return isinstance(backend, FlashAttentionBackend) and getattr(backend, "fa_impl_ver", 3) == 3


def prepare_tree_verify(target_runner, mode: str, any_width: bool) -> str:
    """Make the target's verify attention apply the tree mask, or raise naming the backend and the fix. ``mode``:
    what the server serves (for the message); ``any_width``: the verify width changes per step (adaptive). Returns
    the verify backend's class name."""
    backend = verify_backend(target_runner.attn_backend)
    name = type(backend).__name__
    if name in MASKED_VERIFY_BACKENDS:
        return name
    if _is_fa3(backend):
        if any_width:
            raise ValueError(
                f"{mode} verify a window whose width changes each step, but FlashAttention 3's tree verify keeps the "
                "width it was built with: serve adaptive widths with --attention-backend triton, or a static tree "
                "on fa3"
            )
        if backend.topk <= 1:
            backend.topk = FA3_TREE_TOPK  # its tree verify: the FULL_MASK's tree blocks, read by index
        return name
    raise ValueError(
        f"{mode} verify each step's drafts with a tree mask, but the target's verify attention is {name}, which "
        "verifies MLA chains only (no tree mask; FlashInfer-MLA, FlashMLA, TRT-LLM MLA, cutedsl-MLA and AITER are "
        "such backends): "
        "serve with --attention-backend triton, or fa3 on Hopper for static trees"
    )
