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

**Step costs.** A measured or projected ``t(B, w)`` table (``bench/bench_step_cost.py``, ``bench/project_kimi.py``;
format ``sglang-kimi-step-costs/1``) can stand in for the start-up profile (the adaptive setting ``step_costs``), so
that a deployment starts from costs measured under real traffic shapes instead of a dummy profile::

    {"format": "sglang-kimi-step-costs/1", "device": "cuda:NVIDIA H200", "tp": 8, "shape": {...},
     "created": ..., "source": ..., "seconds": {"<mode>": {"<batch>": {"<width>": seconds per step}}}}

``mode`` is the profile key's (``chain``, ``tree``, ``eagle3-chain``; width 0 is the step without drafts), ``tp``
the tensor-parallel size the costs stand for and ``shape`` what one rank holds and computes per token
(``models/kimi_shapes.rank_signature``). A table whose device, TP, shape or mode differs from the server's is refused
at start-up with every difference named (:func:`step_costs_mismatches`); a bucket or width outside the table's range
is refused too (no extrapolation), and one inside it is interpolated linearly between its neighbours
(:func:`step_costs_table`).
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


STEP_COSTS_FORMAT = "sglang-kimi-step-costs/1"


class StepCostsError(ValueError):
    """A step-costs table that cannot be read, or that does not fit this server; the message names the fix."""


class StepCosts(NamedTuple):
    device: str  # device_name() of where it was measured (or what a projection is for)
    tp: int  # the tensor-parallel size the costs stand for
    shape: dict  # models/kimi_shapes.rank_signature of one rank
    seconds: dict[str, Table]  # mode -> batch -> width -> seconds per step
    created: str = ""
    source: str = ""


