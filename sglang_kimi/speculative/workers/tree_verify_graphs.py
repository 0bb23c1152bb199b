"""CUDA graphs for the DFLASH tree verify: the target's verify graph is captured with a tree mask.

SGLang captures DFLASH's TARGET_VERIFY graphs for a chain. On the backends that express a chain with their built-in
causal path (``triton``, FlashInfer, FlashAttention, TRT-LLM; ``dflash_utils.resolve_dflash_verify_mask_policy``)
the capture passes no custom mask, so the captured attention kernel is the causal one and ignores any mask a replay
brings. The tree worker's verify has the captured width (budget + 1 tokens per request) and would replay that graph
with every node attending to the nodes before it in the window, siblings included: outputs that differ from the
non-speculative server's.

When the tree worker serves the process, :func:`_mask_policy` makes the capture take SGLang's FULL_MASK custom
mask instead, as SGLang does for EAGLE trees on those backends: the graph's kernel reads the mask from the
backend's verify-mask buffer, into which the worker writes the step's tree blocks in place
(``tree_verify_inputs.write_tree_mask``), laid out by the same ``mask_indptr`` as an eager verify. SGLang's own
DFLASH chains keep their causal capture. :func:`check_target_graphs` refuses to serve when the target captured
graphs and the policy did not apply.
"""

from __future__ import annotations

from sglang_kimi.hooks import hook

# Set by the tree worker when it is built; the target's graphs are captured after every worker exists.
_tree_verify_in_process = False


def mark_tree_verify() -> None:
    """The DFLASH tree worker serves this process: its target's verify graphs need the tree mask."""
    global _tree_verify_in_process
    _tree_verify_in_process = True


def _mask_policy(original, attn_backend):
    backend_name, build_custom_mask = original(attn_backend)
    return backend_name, build_custom_mask or _tree_verify_in_process


def install_mask_policy(target: str):
    hook(target, _mask_policy, "AROUND")


def check_target_graphs(target_runner) -> None:
    """Raise when the target captured decode graphs without the tree mask (the policy hook did not apply)."""
    if getattr(target_runner, "decode_cuda_graph_runner", None) is None:
        return
    from sglang.srt.speculative import dflash_utils

    backend_name, build_custom_mask = dflash_utils.resolve_dflash_verify_mask_policy(target_runner.attn_backend)
    if not build_custom_mask:
        raise RuntimeError(
            f"DFLASH draft trees: the target's CUDA graphs were captured for a causal chain verify on {backend_name} "
            "(the plugin's 'dflash-tree-verify-graph-mask' registration did not apply; `sglang-kimi doctor` shows "
            "why), and a tree verify replaying them would not be lossless. Serve with "
            "--cuda-graph-backend-decode disabled, or fix the registration."
        )
