"""Fixes to SGLang's API behaviour that is not about Kimi or speculation (``SGLANG_KIMI_HARDENING=0``: off)."""
