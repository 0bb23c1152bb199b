"""The adaptive policy's settings: ``--speculative-kimi-adaptive-config PATH`` (JSON), checked once at start-up.

Every key is optional; an unknown key, a wrong type or a value out of range is a start-up error naming the key
(nothing is silently ignored)::

    {"widths": [0, 1, 2, 3, 7], "buckets": [1, 4, 16], "explore_every": 20, "explore_budget": 0.01,
     "hysteresis": 0.05, "acceptance_decay": 0.995, "cost_decay": 0.98, "initial_width": 3, "profile_repeats": 2,
     "step_costs": "h200-tp8.json"}

``widths``: the candidate draft widths (chain drafts, tree budgets or EAGLE3 steps; 0 = no speculation);
``buckets``: batch-size bucket bounds (a batch of B requests uses the first bucket >= B); ``explore_budget``: the
share of a bucket's time exploring other widths may lose (default ``0.2 / explore_every``; 1 sets no limit, so every
due exploration runs); ``step_costs``: a ``t(B, w)``
table (``bench/bench_step_cost.py``, ``bench/project_kimi.py --step-costs``; a path relative to this file's folder)
used as the start-up profile instead of timing dummy forwards (``profile.py`` says when one is refused).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

from sglang_kimi.errors import SpeculativeConfigError
from sglang_kimi.speculators.policy import ChainAcceptance, TreeAcceptance, WidthPolicy


class AdaptiveConfigError(SpeculativeConfigError):
    """An adaptive policy setting that cannot be used; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class AdaptiveConfig:
    widths: tuple[int, ...] | None = None  # None: every width the mode allows
    buckets: tuple[int, ...] | None = None  # None: powers of two up to the server's max running requests
    explore_every: int = 20  # one step in explore_every tries a neighbouring width (<= 5% by default)
    explore_budget: float | None = None  # share of time exploring may lose; None: 0.2 / explore_every; 1: no limit
    hysteresis: float = 0.05  # a new width must beat the current one's expected rate by this fraction
    acceptance_decay: float = 0.995  # per observed request-step
    cost_decay: float = 0.98  # per observed step
    initial_width: int | None = None  # None: the widest candidate until measurements say otherwise
    profile_repeats: int = 2  # timed forwards per (bucket, width) at start-up (the fastest is kept)
    step_costs: str | None = None  # a step-costs table standing in for the start-up profile (absolute path)


def _int_list(name: str, value, where: str) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise AdaptiveConfigError(f"{where}: {name!r} must be a non-empty list of integers, got {value!r}")
    return tuple(value)


