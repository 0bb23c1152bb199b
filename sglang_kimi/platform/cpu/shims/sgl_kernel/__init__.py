"""Stand-in for ``sgl_kernel`` (see ../README.md).

Ops with a torch implementation come from ``sglang_kimi.platform.cpu.sgl_kernel_ops`` and, on a CUDA device, from
``sglang_kimi.platform.cuda_stand_in.ops``; any other attribute or submodule is a placeholder that raises
``NotImplementedError`` naming the op when called.
"""

import torch

from sglang_kimi.platform.cpu.placeholder_modules import install
from sglang_kimi.platform.cpu.sgl_kernel_ops import OPS as CPU_OPS

OPS = dict(CPU_OPS)
if torch.cuda.is_available():
    from sglang_kimi.platform.cuda_stand_in.ops import OPS as CUDA_OPS

    OPS.update(CUDA_OPS)

__version__ = "0.0.0+sglang_kimi_cpu_shim"
SHIM = True


class _MissingOp:
    """An sgl_kernel op the shim does not implement."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{self._qualname} is not available: sglang-kimi's sgl_kernel shim has no torch implementation of it "
            "(this code path needs the real sgl_kernel wheel)"
        )

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _MissingOp(f"{self._qualname}.{name}")

    def __repr__(self) -> str:
        return f"<missing sgl_kernel op {self._qualname}>"


def _module_getattr(module_name: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in OPS:
            return OPS[name]
        return _MissingOp(f"{module_name}.{name}")

    return __getattr__


__getattr__ = _module_getattr("sgl_kernel")

install("sgl_kernel", _module_getattr)
