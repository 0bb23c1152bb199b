"""Import-only stand-in for torchvision (see ../README.md).

transformers 5 treats torchvision as present once it can be found, and then imports ``torchvision.io``,
``torchvision.transforms`` (``InterpolationMode``) and ``torchvision.transforms.functional`` at module level.
So every ``torchvision.*`` submodule imports, ``InterpolationMode`` is a real enum, and any other name is a
placeholder class that raises when used: image inputs are not supported where this stub is active.
"""

import enum

from sglang_kimi.platform.cpu.placeholder_modules import install, placeholder_getattr

__version__ = "0.0.0+sglang_kimi_import_stub"


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


REASON = "sglang-kimi's CPU stub of torchvision only imports (image and video inputs are not supported on this machine)"


_module_getattr = placeholder_getattr(REASON, {"InterpolationMode": InterpolationMode})

__getattr__ = _module_getattr("torchvision")


install("torchvision", _module_getattr)
