"""What makes real SGLang, speculative decoding included, run on a CPU box: import shims, torch versions of the
sgl_kernel ops, the ``kimi_cpu`` attention backend, and hooks around upstream CPU bugs (all listed in plugin.py)."""

# The name of the CPU attention backend this package registers (``attention_backend.py``).
KIMI_CPU_BACKEND = "kimi_cpu"
