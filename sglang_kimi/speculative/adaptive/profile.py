"""The cost profile: seconds per speculative step by (batch bucket, width), measured at start-up and refined by the
real steps, kept in a JSON file so that a restart on the same setup reuses both instead of profiling again.

A profile is valid only for the setup it was measured on; its ``key`` records the device, the target and drafter
(paths and the digest of their ``config.json``), the parallelism, the dtype, the attention backend and the widths
and buckets profiled. A file whose key differs from this server's (another GPU, model, TP size, ...) is *stale*:
the server logs one line naming what differs and profiles afresh, overwriting the file. A file that cannot be
parsed is treated the same way (it is only a cache). The default file (in the cache folder) that cannot be written
is a warning, not an error; a file named with ``--speculative-kimi-adaptive-profile`` is checked at start-up
(:func:`unwritable`), and one that cannot be written is refused there.

Format (``format: sglang-kimi-cost-profile/1``)::

    {"format": ..., "key": {...}, "created": "2026-11-23T12:00:00Z",
     "seconds": {"<bucket>": {"<width>": seconds per step, ...}, ...},
     "measured": {"<bucket>": {"<width>": [mean seconds of the real steps, their decayed count], ...}, ...},
     "updated": "2026-11-23T13:00:00Z"}

``seconds`` is the start-up profile (dummy inputs); ``measured``, present once a server has served, is the real
steps' table as the serving server last saved it (``AdaptiveRuntime``, at most once a minute): a restart starts
from what the steps measured, not only from the profile.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from sglang_kimi.speculative.adaptive.config import cache_dir

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


def default_profile_folder() -> Path:
    """Where profiles are kept without ``--speculative-kimi-adaptive-profile``: one file per setup."""
    return cache_dir() / "cost-profiles"


def default_profile_path(key: Mapping) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return default_profile_folder() / f"{digest}.json"


def unwritable(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot hold the profile (its folder is created as :func:`write_profile` would, and a file is
    created there and removed: file modes alone miss read-only mounts and running as root); None when it can."""
    file = Path(path).expanduser()
    if file.is_dir():
        return f"{file} is a folder: name a file in it (e.g. {file / 'profile.json'})"
    existing = next(p for p in file.parents if p.exists())
    if not existing.is_dir():
        return f"{file} cannot be written: {existing} is a file, not a folder"
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        probe = file.parent / f".{file.name}.probe{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        return f"{file} cannot be written ({e.strerror or e})"
    return None


def _differences(saved: Mapping, wanted: Mapping) -> list[str]:
    return [
        f"{k}: {saved.get(k)!r} (file) vs {wanted.get(k)!r} (this server)"
        for k in sorted(set(saved) | set(wanted))
        if saved.get(k) != wanted.get(k)
    ]


Table = dict[int, dict[int, float]]  # bucket -> width -> seconds per step
Measured = dict[int, dict[int, tuple[float, float]]]  # bucket -> width -> (mean seconds, decayed steps)


class SavedProfile(NamedTuple):
    table: Table  # the start-up profile
    measured: Measured  # the real steps, as a serving server last saved them ({} before any)
    created: str  # when the start-up profile was measured


def read_profile(path: Path, key: Mapping) -> SavedProfile | None:
    """The profile in ``path`` when it was made for ``key``; None (and one log line saying why) otherwise."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r} is not {FORMAT}")
        table = {int(b): {int(w): float(s) for w, s in row.items()} for b, row in data["seconds"].items()}
        measured = {
            int(b): {int(w): (float(cell[0]), float(cell[1])) for w, cell in row.items()}
            for b, row in data.get("measured", {}).items()
        }
        saved_key = data["key"]
        created = str(data.get("created", ""))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
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
    return SavedProfile(table, measured, created)


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_profile(
    path: Path, key: Mapping, table: Mapping[int, Mapping[int, float]], measured: Measured | None = None,
    created: str | None = None,
) -> None:  # fmt: skip
    """Writes the file atomically (a reader never sees half of it); a failure is one warning, not an error.
    ``created``: when the profile in ``table`` was measured (now when None)."""
    data = {
        "format": FORMAT,
        "key": dict(key),
        "created": created or _utc_now(),
        "seconds": {str(b): {str(w): s for w, s in sorted(row.items())} for b, row in sorted(table.items())},
    }
    if measured:
        data["measured"] = {
            str(b): {str(w): [round(s, 9), round(n, 3)] for w, (s, n) in sorted(row.items())}
            for b, row in sorted(measured.items())
        }
        data["updated"] = _utc_now()
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
) -> tuple[SavedProfile, Path, bool]:
    """(the profile, its file, whether it was measured now): the file's when it fits this setup (with the real
    steps an earlier server saved), else measured and written (nothing measured by real steps yet).
    Tensor-parallel ranks profile together (the forwards are collective): ``share`` gives every rank rank 0's value,
    and only the ``writer`` (rank 0) reads, logs and writes the file."""
    share = share or (lambda value: value)
    file = Path(path) if path else default_profile_path(key)
    saved = share(read_profile(file, key) if writer else None)
    if saved is not None:
        if writer:
            logger.info(
                "sglang-kimi adaptive: reusing the cost profile %s (and %d cells timed by real steps)",
                file,
                sum(len(row) for row in saved.measured.values()),
            )
        return saved, file, False
    if writer:
        logger.info(
            "sglang-kimi adaptive: profiling the speculative step over %d batch buckets x %d widths",
            len(buckets),
            len(widths),
        )
    table = share(measure_profile(buckets, widths, step_seconds))
    created = _utc_now()
    if writer:
        write_profile(file, key, table, created=created)
    return SavedProfile(table, {}, created), file, True
