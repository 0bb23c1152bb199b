"""What this machine offers SGLang: FlashInfer, and SGLang's compiled kernels or the plugin's stand-in for them."""

from __future__ import annotations

import importlib.util


def flashinfer_installed() -> bool:
    """Whether FlashInfer is importable here: SGLang builds its CUDA sampling kernel from its headers and takes top-k /
    top-p renormalisation from it."""
    return importlib.util.find_spec("flashinfer") is not None


def cuda_without_sgl_kernel() -> bool:
    """A CUDA device, with the plugin's ``sgl_kernel`` shim standing in for SGLang's kernels."""
    import torch

    if not torch.cuda.is_available() or torch.version.cuda is None:
        return False
    try:
        import sgl_kernel
    except ImportError:
        return False
    return bool(getattr(sgl_kernel, "SHIM", False))
