"""A stand-in for IPython on the lent GPU machine (``scripts/gpu_check.sh`` puts this folder on the path only where
IPython does not import): SGLang's ``sglang/utils.py`` imports ``IPython.display`` at module level for its notebook
helpers, which a server never calls. Carrying IPython and its dependencies would take 2.2 MiB of the 64 that may
travel."""
