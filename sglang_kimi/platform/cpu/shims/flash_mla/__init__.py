"""Import-only stand-in for FlashMLA (``flash_mla``, the ``sgl-flash-mla`` wheel; see ../README.md).

On CUDA, SGLang's EAGLE worker imports ``FlashMLABackend`` while it captures the drafter's CUDA graphs, only to test
whether the draft attention backend is one of the graph-capturable ones; that module imports ``flash_mla`` at
module level. Where the wheel is absent this stub lets the import succeed: every name in ``flash_mla`` and its
submodules is a placeholder that raises when used, so the FlashMLA attention backend itself cannot run here.
"""

from sglang_kimi.platform.cpu.placeholder_modules import install, placeholder_getattr

__version__ = "0.0.0+sglang_kimi_import_stub"

REASON = "sglang-kimi's stub of flash_mla only imports (use an attention backend other than flashmla on this machine)"


_module_getattr = placeholder_getattr(REASON)

__getattr__ = _module_getattr("flash_mla")

install("flash_mla", _module_getattr)