def write_step_costs(path: Path, costs: StepCosts) -> None:
    data = {
        "format": STEP_COSTS_FORMAT,
        "device": costs.device,
        "tp": int(costs.tp),
        "shape": dict(costs.shape),
        "created": costs.created or _utc_now(),
        "source": costs.source,
        "seconds": {
            mode: {str(b): {str(w): float(s) for w, s in sorted(row.items())} for b, row in sorted(table.items())}
            for mode, table in sorted(costs.seconds.items())
        },
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def read_step_costs(path: str | os.PathLike) -> StepCosts:
    """The table in ``path``; StepCostsError naming what is wrong with the file."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise StepCostsError(f"step costs {path}: cannot read the file ({e.strerror or e})") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StepCostsError(f"step costs {path}: not valid JSON ({e})") from e
    if not isinstance(data, dict) or data.get("format") != STEP_COSTS_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise StepCostsError(
            f"step costs {path}: format {found!r} is not {STEP_COSTS_FORMAT}: write it with bench/bench_step_cost.py "
            "or bench/project_kimi.py --step-costs"
        )
    try:
        seconds = {
            str(mode): {int(b): {int(w): float(t) for w, t in row.items()} for b, row in table.items()}
            for mode, table in data["seconds"].items()
        }
        costs = StepCosts(
            str(data["device"]), int(data["tp"]), dict(data["shape"]), seconds, str(data.get("created", "")),
            str(data.get("source", "")),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise StepCostsError(f"step costs {path}: malformed ({type(e).__name__}: {e}); write it again") from e
    bad = [(m, b, w) for m, t in seconds.items() for b, row in t.items() for w, v in row.items() if not v > 0]
    if bad or any(b < 1 or w < 0 for m, t in seconds.items() for b, row in t.items() for w in row):
        raise StepCostsError(f"step costs {path}: every batch must be >= 1, width >= 0 and time > 0 (see {bad[:3]})")
    return costs


def step_costs_mismatches(
    costs: StepCosts, *, tp: int, shape: Mapping, mode: str, device: str | None = None
) -> list[str]:
    """Every way the table does not describe this server (empty when it does): device (when given), TP, each shape
    field, the mode."""
    problems = []
    if device is not None and costs.device != device:
        problems.append(f"device {costs.device!r} (table) vs {device!r} (this server)")
    if int(costs.tp) != int(tp):
        problems.append(f"TP {costs.tp} (table) vs {tp} (this server)")
    problems += [f"shape {d}" for d in _differences(costs.shape, shape)]
    if mode not in costs.seconds:
        problems.append(f"mode {mode!r} (this server) is not in the table, which has {sorted(costs.seconds)}")
    return problems


def _interpolate(points: Mapping[int, float], x: int) -> float | None:
    """Linear interpolation of ``points`` at ``x``; None outside their range."""
    if x in points:
        return points[x]
    below = [p for p in points if p < x]
    above = [p for p in points if p > x]
    if not below or not above:
        return None
    lo, hi = max(below), min(above)
    return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)


def step_costs_table(costs: StepCosts, mode: str, buckets: Sequence[int], widths: Sequence[int]) -> Table:
    """The profile (bucket -> width -> seconds) the table gives for these buckets and widths: a batch between two
    measured batches interpolated linearly from them (per width), then a width between two known widths of that batch
    likewise; StepCostsError naming the cells outside the table's range."""
    table = costs.seconds[mode]
    out: Table = {}
    missing = []
    for bucket in buckets:
        by_width = {}
        for w in {w for row in table.values() for w in row}:
            value = _interpolate({b: row[w] for b, row in table.items() if w in row}, bucket)
            if value is not None:
                by_width[w] = value
        out[bucket] = {}
        for width in widths:
            value = _interpolate(by_width, width)
            if value is None:
                missing.append((bucket, width))
            else:
                out[bucket][width] = value
    if missing:
        batches = sorted(table)
        known = sorted({w for row in table.values() for w in row})
        raise StepCostsError(
            f"step costs for mode {mode!r} cover batches {batches} and widths {known}: the (batch bucket, width) cells "
            f"{missing[:6]}{' ...' if len(missing) > 6 else ''} lie outside them; measure those batches and widths, "
            "or narrow the adaptive setting's 'buckets' and 'widths' to the table's range"
        )
    return out


def file_digest(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def server_cost_setup(model_config: Mapping, tp: int, ep: int = 1, moe_a2a_backend: str | None = None):
    """(the TP size a server stands for, the shape of one of its ranks): what its step costs are valid for."""
    from sglang_kimi.models.kimi_shapes import rank_signature, represented_tp

    shared_replicated = str(moe_a2a_backend or "none") != "none"  # SGLang's all-to-all backends keep it whole
    return represented_tp(model_config, tp), rank_signature(model_config, tp, ep, shared_replicated)


def fitting_step_costs(
    path: str | os.PathLike, *, model_config: Mapping, tp: int, ep: int, moe_a2a_backend: str | None, mode: str,
    device: str | None = None,
) -> StepCosts:  # fmt: skip
    """The table in ``path`` when it describes this server (``device`` None: not compared); StepCostsError naming
    every difference otherwise."""
    costs = read_step_costs(path)
    represented, shape = server_cost_setup(model_config, tp, ep, moe_a2a_backend)
    problems = step_costs_mismatches(costs, tp=represented, shape=shape, mode=mode, device=device)
    if problems:
        raise StepCostsError(
            f"step costs {path} ({costs.source or 'no source recorded'}) do not describe this server: "
            + "; ".join(problems)
            + ". Measure this setup with bench/bench_step_cost.py (or project it for this device and TP with "
            "bench/project_kimi.py --step-costs), or drop 'step_costs' to profile at start-up"
        )
    return costs


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
    given: Table | None = None,
) -> tuple[SavedProfile, Path, bool]:
    """(the profile, its file, whether it was measured now): the file's when it fits this setup (with the real
    steps an earlier server saved), else ``given`` (a step-costs table's, when there is one) or measured, and written
    (nothing measured by real steps yet). Tensor-parallel ranks profile together (the forwards are collective):
    ``share`` gives every rank rank 0's value, and only the ``writer`` (rank 0) reads, logs and writes the file."""
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
    if given is not None:
        table = {int(b): {int(w): float(s) for w, s in row.items()} for b, row in given.items()}
        created = _utc_now()
        if writer:
            logger.info("sglang-kimi adaptive: the start-up profile is the step-costs table's (%d cells)",
                        sum(len(row) for row in table.values()))  # fmt: skip
            write_profile(file, key, table, created=created)
        return SavedProfile(table, {}, created), file, False
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
