"""SGLang's CUDA path without ``sgl_kernel``: torch versions of the compiled ops it calls for Kimi-architecture models.

The ``sgl_kernel`` wheel (SGLang's CUDA kernels) is hundreds of MB; a machine that has PyTorch and Triton but not
that wheel can still serve through SGLang with the plugin's ``sgl_kernel`` import shim on its path
(``sglang_kimi/platform/cpu/shims``, see ``docs/gpu.md``). On a CUDA device the shim serves the ops of :mod:`.ops`; the
entries of ``plugin.py``'s table marked ``CUDA_STAND_IN`` (:mod:`.fixes`) replace the few JIT-compiled SGLang ops on
that path that have no fallback. Nothing here runs where the real ``sgl_kernel`` imports.
"""
