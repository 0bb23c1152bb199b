"""CPU cores for parallel test workers.

``make test`` runs two pytest-xdist workers. Unpinned, each worker's servers run as many threads as the machine has
cores, so two workers oversubscribe every core and both run slower than one. :func:`pin_worker` gives worker i of N
every N-th core of the affinity it started with; the servers a worker starts inherit its affinity (on CPUs without
AMX, SGLang does not rebind them). :func:`all_cores` widens it again for a launch that needs every core (``--tp 2``).
"""

from __future__ import annotations

import contextlib
import os

_STARTED_WITH = sorted(os.sched_getaffinity(0))


def pin_worker() -> list[int] | None:
    """Under ``pytest -n N`` (N >= 2), this worker's share of the cores, applied to the process; None otherwise."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or len(_STARTED_WITH) < count:
        return None
    share = _STARTED_WITH[int(worker[2:]) % count :: count]
    os.sched_setaffinity(0, share)
    import torch

    torch.set_num_threads(len(share))
    return share


@contextlib.contextmanager
def all_cores():
    """Every core this test run started with, for the processes started inside the block."""
    before = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, _STARTED_WITH)
    try:
        yield _STARTED_WITH
    finally:
        os.sched_setaffinity(0, before)
