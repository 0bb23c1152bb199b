"""Torch implementations of the ``sgl_kernel`` ops SGLang's CPU path calls (served by the CPU shim).

Each op keeps the signature of its SGLang caller and writes its outputs in place, as the compiled op does.
"""

OPS: dict = {}
