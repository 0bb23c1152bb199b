"""Shared by every test folder: ``tests/`` on ``sys.path`` so that ``support`` (the tests' own machinery) imports."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
