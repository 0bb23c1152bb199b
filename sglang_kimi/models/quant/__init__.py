"""Kimi-K2.6 quantized checkpoints: the INT4 compressed-tensors and MXFP4 Quark layouts (``formats``, torch only)
and the dequantizing fallbacks registered into SGLang where it has no kernel for them (``fallback``)."""
