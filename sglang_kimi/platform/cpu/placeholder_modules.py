"""Import machinery shared by the import shims in ``shims/``: placeholder submodules on demand, and placeholder
classes and functions that import but raise when used."""

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Callable


class PlaceholderSubmodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes every ``<package>.<sub>`` import succeed with a module whose attributes come from ``make_getattr``.

    ``make_getattr(module_name)`` returns the module-level ``__getattr__`` of that placeholder module.
    """

    def __init__(self, package: str, make_getattr: Callable[[str], Callable[[str], object]]):
        self.prefix = package + "."
        self.make_getattr = make_getattr

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(self.prefix):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = self.make_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


def install(package: str, make_getattr: Callable[[str], Callable[[str], object]]) -> None:
    """Install the placeholder finder for ``package`` once per process."""
    prefix = package + "."
    if not any(isinstance(f, PlaceholderSubmodules) and f.prefix == prefix for f in sys.meta_path):
        sys.meta_path.append(PlaceholderSubmodules(package, make_getattr))


class Unavailable:
    """Base of a placeholder class: importable and subclassable, raises ``RuntimeError`` when instantiated."""

    _qualname = ""
    _reason = ""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{self._qualname} is not available: {self._reason}")


class UnavailableFunction:
    """A placeholder function: raises ``RuntimeError`` naming itself when called."""

    def __init__(self, qualname: str, reason: str):
        self._qualname = qualname
        self._reason = reason

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._qualname} is not available: {self._reason}")

    def __repr__(self) -> str:
        return f"<unavailable {self._qualname}>"


def placeholder(qualname: str, reason: str):
    """A class (for a capitalised name, kept subclassable) or a function that raises ``reason`` when used."""
    name = qualname.rsplit(".", 1)[-1]
    if name[:1].isupper():
        return type(name, (Unavailable,), {"_qualname": qualname, "_reason": reason})
    return UnavailableFunction(qualname, reason)


def placeholder_getattr(reason: str, known: dict[str, object] | None = None):
    """``make_getattr`` for :func:`install` and a shim's own ``__getattr__``: a module's names are ``known``'s, or
    placeholders that raise ``reason`` when used."""

    def make(module_name: str):
        def __getattr__(name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            if known and name in known:
                return known[name]
            return placeholder(f"{module_name}.{name}", reason)

        return __getattr__

    return make
