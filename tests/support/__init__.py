"""Test machinery shared by the unit, statistical and end-to-end tests (never shipped in the package)."""
