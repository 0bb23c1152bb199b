"""What makes real SGLang run where ``sgl_kernel`` is absent: ``cpu/`` and ``cuda_stand_in/``."""
