"""sglang-kimi: an SGLang plugin for fast, lossless speculative decoding of Kimi-K2.6.

SGLang finds this package through the entry point ``sglang.srt.plugins: kimi = sglang_kimi:register``
and calls :func:`register` in every process it starts (launcher, scheduler, detokenizer).
Everything registered is listed in :data:`sglang_kimi.plugin.REGISTRATIONS`: each area's table, in nesting order.
"""

from sglang_kimi.version import SUPPORTED_SGLANG, __version__

__all__ = ["SUPPORTED_SGLANG", "__version__", "register"]


def register() -> None:
    """Entry point called by SGLang's ``load_plugins()``: cheap, idempotent, safe in every process."""
    from sglang_kimi.plugin import register_all

    register_all()
