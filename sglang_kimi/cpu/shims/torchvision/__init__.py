"""Import-only stand-in for torchvision (see ../README.md).

transformers 5 treats torchvision as present once it can be found, and then imports ``torchvision.io``,
``torchvision.transforms`` (``InterpolationMode``) and ``torchvision.transforms.functional`` at module level.
So every ``torchvision.*`` submodule imports, ``InterpolationMode`` is a real enum, and any other name is a
placeholder class that raises when used: image inputs are not supported where this stub is active.
"""

import enum

from sglang_kimi.cpu.placeholder_modules import install

__version__ = "0.0.0+sglang_kimi_import_stub"


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _Unavailable:
    _qualname = "torchvision"

    def __init__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._qualname} is not available: sglang-kimi's CPU stub of torchvision only imports "
            "(image and video inputs are not supported on this machine)"
        )


class _UnavailableFunction:
    def __init__(self, qualname: str):
        self._qualname = qualname

    def __call__(self, *args, **kwargs):
        _Unavailable.__init__(self)


def _placeholder(qualname: str):
    name = qualname.rsplit(".", 1)[-1]
    if name[:1].isupper():  # a class: keep it subclassable
        return type(name, (_Unavailable,), {"_qualname": qualname})
    return _UnavailableFunction(qualname)


def _module_getattr(module_name: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "InterpolationMode":
            return InterpolationMode
        return _placeholder(f"{module_name}.{name}")

    return __getattr__


__getattr__ = _module_getattr("torchvision")


install("torchvision", _module_getattr)
