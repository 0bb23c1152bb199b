"""Adaptive speculation in serving: the policy's settings (``config.py``), the start-up cost profile
(``profile.py``) and the per-step runtime that feeds and asks the policy (``runtime.py``). The decision itself is
``speculators/policy.py``; the derivation is ``docs/adaptive.md``."""
