"""Each request's accepted path, step by step, from a DFLASH tree server: what ``scripts/record_acceptance.py``
records so that ``bench/replay_adaptive.py`` can replay every narrower tree budget on the same steps (a DDTree of
budget ``b`` is the first ``b`` nodes of a wider one, ``docs/adaptive.md``, "Nested tree budgets").

With ``SGLANG_KIMI_ACCEPTANCE_TRACE=<file>`` the tree worker appends one JSON line per request and decode step:
``{"rid": ..., "width": w, "path": [accepted node numbers, root excluded]}``. Recording only: each step then reads
its accepted nodes on the host. Tensor-parallel ranks agree on the path; the first rank writes (under DP attention
the first rank of each attention group, each step's lines in one append).
"""

from __future__ import annotations

import json
import os

import torch

from sglang_kimi.settings import ACCEPTANCE_TRACE_ENV


def trace_file() -> str | None:
    return os.environ.get(ACCEPTANCE_TRACE_ENV) or None


def append_paths(path: str, rids, width: int, accepted_nodes: torch.Tensor, rank: int = 0) -> None:
    """One line per request: ``rids[i]`` and row i of ``accepted_nodes`` [bs, D+1] (the root, the accepted nodes,
    negative after) without its root and padding."""
    if rank != 0:
        return
    rows = accepted_nodes.tolist()
    lines = [json.dumps({"rid": rid, "width": int(width), "path": [n for n in row[1:] if n > 0]}) for rid, row in
             zip(rids, rows)]  # fmt: skip
    with open(path, "a") as f:
        f.write("".join(line + "\n" for line in lines))
