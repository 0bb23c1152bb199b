"""Speculative decoding algorithms in pure PyTorch (no SGLang), installed as ``sglang_kimi.speculators``.

Its twin by name, ``sglang_kimi/speculative/``, is the SGLang side: the workers, hooks and checks that call these
algorithms on SGLang's batches. Nothing here imports it (``tests/unit/test_structure.py``).

What serving imports, each algorithm in one module:

- :mod:`.trees`: :class:`DraftTree` (the one set of sentinels), chains, EAGLE dynamic trees, SGLang's retrieve arrays.
- :mod:`.ddtree`: the DDTree build (ranking, tensor-parallel shard merge, best-first tree).
- :mod:`.verify`: greedy and lossless sampled verification of chains and trees, seeded per-request coins.
- :mod:`.configs`: drafter configs (DFlash, EAGLE3); :mod:`.pairing`: drafter / target validation and warnings.
- :mod:`.drafter_tensors`: each drafter format's published tensor names, and the check of a checkpoint's files.

Apart, what only oracles, training and tests use: :mod:`.reference` (the reference decode loop, the reference DDTree
heap, the DFlash and EAGLE3 drafter modules).
"""
