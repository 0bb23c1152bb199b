"""The repository's scripts and benchmarks, imported as modules by their tests (they are not in the package)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from support.paths import REPO


def load_script(relative_path: str) -> ModuleType:
    """``scripts/x.py`` or ``bench/x.py`` as the module ``x`` (registered in ``sys.modules``, which dataclasses
    defined in it need)."""
    path = REPO / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
