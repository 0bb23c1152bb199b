"""The start-up cost profile: seconds per speculative step by (batch bucket, width), kept in a JSON file so that a
restart on the same setup reuses it instead of profiling again.

A profile is valid only for the setup it was measured on; its ``key`` records the device, the target and drafter
(paths and the digest of their ``config.json``), the parallelism, the dtype, the attention backend and the widths
and buckets profiled. A file whose key differs from this server's (another GPU, model, TP size, ...) is *stale*:
the server logs one line naming what differs and profiles afresh, overwriting the file. A file that cannot be
parsed is treated the same way (it is only a cache); one that cannot be written is a warning, not an error.

Format (``format: sglang-kimi-cost-profile/1``)::

    {"format": ..., "key": {...}, "created": "2026-11-23T12:00:00Z",
     "seconds": {"<bucket>": {"<width>": seconds per step, ...}, ...}}
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sglang_kimi.adaptive.config import cache_dir

logger = logging.getLogger("sglang_kimi")

FORMAT = "sglang-kimi-cost-profile/1"


def config_digest(path: str | None) -> str | None:
    """sha256 (16 hex digits) of a model folder's ``config.json``; None when there is none to read."""
    if not path:
        return None
    config = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    try:
        return hashlib.sha256(config.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def device_name(device) -> str:
    """The accelerator's name (``cuda:NVIDIA H100 80GB HBM3``), or the CPU model and the threads torch uses."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu:{model or 'unknown'}:{torch.get_num_threads()} threads"


def default_profile_path(key: Mapping) -> Path:
    root = cache_dir() / "cost-profiles"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return root / f"{digest}.json"


def _differences(saved: Mapping, wanted: Mapping) -> list[str]:
    return [
        f"{k}: {saved.get(k)!r} (file) vs {wanted.get(k)!r} (this server)"
        for k in sorted(set(saved) | set(wanted))
        if saved.get(k) != wanted.get(k)
    ]


def read_profile(path: Path, key: Mapping) -> dict[int, dict[int, float]] | None:
    """The table in ``path`` when it was made for ``key``; None (and one log line saying why) otherwise."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r} is not {FORMAT}")
        table = {int(b): {int(w): float(s) for w, s in row.items()} for b, row in data["seconds"].items()}
        saved_key = data["key"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        logger.warning("sglang-kimi adaptive: cost profile %s is unreadable (%s): profiling afresh", path, e)
        return None
    differences = _differences(saved_key, key)
    if differences:
        logger.warning(
            "sglang-kimi adaptive: cost profile %s was made for another setup (%s): profiling afresh",
            path,
            "; ".join(differences),
        )
        return None
    return table


def write_profile(path: Path, key: Mapping, table: Mapping[int, Mapping[int, float]]) -> None:
    data = {
        "format": FORMAT,
        "key": dict(key),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": {str(b): {str(w): s for w, s in sorted(row.items())} for b, row in sorted(table.items())},
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)
    except OSError as e:
        logger.warning(
            "sglang-kimi adaptive: cannot write the cost profile to %s (%s); it will be measured again "
            "at the next start",
            path,
            e,
        )


def measure_profile(
    buckets: Sequence[int], widths: Sequence[int], step_seconds: Callable[[int, int], float]
) -> dict[int, dict[int, float]]:
    """``step_seconds(batch, width)`` for every bucket and width, with progress logged per bucket."""
    table: dict[int, dict[int, float]] = {}
    start = time.perf_counter()
    for i, bucket in enumerate(buckets):
        table[bucket] = {w: float(step_seconds(bucket, w)) for w in widths}
        logger.info(
            "sglang-kimi adaptive: profiled batch %d (%d/%d buckets, %d widths, %.1f s so far)",
            bucket,
            i + 1,
            len(buckets),
            len(widths),
            time.perf_counter() - start,
        )
    return table


def load_or_measure(
    path: str | None,
    key: Mapping,
    buckets: Sequence[int],
    widths: Sequence[int],
    step_seconds: Callable[[int, int], float],
    share: Callable[[object], object] | None = None,
    writer: bool = True,
) -> tuple[dict[int, dict[int, float]], Path, bool]:
    """(the table, its file, whether it was measured now): the file's when it fits this setup, else measured and
    written. Tensor-parallel ranks profile together (the forwards are collective): ``share`` gives every rank
    rank 0's value, and only the ``writer`` (rank 0) reads, logs and writes the file."""
    share = share or (lambda value: value)
    file = Path(path) if path else default_profile_path(key)
    table = share(read_profile(file, key) if writer else None)
    if table is not None:
        if writer:
            logger.info("sglang-kimi adaptive: reusing the cost profile %s", file)
        return table, file, False
    if writer:
        logger.info(
            "sglang-kimi adaptive: profiling the speculative step over %d batch buckets x %d widths",
            len(buckets),
            len(widths),
        )
    table = share(measure_profile(buckets, widths, step_seconds))
    if writer:
        write_profile(file, key, table)
    return table, file, True