def load_adaptive_config(path: str | None) -> AdaptiveConfig:
    """The settings in ``path`` (None: the defaults); AdaptiveConfigError for an unreadable or invalid file."""
    if path is None:
        return AdaptiveConfig()
    where = f"--speculative-kimi-adaptive-config {path}"
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as e:
        raise AdaptiveConfigError(
            f"{where}: cannot read the file ({e.strerror or e}); pass a readable JSON file"
        ) from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AdaptiveConfigError(f"{where}: not valid JSON ({e}); see docs/adaptive.md for the format") from e
    if not isinstance(raw, dict):
        raise AdaptiveConfigError(f"{where}: expected a JSON object of settings, got {type(raw).__name__}")
    known = {f.name for f in fields(AdaptiveConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise AdaptiveConfigError(
            f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    values = {}
    for name in ("widths", "buckets"):
        if name in raw:
            values[name] = _int_list(name, raw[name], where)
    for name in ("explore_every", "initial_width", "profile_repeats"):
        if name in raw:
            v = raw[name]
            if not isinstance(v, int) or isinstance(v, bool):
                raise AdaptiveConfigError(f"{where}: {name!r} must be an integer, got {v!r}")
            values[name] = v
    if "step_costs" in raw:
        v = raw["step_costs"]
        if not isinstance(v, str) or not v:
            raise AdaptiveConfigError(f"{where}: 'step_costs' must be the path of a step-costs file, got {v!r}")
        file = (Path(path).parent / Path(v).expanduser()).resolve()
        if not file.is_file():
            raise AdaptiveConfigError(
                f"{where}: 'step_costs' {v} is not a file ({file}); write one with bench/bench_step_cost.py or "
                "bench/project_kimi.py --step-costs (a relative path is read from this file's folder)"
            )
        values["step_costs"] = str(file)
    for name in ("hysteresis", "acceptance_decay", "cost_decay", "explore_budget"):
        if name in raw:
            v = raw[name]
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise AdaptiveConfigError(f"{where}: {name!r} must be a number, got {v!r}")
            values[name] = float(v)
    config = AdaptiveConfig(**values)
    problems = []
    if config.widths is not None and (min(config.widths) < 0 or len(set(config.widths)) != len(config.widths)):
        problems.append(f"'widths' must be distinct and >= 0, got {list(config.widths)}")
    if config.buckets is not None and (min(config.buckets) < 1 or len(set(config.buckets)) != len(config.buckets)):
        problems.append(f"'buckets' must be distinct and >= 1, got {list(config.buckets)}")
    if config.explore_every < 2:
        problems.append(f"'explore_every' must be >= 2 (a share of 1 / explore_every), got {config.explore_every}")
    if config.explore_budget is not None and not 0 <= config.explore_budget <= 1:
        problems.append(f"'explore_budget' must be in [0, 1] (1: no limit), got {config.explore_budget}")
    if not 0 <= config.hysteresis < 1:
        problems.append(f"'hysteresis' must be in [0, 1), got {config.hysteresis}")
    for name in ("acceptance_decay", "cost_decay"):
        if not 0 < getattr(config, name) <= 1:
            problems.append(f"{name!r} must be in (0, 1], got {getattr(config, name)}")
    if config.profile_repeats < 1:
        problems.append(f"'profile_repeats' must be >= 1, got {config.profile_repeats}")
    if problems:
        raise AdaptiveConfigError(f"{where}: " + "; ".join(problems))
    return config


def resolve_widths(
    config: AdaptiveConfig, max_width: int, what: str, default: tuple[int, ...] | None = None
) -> tuple[int, ...]:
    """The candidate widths: the configured ones (each within 0..max_width), else ``default`` (every width
    0..max_width when None)."""
    if config.widths is None:
        widths = default if default is not None else tuple(range(max_width + 1))
        if config.initial_width is not None and config.initial_width not in widths:
            raise AdaptiveConfigError(
                f"--speculative-kimi-adaptive-config: initial_width {config.initial_width} is not one of the widths "
                f"{list(widths)}"
            )
        return widths
    too_wide = [w for w in config.widths if w > max_width]
    if too_wide:
        raise AdaptiveConfigError(
            f"--speculative-kimi-adaptive-config: widths {too_wide} exceed the largest {what} this server can run "
            f"({max_width}); remove them or raise the server's maximum"
        )
    if config.initial_width is not None and config.initial_width not in config.widths:
        raise AdaptiveConfigError(
            f"--speculative-kimi-adaptive-config: initial_width {config.initial_width} is not one of the widths "
            f"{sorted(config.widths)}"
        )
    return tuple(sorted(config.widths))


def default_tree_widths(budget: int) -> tuple[int, ...]:
    """No speculation, then tree budgets 1, 2, 4, ... up to and including ``budget``."""
    widths, w = [0], 1
    while w < budget:
        widths.append(w)
        w *= 2
    return tuple(widths + [budget])


def default_buckets(max_running_requests: int | None, cap: int = 256) -> tuple[int, ...]:
    """Powers of two below the server's max running requests (at most ``cap``), then that maximum."""
    limit = min(int(max_running_requests or cap), cap)
    buckets, b = [], 1
    while b < limit:
        buckets.append(b)
        b *= 2
    return tuple(buckets + [limit])


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/sglang-kimi`` (``~/.cache`` when unset): cost profiles and generated settings."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sglang-kimi"


def write_eagle_candidate_steps(widths) -> Path:
    """SGLang's adaptive config (``--speculative-adaptive-config``) holding only the candidate step counts: SGLang
    builds one runtime state per candidate and sizes its buffers for the widest; the plugin's policy, not this
    file's slot settings, chooses among them. One file per set of steps, so concurrent servers share it."""
    steps = sorted(int(w) for w in widths)
    path = cache_dir() / "adaptive" / f"eagle-candidate-steps-{'-'.join(map(str, steps))}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"1": {"candidate_steps": steps}}) + "\n")
        tmp.replace(path)
    except OSError as e:
        raise AdaptiveConfigError(
            f"--speculative-kimi-adaptive: cannot write SGLang's adaptive config to {path} ({e.strerror or e}); "
            "point XDG_CACHE_HOME at a writable directory"
        ) from e
    return path


def acceptance_estimate(config: AdaptiveConfig, chain: bool, widths):
    """The acceptance estimate a server's policy learns: per draft position for chains (DFLASH or EAGLE3), per
    budget for DFLASH trees, decaying at ``config.acceptance_decay``."""
    if chain:
        return ChainAcceptance(max(widths), decay=config.acceptance_decay)
    return TreeAcceptance(widths, decay=config.acceptance_decay)


def width_policy(config: AdaptiveConfig, widths, buckets, acceptance, costs, **overrides) -> WidthPolicy:
    """The policy a server runs over ``acceptance`` and ``costs`` with the settings of ``config``; ``overrides``:
    further ``WidthPolicy`` keywords (the replay bench's sweep)."""
    return WidthPolicy(
        list(widths),
        list(buckets),
        acceptance,
        costs,
        initial_width=config.initial_width,
        explore_every=config.explore_every,
        hysteresis=config.hysteresis,
        explore_budget=config.explore_budget,
        **overrides,
    )
