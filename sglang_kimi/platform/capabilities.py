"""What this machine offers SGLang (FlashInfer, and SGLang's compiled kernels or the plugin's stand-in for them), and
the name a measurement made on it is filed under."""

from __future__ import annotations

import importlib.util
from pathlib import Path


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


def device_name(device) -> str:
    """The accelerator's name (``cuda:NVIDIA H100 80GB HBM3``), or the CPU model and the threads torch uses."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu:{model or 'unknown'}:{torch.get_num_threads()} threads"
