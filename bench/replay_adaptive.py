#!/usr/bin/env python
"""Adaptive speculation replayed: the served policy, step by step, against recorded acceptance and measured costs.

    python bench/replay_adaptive.py                  # every scenario: tables, targets, JSON + PNG under bench/results
    python bench/replay_adaptive.py --only h200      # the scenarios whose name holds "h200"
    python bench/replay_adaptive.py --costs T.json   # one more cost table (format below), in every family it fits
    python bench/replay_adaptive.py --sweep          # the policy's exploration and hysteresis settings, compared

Real servers cannot say whether the policy is good where the step cost hardly bends with the width or the batch
(the CPU), and a GPU is not always at hand. The replay runs the objects a server runs (``WidthPolicy`` with the
acceptance estimate and cost table ``start_runtime`` gives it, through ``AdaptiveRuntime``, with the settings of
``AdaptiveConfig()``) against an environment made of measurements:

- **Acceptance**: per request, per step, what real serving accepted (``bench/data/acceptance_traces.json``, recorded
  by ``scripts/record_acceptance.py`` from CPU servers: DFlash chains of 7 and tree budgets 2..32 for the matched
  and the mismatched drafter, EAGLE3 chains of 7), and the per-position acceptance of Kimi-K2.5-DFlash serving
  Kimi-K2.6 (64 / 34 / 18 / 9 / 3 / 1 / 0.5 %, a depth drawn per step from a seeded stream). Outcomes are drawn in
  recorded order per request: the k-th decode step of a replayed request takes the k-th recorded step of its
  recording (the same draw for every contender). A chain recorded at its full width gives every narrower chain's
  outcome (the depth its drafts reached, capped at the width); a tree recorded at its widest budget with each
  step's accepted path (node numbers, best first) gives every narrower budget's outcome on the same step (the
  path's nodes numbered within the budget: DDTree budgets are nested), and the policy sees those paths as a server's
  tree worker hands them over; without paths each budget has its own recording (budget 1 is the chain's first
  draft). The paired environment prints how often each budget's own recording agrees with it on the first step
  (the one step whose context is the same for every budget). A request that runs more steps than its recording
  wraps around it. The texts' token positions are not followed: narrow chains take more steps per token than the
  recording did, and meet the recorded sequence of easy and hard steps, not the same tokens.
- **Cost** ``t(B, w)``: seconds per step by batch and width, from ``bench/results/bench_adaptive.json`` (CPU: the
  step time each served configuration implies, ``concurrency x tau / output tokens/s``, both drafters' groups
  averaged), from the H200 serving JSONs (CUDA graphs, bf16: autoregressive, the DFLASH chain of 7, the tree of 8),
  and from any table in the format below (``--costs``, or a file in ``bench/data/costs/``; ``bench/bench_step_cost.py``
  writes Kimi-shaped ones). Between tabulated widths and batches the cost is linear; beyond the widest, it goes on
  along the last two. Every charged step is multiplied by noise at the spread of its device class (``NOISE``): a
  per-step jitter and a slow drift (a shared machine's slow spells), both of mean one; the policy sees the noisy
  seconds, and its start-up profile is the table scaled by 1 / 1.4 (dummy inputs: the CPU's real steps took 1.3-1.6x
  the profile) with the same per-cell jitter. With GPU-like noise the policy sees each step's outcome one step late,
  as a server reading CUDA events does.
- **Traffic**: closed-loop clients; constant concurrency 1 .. 64, a ramp 1 -> 64 -> 1, bursts (2 clients, then 48),
  and a mix of short and long requests. Prefill is not modelled: every step is a decode step.

Contenders in the same environment (same texts, same noise per step): the policy; the **oracle** (for each batch
bucket the width with the best true ``E_w / t(bucket, w)``: ``E_w`` from walking the recorded texts at width ``w``,
``t`` noise-free); every **static** width (0 = no speculation); on EAGLE3 chains, **SGLang 0.5.23's adaptive
controller** (``AdaptiveController`` over ``AdaptiveSpeculativeParams`` with its default config and initial steps,
driven without a server by the calls ``EAGLEWorkerV2`` makes: ``activate_step_by_batch`` before a step,
``on_verify_complete`` after it).

Targets, per scenario (judged, never tuned away): with GPU-like noise the policy is >= 0.97x the oracle in every
column and >= 0.99x in the geometric mean over the constant levels; >= 1.10x the best single static width (the
best geometric mean over the constant levels) where the oracle beats that width by >= 1.15x; never below 0.97x no
speculation; on EAGLE3 chains >= SGLang's controller in every column. With CPU-like noise, >= 0.93x the oracle in
every column.

Cost tables: the adaptive policy's step-costs files (``sglang-kimi-step-costs/1``, written by
``bench/bench_step_cost.py`` and ``bench/project_kimi.py --step-costs``: one table per mode), or this plain JSON
(``seconds`` required, the rest optional)::

    {"device": "NVIDIA H200, Kimi-K2.6 TP8", "modes": ["chain", "tree", "eagle3-chain"], "noise": "gpu",
     "source": "what measured it", "seconds": {"<batch>": {"<width>": seconds per step, ...}, ...}}

``modes`` (default: all three; the servers' adaptive modes: DFLASH chains, DFLASH trees, EAGLE3 chains) says which
drafting the table prices, ``noise`` which spread its device has (``gpu`` or ``cpu``; a step-costs file's device
decides). Width 0 is the step without drafts.

Deterministic under ``--seed``. Writes ``bench/results/replay_adaptive.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import heapq
import json
import logging
import math
import random
import statistics
import sys
import time
from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TRACES = REPO / "bench" / "data" / "acceptance_traces.json"
EXTRA_COSTS = REPO / "bench" / "data" / "costs"
BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # default_buckets(64): powers of two up to the largest concurrency replayed
CHAIN_WIDTHS = tuple(range(8))  # DFLASH chains of a block of 8, EAGLE3 steps 0..7: the servers' defaults
TREE_WIDTHS = (0, 1, 2, 4, 8, 16, 32)  # default_tree_widths(32)
# P(at least d drafts accepted), d = 1..7: Kimi-K2.5-DFlash serving Kimi-K2.6
K25_ON_K26 = (0.64, 0.34, 0.18, 0.09, 0.03, 0.01, 0.005)
PROFILE_OFF = 1.4  # real steps over the start-up profile (the CPU measured 1.3-1.6)
LEVELS = (1, 2, 4, 8, 16, 32, 64)


# -- acceptance ----------------------------------------------------------------------------------------------


def _aligned(name: str, requests: Sequence[Sequence[int] | None]) -> list[list[int]]:
    """The recorded requests in prompt order, one left out of the recording (None) replaced by the next recorded one,
    so that request i is prompt i in every configuration of a drafter."""
    kept = [i for i, r in enumerate(requests) if r]
    if not kept:
        raise ValueError(f"acceptance trace {name}: no recorded request")
    return [list(requests[next((j for j in kept if j >= i), kept[0])]) for i in range(len(requests))]


class Source:
    """Acceptance by (request, step, width): ``accepted`` drafts of the ``step``-th decode step (from 0) of request
    ``request`` when it drafts ``width``. ``family``: chain or tree; ``widths``: the widths it can answer for."""

    family: str
    widths: tuple[int, ...]
    name: str

    def accepted(self, request: int, step: int, width: int) -> int:
        raise NotImplementedError

    def path(self, request: int, step: int, width: int) -> list[int] | None:
        """The accepted node numbers of that step (a tree source that recorded them), else None."""
        return None

    def steps_at(self, request: int, length: int, width: int) -> int:
        """Steps request ``request`` of ``length`` tokens takes at a static ``width`` (as :func:`replay` runs it)."""
        key = (request, length, width)
        cache = self.__dict__.setdefault("_steps", {})
        if key not in cache:
            p = n = 0
            while p < length:
                p = min(p + 1 + self.accepted(request, n, width), length)
                n += 1
            cache[key] = n
        return cache[key]

    def expected_tokens(self, width: int, requests: int = 64, length: int = 512) -> float:
        """Committed tokens per step at ``width`` (the oracle's ``E_w``): ``requests`` requests of ``length``
        tokens run at that width, their tokens over their steps (as the replay counts them: a request whose drafts
        are accepted less runs more steps)."""
        key = (width, requests, length)
        cache = self.__dict__.setdefault("_expected", {})
        if key not in cache:
            tokens = steps = 0
            for r in range(requests):
                p = k = 0
                while p < length:
                    p += 1 + self.accepted(r, k, width)
                    k += 1
                tokens, steps = tokens + p, steps + k
            cache[key] = tokens / steps
        return cache[key]


class ChainTraces(Source):
    """Chains recorded at their full width ``max_width``: the ``k``-th step of a request accepts what the ``k``-th
    recorded step did, at most its width (the depth the recorded chain reached gives every narrower chain's)."""

    family = "chain"

    def __init__(self, name: str, requests: Sequence[Sequence[int] | None], max_width: int):
        self.name = name
        self.requests = _aligned(name, requests)
        self.max_width = max_width
        self.widths = tuple(range(max_width + 1))

    def accepted(self, request: int, step: int, width: int) -> int:
        if width <= 0:
            return 0
        steps = self.requests[request % len(self.requests)]
        return min(steps[step % len(steps)], width)


class TreeTraces(Source):
    """Recorded tree budgets, each its own trace, drawn in recorded order as chains are; budget 1 is the chain's
    first draft, budget 0 no speculation."""

    family = "tree"

    def __init__(self, name: str, budgets: dict[int, Sequence[Sequence[int] | None]], chain: ChainTraces | None):
        self.name = name
        self.budgets = {b: _aligned(f"{name} budget {b}", reqs) for b, reqs in budgets.items()}
        self.chain = chain
        self.widths = tuple(sorted({0, *self.budgets, *((1,) if chain else ())}))

    def accepted(self, request: int, step: int, width: int) -> int:
        if width <= 0:
            return 0
        if width == 1 and width not in self.budgets and self.chain is not None:
            return self.chain.accepted(request, step, 1)
        recorded = self.budgets.get(width)
        if recorded is None:
            raise KeyError(f"acceptance trace {self.name}: no recording of budget {width} (have {self.widths})")
        steps = recorded[request % len(recorded)]
        return steps[step % len(steps)]


class NestedTreeTraces(Source):
    """A tree recorded at its widest budget with each step's accepted path (node numbers, best first): every budget
    ``b`` up to it accepts the path's nodes numbered within ``b`` on the same step, since the tree of budget ``b``
    is the first ``b`` nodes of the wider one (``speculators.policy.nodes_within``). Budget 1 is the chain's first
    draft, budget 0 no speculation. ``recorded``: the other budgets' own recordings, for :meth:`agreement`."""

    family = "tree"

    def __init__(
        self,
        name: str,
        width: int,
        paths: Sequence[Sequence[Sequence[int]] | None],
        recorded: dict[int, Sequence[Sequence[int] | None]] | None = None,
    ):
        self.name = name
        self.max_width = width
        kept = [i for i, p in enumerate(paths) if p]
        if not kept:
            raise ValueError(f"acceptance trace {name}: no request with recorded paths")
        self.paths = [list(paths[next((j for j in kept if j >= i), kept[0])]) for i in range(len(paths))]
        self.widths = tuple(sorted({0, *TREE_WIDTHS} & set(range(width + 1)) | {width}))
        self.recorded = {b: _aligned(f"{name} budget {b}", r) for b, r in (recorded or {}).items()}

    def _path(self, request: int, step: int) -> list[int]:
        steps = self.paths[request % len(self.paths)]
        return steps[step % len(steps)]

    def accepted(self, request: int, step: int, width: int) -> int:
        from sglang_kimi.speculators.policy import nodes_within

        if width > self.max_width:
            raise KeyError(f"acceptance trace {self.name}: recorded up to budget {self.max_width}, not {width}")
        return nodes_within(self._path(request, step), width) if width > 0 else 0

    def path(self, request: int, step: int, width: int) -> list[int] | None:
        path = self._path(request, step)
        return path[: self.accepted(request, step, width)]

    def agreement(self) -> dict[int, float]:
        """Per budget recorded on its own server: the share of requests whose first decode step accepted what the
        widest recording's first path gives that budget (the first step of every budget sees the same context;
        later steps do not, once the budgets have committed differently)."""
        out = {}
        for b, requests in sorted(self.recorded.items()):
            if b > self.max_width or b == self.max_width:
                continue
            pairs = [(r[0], self.accepted(i, 0, b)) for i, r in enumerate(requests) if r]
            out[b] = sum(x == y for x, y in pairs) / len(pairs) if pairs else float("nan")
        return out


class Curve(Source):
    """A chain drafter known by its per-position acceptance ``P(at least d drafts accepted)``: each (request, step)
    draws the depth its drafts reach from a seeded stream, so every width meets the same draws."""

    family = "chain"

    def __init__(self, name: str, reach: Sequence[float], seed: int):
        self.name = name
        self.reach = list(reach)
        self.widths = tuple(range(len(reach) + 1))
        self.seed = seed
        self._depths: dict[int, list[int]] = {}  # per request, the depth reached at each step

    def accepted(self, request: int, step: int, width: int) -> int:
        depths = self._depths.get(request)
        if depths is None or step >= len(depths):
            rng = random.Random(f"{self.seed}:{request}")
            draws = [rng.random() for _ in range(max(4096, 2 * step))]
            depths = [sum(1 for r in self.reach if u < r) for u in draws]  # reach is decreasing
            self._depths[request] = depths
        return min(depths[step], width)


def load_traces(path: Path = TRACES) -> dict[str, Source]:
    """The recorded sources: ``<drafter>/dflash-chain``, ``<drafter>/dflash-tree`` (every recorded budget),
    ``eagle3/chain``."""
    data = json.loads(path.read_text())
    if data.get("format") != "sglang-kimi-acceptance-traces/1":
        raise ValueError(f"{path}: not an acceptance-trace file (format {data.get('format')!r})")
    traces = data["traces"]
    sources: dict[str, Source] = {}
    for name, t in traces.items():
        if t["family"] == "chain":
            sources[name] = ChainTraces(name, t["requests"], t["width"])
    groups: dict[str, dict[int, dict]] = {}
    for name, t in traces.items():
        if t["family"] == "tree":
            groups.setdefault(name.split("/")[0], {})[int(t["width"])] = t
    for drafter, budgets in groups.items():
        name = f"{drafter}/dflash-tree"
        widest = budgets[max(budgets)]
        if any(widest.get("paths") or []):  # the paired environment: every budget from the widest one's paths
            recorded = {b: t["requests"] for b, t in budgets.items()}
            sources[name] = NestedTreeTraces(name, int(widest["width"]), widest["paths"], recorded)
        else:
            chain = sources.get(f"{drafter}/dflash-chain")
            sources[name] = TreeTraces(name, {b: t["requests"] for b, t in budgets.items()}, chain)
    return sources


# -- cost ----------------------------------------------------------------------------------------------------


MODES = ("chain", "tree", "eagle3-chain")  # the servers' adaptive modes (the cost profile key's ``mode``)


@dataclass
class StepTimes:
    """``t(B, w)`` of one mode: seconds per step from a table by batch and width, linear between its cells (and
    beyond the widest width along the last two, never decreasing); batches beyond the table are not replayed."""

    name: str
    device: str
    seconds: dict[int, dict[int, float]]
    mode: str
    noise: str = "gpu"
    source: str = ""

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"cost table {self.name}: mode {self.mode!r} is not one of {MODES}")
        if not self.seconds or any(not row for row in self.seconds.values()):
            raise ValueError(f"cost table {self.name}: needs at least one batch with at least one width")
        bad = [(b, w, s) for b, row in self.seconds.items() for w, s in row.items() if not (s > 0 and math.isfinite(s))]
        if bad or any(b < 1 or w < 0 for b, row in self.seconds.items() for w in row):
            raise ValueError(f"cost table {self.name}: batches >= 1, widths >= 0, seconds finite and > 0 ({bad[:3]})")
        self._batches = sorted(self.seconds)
        self._cache: dict[tuple[int, int], float] = {}

    @staticmethod
    def _linear(points: dict[int, float], x: float) -> float:
        """Linear between the two nearest points; beyond the last, along the last two, never decreasing."""
        xs = sorted(points)
        if len(xs) == 1:
            return points[xs[0]]
        i = min(max(bisect_right(xs, x) - 1, 0), len(xs) - 2)
        a, b = xs[i], xs[i + 1]
        slope = (points[b] - points[a]) / (b - a)
        if x > b:
            return points[b] + max(slope, 0.0) * (x - b)
        return points[a] + slope * (x - a)

    def __call__(self, batch: int, width: int) -> float:
        key = (batch, width)
        if key not in self._cache:
            rows = {b: self._linear(self.seconds[b], width) for b in self._batches}
            self._cache[key] = max(self._linear(rows, batch), 1e-9)
        return self._cache[key]

    def widest(self) -> int:
        return min(max(row) for row in self.seconds.values())

    def largest_batch(self) -> int:
        return self._batches[-1]


def load_costs(path: Path) -> list[StepTimes]:
    """The tables of a file, one per mode: the adaptive policy's step-costs format (``sglang-kimi-step-costs/1``,
    read by ``speculative/adaptive/profile.read_step_costs``), or the plain format of the module docstring;
    ValueError naming the file and the problem."""
    from sglang_kimi.speculative.adaptive.profile import STEP_COSTS_FORMAT, read_step_costs

    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read a cost table ({type(e).__name__}: {e})") from None
    name = Path(path).name.removesuffix(".json").removesuffix(".step_costs")
    if isinstance(raw, dict) and raw.get("format") == STEP_COSTS_FORMAT:
        costs = read_step_costs(path)
        noise = "cpu" if costs.device.startswith("cpu") else "gpu"
        where = f"{costs.source or path} (TP {costs.tp})"
        return [StepTimes(name, costs.device, t, m, noise, where) for m, t in sorted(costs.seconds.items())]
    try:
        seconds = {int(b): {int(w): float(s) for w, s in row.items()} for b, row in raw["seconds"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(
            f"{path}: not a cost table ({type(e).__name__}: {e}); expected "
            '{"device": ..., "seconds": {"<batch>": {"<width>": seconds}}}'
        ) from None
    modes, noise = raw.get("modes", list(MODES)), raw.get("noise", "gpu")
    if not isinstance(modes, list) or not set(modes) <= set(MODES) or noise not in NOISE:
        raise ValueError(f"{path}: 'modes' must be a list among {list(MODES)}, 'noise' one of {list(NOISE)}")
    device, source = str(raw.get("device", "?")), str(raw.get("source", path))
    return [StepTimes(name, device, seconds, m, noise, source) for m in modes]


def _geomean_rows(cells: dict[int, dict[int, list[float]]]) -> dict[int, dict[int, float]]:
    return {b: {w: statistics.geometric_mean(v) for w, v in sorted(row.items())} for b, row in sorted(cells.items())}


def costs_from_bench_adaptive(path: Path = RESULTS / "bench_adaptive.json") -> list[StepTimes]:
    """The CPU's step seconds implied by each served static configuration of ``bench_adaptive.py``: concurrency x
    tau / output tokens/s (tau 1 without speculation), the two DFlash drafters' groups averaged (a step's cost
    does not depend on the drafter's weights) and priced for chains and trees alike (the adaptive DFLASH worker
    runs both); the EAGLE3 group apart (its drafter runs once per step)."""
    data = json.loads(path.read_text())
    results = data["results"]
    widths = {"none": 0, "chain-2": 2, "chain-7": 7, "tree-8": 8, "tree-16": 16, "tree-32": 32, "eagle3-static-3": 3}
    device = f"CPU, {data['machine'].get('cpus')} cores, tiny Kimi"
    where = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)

    def cells(groups) -> dict[int, dict[int, list[float]]]:
        out: dict[int, dict[int, list[float]]] = {}
        for configs in groups:
            for name, levels in configs.items():
                if name not in widths:
                    continue
                for lv in levels:
                    c, tput = lv["concurrency"], lv["output_throughput"]
                    out.setdefault(c, {}).setdefault(widths[name], []).append(c * (lv.get("tau") or 1.0) / tput)
        return out

    dflash = _geomean_rows(cells(results["drafters"].values()))
    tables = [StepTimes("cpu-tiny", device, dflash, mode, "cpu", where) for mode in ("chain", "tree")]
    if results.get("eagle3"):
        eagle = _geomean_rows(cells([results["eagle3"]]))
        tables.append(StepTimes("cpu-tiny", device, eagle, "eagle3-chain", "cpu", where))
    return tables


def costs_from_serving(pattern: str = str(RESULTS / "serve-NVIDIA_H200-*.json")) -> list[StepTimes]:
    """The H200's step seconds from the serving checks with CUDA graphs in bf16 (the tiny model): the
    autoregressive server (width 0), SGLang's DFLASH chain of 7 and the plugin's DDTree of budget 8, each
    concurrency x tau / tokens/s, runs of the same row averaged."""
    rows = {"graphs/autoregressive": 0, "graphs/dflash-chain": 7, "graphs/dflash-tree-8": 8}
    cells: dict[int, dict[int, list[float]]] = {}
    for path in sorted(glob.glob(pattern)):
        data = json.loads(Path(path).read_text())
        if "bfloat16" not in str(data.get("dtype")):
            continue
        for row in data["rows"]:
            if row.get("config") in rows and row.get("throughput"):
                for lv in row["throughput"]:
                    c = lv["concurrency"]
                    seconds = c * (row.get("tau") or 1.0) / lv["tok_s"]
                    cells.setdefault(c, {}).setdefault(rows[row["config"]], []).append(seconds)
    if not cells:
        return []
    table = _geomean_rows(cells)
    device = "NVIDIA H200, CUDA graphs, bf16, tiny Kimi"
    where = "bench/results/serve-NVIDIA_H200-*.json"
    chain = {b: {w: s for w, s in row.items() if w in (0, 7)} for b, row in table.items()}
    tree = {b: {w: s for w, s in row.items() if w in (0, 8)} for b, row in table.items()}
    return [
        StepTimes("h200-tiny", device, chain, "chain", "gpu", where),
        StepTimes("h200-tiny", device, tree, "tree", "gpu", where),
    ]


# -- noise ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Noise:
    """Multiplicative noise on every step, of mean one: a per-step jitter ``exp(jitter * z)`` times a slow drift
    (an AR(1) process in time of stationary spread ``drift`` and correlation time ``drift_steps`` plain decode
    steps of one request: a shared machine's slow spells), the same for every contender at the same simulated time;
    the start-up profile's cells carry the jitter too. ``lag``: steps before an outcome reaches the policy."""

    name: str
    jitter: float
    drift: float
    drift_steps: float
    lag: int


NOISE = {
    # a GPU's step times spread by a few percent, and the host reads them one step late (CUDA events)
    "gpu": Noise("gpu", jitter=0.03, drift=0.02, drift_steps=500, lag=1),
    # the 2-core CPU: the runs of one configuration spread 10-40% (slow spells of a shared machine)
    "cpu": Noise("cpu", jitter=0.15, drift=0.15, drift_steps=300, lag=0),
}


class NoiseStream:
    """The noise factor of a step by its index (the jitter) and its start time (the drift), the same for every
    contender of a scenario (common random numbers). ``unit``: seconds of the time unit (one plain decode step of
    one request in the scenario's table)."""

    CELLS = 8  # drift cells per correlation time

    def __init__(self, noise: Noise, seed: int, unit: float):
        self.noise = noise
        self.jitter_rng = random.Random(f"jitter:{seed}")
        self.drift_rng = random.Random(f"drift:{seed}")
        self.jitters: list[float] = []
        self.drifts: list[float] = []
        self.cell = unit * noise.drift_steps / self.CELLS
        self._level = self.drift_rng.gauss(0.0, noise.drift)

    def factor(self, k: int, now: float) -> float:
        n = self.noise
        while len(self.jitters) <= k:
            self.jitters.append(math.exp(self.jitter_rng.gauss(0.0, n.jitter) - n.jitter**2 / 2))
        cell = int(now / self.cell)
        rho = math.exp(-1.0 / self.CELLS)
        while len(self.drifts) <= cell:
            self.drifts.append(math.exp(self._level - n.drift**2 / 2))
            self._level = rho * self._level + math.sqrt(1 - rho * rho) * self.drift_rng.gauss(0.0, n.drift)
        return self.jitters[k] * self.drifts[cell]


# -- traffic -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Traffic:
    """Requests in arrival order, each (output tokens, the most requests in flight while it waits to start)."""

    name: str
    requests: tuple[tuple[int, int], ...]


def constant(c: int, tokens: int, per_client: int = 16) -> Traffic:
    """``c`` clients, each sending ``per_client`` requests of ``tokens`` output tokens one after another."""
    return Traffic(f"c={c}", tuple((tokens, c) for _ in range(per_client * c)))


def ramp(tokens: int, top: int) -> Traffic:
    """Clients 1, 2, 4, ... up to ``top`` and back down, four requests per client at each level."""
    up = [c for c in LEVELS if c < top] + [top]
    return Traffic("ramp", tuple((tokens, c) for c in up + up[-2::-1] for _ in range(4 * c)))


def burst(tokens: int, top: int) -> Traffic:
    """Two clients, then a burst of ``top`` (at most 48), three times."""
    high = min(48, top)
    phases = [(2, 16), (high, 4 * high)] * 3
    return Traffic("burst", tuple((tokens, c) for c, n in phases for _ in range(n)))


def mix(tokens: int, seed: int, top: int) -> Traffic:
    """16 clients (at most ``top``), 70% of the requests a quarter of ``tokens`` long, 30% four times as long."""
    rng = random.Random(f"mix:{seed}")
    clients = min(16, top)
    n = 12 * clients
    return Traffic("mix", tuple((tokens // 4 if rng.random() < 0.7 else tokens * 4, clients) for _ in range(n)))


def traffics(tokens: int, seed: int, top: int = LEVELS[-1], per_client: int = 16) -> list[Traffic]:
    """The columns of a scenario whose cost table reaches batch ``top``: the constant levels up to it, the ramp,
    the bursts and the mix."""
    levels = [c for c in LEVELS if c <= top]
    shapes = [ramp(tokens, top), burst(tokens, top), mix(tokens, seed, top)]
    return [constant(c, tokens, per_client) for c in levels] + shapes


# -- contenders ----------------------------------------------------------------------------------------------


class Static:
    def __init__(self, width: int):
        self.width = width

    def choose(self, batch: int) -> int:
        return self.width

    def observe(self, batch: int, width: int, accepted: list[int], seconds: float, paths=None) -> None:
        pass


class Oracle(Static):
    """For each batch bucket the width with the best true expected rate (given, not learned)."""

    def __init__(self, by_bucket: dict[int, int], bucket: Callable[[int], int]):
        self.by_bucket = by_bucket
        self.bucket = bucket

    def choose(self, batch: int) -> int:
        return self.by_bucket[self.bucket(batch)]


class ReplayClock:
    """``AdaptiveRuntime``'s clock in simulated time. ``lag`` 0: outcomes are folded in at once (the CPU's wall
    clock); 1: a step's outcome is ready once the next step has been chosen (CUDA events read without a wait)."""

    def __init__(self, lag: int):
        self.cuda = lag > 0
        self.now = 0.0

    def mark(self) -> float:
        return self.now

    def ready(self, end: float) -> bool:
        return end < self.now if self.cuda else end <= self.now  # lag 0: the step just recorded is ready

    @staticmethod
    def seconds(start: float, end: float) -> float:
        return end - start


def plugin_policy(
    family: str, widths: Sequence[int], buckets: Sequence[int], profile: dict, overrides: dict | None = None
):
    """The policy a server builds (``speculative/adaptive/start.start_runtime`` with ``dflash.start_adaptive`` or
    ``eagle.start_eagle_adaptive``): the acceptance estimate of the family, the profiled cost table, the settings
    of ``AdaptiveConfig()``. ``overrides``: settings to change (``AdaptiveConfig`` fields, or ``WidthPolicy``
    keywords the settings file does not carry), for the sweep."""
    from sglang_kimi.speculative.adaptive.config import AdaptiveConfig, acceptance_estimate, width_policy
    from sglang_kimi.speculators.policy import CostTable

    overrides = dict(overrides or {})
    known = {f.name for f in dataclasses.fields(AdaptiveConfig)}
    config = dataclasses.replace(AdaptiveConfig(), **{k: v for k, v in overrides.items() if k in known})
    extra = {k: v for k, v in overrides.items() if k not in known}
    acceptance = acceptance_estimate(config, family == "chain", widths)
    costs = CostTable(decay=config.cost_decay)
    for bucket, row in profile.items():
        for width, seconds in row.items():
            costs.set(bucket, width, seconds)
    return width_policy(config, widths, buckets, acceptance, costs, **extra)


class Policy:
    """The served policy, through the server's ``AdaptiveRuntime`` (the object the DFLASH worker and the EAGLE
    steps policy call): ``choose`` before a step, the step's marks and accepted counts after it."""

    def __init__(self, policy, lag: int):
        import torch

        from sglang_kimi.speculative.adaptive.runtime import AdaptiveRuntime

        self._tensor = torch.tensor
        self.clock = ReplayClock(lag)
        self.runtime = AdaptiveRuntime(policy, "replay", "cpu", prometheus=False, clock=self.clock)
        self.decisions: list[int] = []

    def choose(self, batch: int) -> int:
        width = self.runtime.choose(batch)
        self.decisions.append(width)
        return width

    def observe(self, batch: int, width: int, accepted: list[int], seconds: float, paths=None) -> None:
        start = self.clock.mark()
        self.clock.now += seconds
        nodes = None if paths is None else self._tensor(accepted_node_rows(paths))
        self.runtime.record(start, self.clock.mark(), batch, width, self._tensor(accepted), nodes)


def accepted_node_rows(paths: Sequence[Sequence[int]]) -> list[list[int]]:
    """Paths (accepted node numbers, root excluded) as the tree worker hands them to its runtime: the verify's
    accepted nodes [bs, D+1], the root's 0, then -1 padding."""
    depth = max((len(p) for p in paths), default=0)
    return [[0, *p] + [-1] * (depth - len(p)) for p in paths]


class _EagleWorker:
    """What SGLang's ``AdaptiveController`` needs of ``EAGLEWorkerV2``: the active step count and its switch."""

    def __init__(self, steps: int):
        self.speculative_num_steps = steps

    def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None):
        return speculative_num_steps

    def apply_runtime_state(self, state) -> None:
        self.speculative_num_steps = state


class SGLangAdaptive:
    """SGLang's own adaptive EAGLE controller with its default config: the initial steps are the middle of its
    candidates (as ``_init_adaptive_speculative_params`` resolves them); ``activate_step_by_batch`` before each
    step and ``on_verify_complete`` after it, as ``EAGLEWorkerV2`` calls them."""

    def __init__(self):
        from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController
        from sglang.srt.speculative.adaptive_spec_params import (
            AdaptiveSpeculativeParams,
            resolve_candidate_steps_from_config,
        )

        candidates = resolve_candidate_steps_from_config(None)
        initial = candidates[len(candidates) // 2]
        self.worker = _EagleWorker(initial)
        self.controller = AdaptiveController(self.worker, AdaptiveSpeculativeParams(initial_steps=initial))
        self.controller.init_states(cuda_graph_bs=None)

    def choose(self, batch: int) -> int:
        self.controller.activate_step_by_batch(batch)
        return self.worker.speculative_num_steps

    def observe(self, batch: int, width: int, accepted: list[int], seconds: float, paths=None) -> None:
        self.controller.on_verify_complete(accepted, batch)


# -- the replay ----------------------------------------------------------------------------------------------


def replay_static(width: int, source: Source, costs: StepTimes, noise: NoiseStream, traffic: Traffic) -> dict:
    """:func:`replay` of a static width, without walking the batch step by step: each request's steps at that width
    are known in advance, so only the batch size of each step is followed."""
    queue = deque(enumerate(traffic.requests))
    ends: list[int] = []  # the last step of each request in flight
    seconds, k = 0.0, 0
    while queue or ends:
        while queue and len(ends) < queue[0][1][1]:
            i, (length, _) = queue.popleft()
            heapq.heappush(ends, k + source.steps_at(i, length, width) - 1)
        seconds += costs(len(ends), width) * noise.factor(k, seconds)
        while ends and ends[0] == k:
            heapq.heappop(ends)
        k += 1
    tokens = sum(length for length, _ in traffic.requests)
    widths = {str(width): k}
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds, "steps": k, "widths": widths}


def replay(contender, source: Source, costs: StepTimes, noise: NoiseStream, traffic: Traffic) -> dict:
    """Runs ``traffic`` step by step: the contender chooses a width for the batch in flight, every request commits
    its accepted drafts + 1 (up to its length), the step costs ``t(B, w)`` times the noise of its index."""
    queue = deque(enumerate(traffic.requests))
    running: list[list[int]] = []  # [trace request, tokens committed, length, steps run]
    seconds = 0.0
    tokens = steps = 0
    widths: Counter = Counter()
    while queue or running:
        while queue and len(running) < queue[0][1][1]:
            i, (length, _) = queue.popleft()
            running.append([i, 0, length, 0])
        batch = len(running)
        width = contender.choose(batch)
        accepted, paths = [], []
        for r in running:
            a = source.accepted(r[0], r[3], width)
            accepted.append(a)
            paths.append(source.path(r[0], r[3], width))
            done = min(r[1] + 1 + a, r[2])
            tokens += done - r[1]
            r[1] = done
            r[3] += 1
        t = costs(batch, width) * noise.factor(steps, seconds)
        contender.observe(batch, width, accepted, t, None if None in paths else paths)
        seconds += t
        steps += 1
        widths[width] += 1
        running = [r for r in running if r[1] < r[2]]
    return {
        "tokens_per_s": tokens / seconds,
        "tokens": tokens,
        "seconds": seconds,
        "steps": steps,
        "widths": {str(w): n for w, n in sorted(widths.items())},
    }


@dataclass
class Scenario:
    source: Source
    costs: StepTimes
    noise: Noise
    widths: tuple[int, ...]
    eagle: bool = False

    @property
    def name(self) -> str:
        return f"{self.source.name} @ {self.costs.name}, {self.noise.name} noise"


def profile_of(costs: StepTimes, widths: Sequence[int], buckets: Sequence[int], noise: Noise, seed: int) -> dict:
    """The start-up profile a server would have measured: the table / ``PROFILE_OFF``, each cell with the jitter."""
    rng = random.Random(f"profile:{seed}")
    return {
        b: {w: costs(b, w) / PROFILE_OFF * math.exp(rng.gauss(0, noise.jitter) - noise.jitter**2 / 2) for w in widths}
        for b in buckets
    }


def oracle_widths(source: Source, costs: StepTimes, widths: Sequence[int], buckets: Sequence[int]) -> dict[int, int]:
    return {b: max(widths, key=lambda w: (source.expected_tokens(w) / costs(b, w), -w)) for b in buckets}


def run_scenario(
    scenario: Scenario,
    columns: Callable[[int], Sequence[Traffic]],
    seed: int,
    configs: dict | None = None,
    statics: bool = True,
    cold: bool = False,
) -> dict:
    """Every contender over every column (``columns(top)``: the traffics for a table reaching batch ``top``), in
    order. ``configs``: name -> settings overrides of the policies to run (default: the served defaults as
    ``policy``). The adaptive contenders are in service: one instance goes through every column and keeps what it
    learned, as a server does (and as ``bench_adaptive.py``'s servers do); ``cold`` adds ``policy-cold``, the
    served policy started afresh (its start-up profile only) for each column."""
    from sglang_kimi.speculators.policy import ChainAcceptance, CostTable, WidthPolicy

    configs = configs or {"policy": {}}
    widths, source, costs = scenario.widths, scenario.source, scenario.costs
    bucket = WidthPolicy(list(widths), list(BUCKETS), ChainAcceptance(1), CostTable()).bucket
    oracle = oracle_widths(source, costs, widths, BUCKETS)
    profile = profile_of(costs, widths, BUCKETS, scenario.noise, seed)

    def served(config: dict) -> Policy:
        return Policy(plugin_policy(source.family, widths, BUCKETS, profile, config), scenario.noise.lag)

    in_service: dict[str, object] = {name: served(config) for name, config in configs.items()}
    if scenario.eagle:
        in_service["sglang"] = SGLangAdaptive()
    out: dict = {
        "source": source.name,
        "costs": costs.name,
        "device": costs.device,
        "noise": scenario.noise.name,
        "widths": list(widths),
        "oracle_widths": {str(b): w for b, w in oracle.items()},
        "expected_tokens": {str(w): round(source.expected_tokens(w), 4) for w in widths},
        "columns": {},
    }
    for traffic in columns(costs.largest_batch()):
        contenders: dict[str, object] = {"oracle": Oracle(oracle, bucket), **in_service}
        if cold:
            contenders["policy-cold"] = served(configs.get("policy", {}))
        if statics:
            contenders.update({f"static-{w}": Static(w) for w in widths})
        elif "static-0" not in contenders:
            contenders["static-0"] = Static(0)
        column = {}
        for name, contender in contenders.items():
            noise = NoiseStream(scenario.noise, seed, costs(1, 0))
            if isinstance(contender, Policy):
                before = _counts(contender)
            if type(contender) is Static:
                result = replay_static(contender.width, source, costs, noise, traffic)
            else:
                result = replay(contender, source, costs, noise, traffic)
            if isinstance(contender, Policy):
                after = _counts(contender)
                result["switches"], result["explorations"] = (a - b for a, b in zip(after, before))
                snap = contender.runtime.policy.snapshot()["buckets"]
                result["chosen"] = {b: s["width"] for b, s in snap.items() if s["steps"]}
            column[name] = result
        out["columns"][traffic.name] = column
    return out


def _counts(contender: Policy) -> tuple[int, int]:
    """(switches, explorations) of a policy so far, over its buckets."""
    state = contender.runtime.policy.state.values()
    return sum(s.switches for s in state), sum(s.explorations for s in state)


# -- judging -------------------------------------------------------------------------------------------------


def geomean(xs) -> float:
    return statistics.geometric_mean(xs) if xs else float("nan")


def analyse(result: dict, policy: str = "policy") -> dict:
    """Ratios per column and the targets of the scenario's noise class (module docstring)."""
    cols = result["columns"]
    levels = [c for c in cols if c.startswith("c=")]
    rate = {c: {n: r["tokens_per_s"] for n, r in col.items()} for c, col in cols.items()}
    statics = [n for n in next(iter(cols.values())) if n.startswith("static-")]
    vs_oracle = {c: rate[c][policy] / rate[c]["oracle"] for c in cols}
    vs_none = {c: rate[c][policy] / rate[c]["static-0"] for c in cols}
    out = {
        "vs_oracle": vs_oracle,
        "vs_oracle_geomean": geomean([vs_oracle[c] for c in levels]),
        "vs_none": vs_none,
        "oracle_vs_none": {c: rate[c]["oracle"] / rate[c]["static-0"] for c in cols},
    }
    if len(statics) > 1:
        single = max(statics, key=lambda n: geomean([rate[c][n] for c in levels]))
        out["best_single_static"] = single
        out["vs_single_geomean"] = geomean([rate[c][policy] / rate[c][single] for c in levels])
        out["oracle_vs_single_geomean"] = geomean([rate[c]["oracle"] / rate[c][single] for c in levels])
        out["single_vs_oracle"] = {c: rate[c][single] / rate[c]["oracle"] for c in cols}
    if "policy-cold" in next(iter(cols.values())):
        out["cold_vs_oracle"] = {c: rate[c]["policy-cold"] / rate[c]["oracle"] for c in cols}
    if "sglang" in next(iter(cols.values())):
        out["vs_sglang"] = {c: rate[c][policy] / rate[c]["sglang"] for c in cols}
        out["sglang_vs_oracle"] = {c: rate[c]["sglang"] / rate[c]["oracle"] for c in cols}
    targets = {}
    if result["noise"] == "gpu":
        targets[">= 0.97x oracle in every column"] = min(vs_oracle.values()) >= 0.97
        targets[">= 0.99x oracle (geomean of the levels)"] = out["vs_oracle_geomean"] >= 0.99
        if out.get("oracle_vs_single_geomean", 0) >= 1.15:
            targets[">= 1.10x best single static (geomean; oracle edge >= 1.15x)"] = out["vs_single_geomean"] >= 1.10
        targets[">= 0.97x no speculation in every column"] = min(vs_none.values()) >= 0.97
        if "vs_sglang" in out:
            targets[">= SGLang's controller in every column"] = min(out["vs_sglang"].values()) >= 1.0
    else:
        targets[">= 0.93x oracle in every column"] = min(vs_oracle.values()) >= 0.93
    out["targets"] = targets
    return out


def table(result: dict, analysis: dict) -> str:
    cols = list(result["columns"])
    head = f"{'':<22}" + "".join(f"{c:>8}" for c in cols)
    lines = [f"\n{scenario_name(result)}", f"  oracle widths by bucket: {result['oracle_widths']}", head]

    def row(label, values, fmt="{:>8.3f}"):
        lines.append(f"{label:<22}" + "".join(fmt.format(v) for v in values))

    col = result["columns"]
    row("policy tok/s", [col[c]["policy"]["tokens_per_s"] for c in cols], "{:>8.4g}")
    row("policy / oracle", [analysis["vs_oracle"][c] for c in cols])
    if "cold_vs_oracle" in analysis:
        row("  started cold", [analysis["cold_vs_oracle"][c] for c in cols])
    if "best_single_static" in analysis:
        row(f"{analysis['best_single_static']} / oracle", [analysis["single_vs_oracle"][c] for c in cols])
    row("policy / none", [analysis["vs_none"][c] for c in cols])
    if "vs_sglang" in analysis:
        row("sglang / oracle", [analysis["sglang_vs_oracle"][c] for c in cols])
        row("policy / sglang", [analysis["vs_sglang"][c] for c in cols])
    lines.append(f"{'policy widths':<22}" + "".join(f"{_mode_width(col[c]['policy']['widths']):>8}" for c in cols))
    summary = f"  geomean of the levels: policy / oracle {analysis['vs_oracle_geomean']:.3f}"
    if "best_single_static" in analysis:
        summary += (
            f"; policy / {analysis['best_single_static']} {analysis['vs_single_geomean']:.3f}"
            f"; oracle / {analysis['best_single_static']} {analysis['oracle_vs_single_geomean']:.3f}"
        )
    lines.append(summary)
    for target, ok in analysis["targets"].items():
        lines.append(f"  {'met   ' if ok else 'MISSED'} {target}")
    return "\n".join(lines)


def _mode_width(widths: dict[str, int]) -> str:
    return max(widths, key=widths.get)


def scenario_name(result: dict) -> str:
    return f"{result['source']} @ {result['costs']}, {result['noise']} noise"


# -- scenarios -----------------------------------------------------------------------------------------------


def scenarios(
    sources: dict[str, Source], tables: Sequence[StepTimes], noises: Sequence[str] = ("gpu", "cpu")
) -> list[Scenario]:
    """Every source with every table of its mode, under each noise class. Widths: the mode's default candidates
    the source can answer for and the table does not extrapolate far beyond (at most twice its widest width)."""
    out = []
    for name, source in sources.items():
        mode = "eagle3-chain" if name.startswith("eagle3") else source.family
        default = TREE_WIDTHS if source.family == "tree" else CHAIN_WIDTHS
        for costs in tables:
            if costs.mode != mode:
                continue
            widths = tuple(w for w in default if w in source.widths and w <= max(7, 2 * costs.widest()))
            if source.family == "tree" and costs.widest() < max(widths):
                widths = tuple(w for w in widths if w <= costs.widest())
            for noise in noises:
                out.append(Scenario(source, costs, NOISE[noise], widths, eagle=mode == "eagle3-chain"))
    return out


def default_sources(seed: int, traces: Path = TRACES) -> dict[str, Source]:
    sources = load_traces(traces) if traces.exists() else {}
    sources["k2.5-on-k2.6/dflash-chain"] = Curve("k2.5-on-k2.6/dflash-chain", K25_ON_K26, seed)
    return sources


def default_tables(extra: Sequence[Path] = ()) -> list[StepTimes]:
    """The CPU's and the H200's tables from the results, every file in ``bench/data/costs/``, and ``extra``."""
    tables = costs_from_bench_adaptive() + costs_from_serving()
    paths = (sorted(EXTRA_COSTS.glob("*.json")) if EXTRA_COSTS.is_dir() else []) + list(extra)
    return tables + [t for p in paths for t in load_costs(p)]


SWEEP = {
    "explore_every": (10, 20, 40, 80),
    "explore_budget": (0.0, 0.0025, 0.005, 0.01, 0.02, 0.05),
    "hysteresis": (0.0, 0.02, 0.05, 0.1),
    "acceptance_decay": (0.99, 0.995, 0.999, 0.9995),
    "cost_decay": (0.95, 0.98, 0.99),
}


def parse_sweep(text: str | None) -> dict[str, tuple]:
    """``"explore_every=10,20;hysteresis=0,0.02"`` -> {name: values}; None or empty: :data:`SWEEP`."""
    if not text:
        return SWEEP
    out = {}
    for part in text.split(";"):
        name, _, values = part.partition("=")
        out[name.strip()] = tuple(_number(v) for v in values.split(","))
    return out


def _number(text: str) -> int | float:
    return float(text) if any(c in text for c in ".e") else int(text)


def parse_base(text: str | None) -> dict:
    """``"hysteresis=0.02,explore_every=10"`` -> {name: value}."""
    return {k.strip(): _number(v) for k, _, v in (p.partition("=") for p in (text or "").split(",") if p)}


def plot(results: list[dict], analyses: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    cols = 4
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
    for ax, result, analysis in zip(axes.flat, results, analyses):
        names = list(result["columns"])
        x = range(len(names))
        ax.plot(x, [analysis["vs_oracle"][c] for c in names], "o-", color="black", lw=2, label="policy")
        if "single_vs_oracle" in analysis:
            label = f"best single ({analysis['best_single_static']})"
            ax.plot(x, [analysis["single_vs_oracle"][c] for c in names], "s--", lw=1, label=label)
        ax.plot(x, [1 / analysis["oracle_vs_none"][c] for c in names], "x:", lw=1, label="no speculation")
        if "sglang_vs_oracle" in analysis:
            ax.plot(x, [analysis["sglang_vs_oracle"][c] for c in names], "^-", lw=1, label="SGLang adaptive")
        ax.axhline(0.97 if result["noise"] == "gpu" else 0.93, color="red", lw=0.8)
        ax.set_xticks(list(x), names, rotation=45, fontsize=7)
        ax.set_ylim(0.3, 1.1)
        ax.set_title(scenario_name(result), fontsize=8)
        ax.set_ylabel("tokens/s / oracle", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def sweep(
    chosen: list[Scenario], columns, seeds: Sequence[int], settings: dict[str, tuple], base: dict | None = None
) -> dict:
    """The policy with each value of each setting (the others at ``base``, else the served defaults) against the
    oracle, per scenario: the geometric mean over the levels of policy / oracle (over the seeds too) and its minimum
    over every column and seed."""
    base = dict(base or {})
    configs: dict[str, dict] = {"base": base}
    for key, values in settings.items():
        for v in values:
            configs[f"{key}={v}"] = base | {key: v}
    out: dict = {}
    for scenario in chosen:
        runs = [run_scenario(scenario, columns, seed, configs, statics=False) for seed in seeds]
        out[scenario.name] = {
            name: {
                "geomean": geomean(
                    [r[name]["tokens_per_s"] / r["oracle"]["tokens_per_s"] for result in runs for r in levels(result)]
                ),
                "min": min(
                    r[name]["tokens_per_s"] / r["oracle"]["tokens_per_s"]
                    for result in runs
                    for r in result["columns"].values()
                ),
            }
            for name in configs
        }
    return out


def levels(result: dict) -> list[dict]:
    return [col for c, col in result["columns"].items() if c.startswith("c=")]


def sweep_table(data: dict) -> str:
    """One row per setting: policy / oracle over the scenarios (the geometric mean of their level geomeans, the
    worst scenario's level geomean, the worst column anywhere)."""
    names = list(next(iter(data.values())))
    lines = [
        f"\nsettings sweep over {len(data)} scenarios: policy / oracle",
        f"{'setting':<28}{'mean':>8}{'worst geomean':>15}{'worst column':>14}",
    ]
    for n in names:
        mean = geomean([row[n]["geomean"] for row in data.values()])
        worst = min(row[n]["geomean"] for row in data.values())
        low = min(row[n]["min"] for row in data.values())
        lines.append(f"{n:<28}{mean:>8.4f}{worst:>15.4f}{low:>14.4f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per request (the mix: 1/4x and 4x)")
    ap.add_argument("--per-client", type=int, default=16, help="requests per client at each constant level")
    ap.add_argument("--only", help="run the scenarios whose name contains this text")
    ap.add_argument("--noise", default="gpu,cpu", help="noise classes to run (gpu, cpu)")
    ap.add_argument("--costs", type=Path, action="append", default=[], help="another cost table (module docstring)")
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument(
        "--sweep",
        nargs="?",
        const="",
        metavar="SETTINGS",
        help="compare the policy's settings instead, one at a time (default: SWEEP; or 'explore_every=10,20;...')",
    )
    ap.add_argument("--base", help="the sweep's other settings, e.g. 'hysteresis=0.02,explore_every=10'")
    ap.add_argument("--seeds", type=int, default=1, help="the sweep's seeds: --seed and the next ones")
    ap.add_argument("--out", type=Path, default=RESULTS / "replay_adaptive.json")
    args = ap.parse_args(argv)
    logging.getLogger("sglang").setLevel(logging.WARNING)
    noises = [n for n in args.noise.split(",") if n]
    unknown = [n for n in noises if n not in NOISE]
    if unknown:
        ap.error(f"--noise {unknown}: known {list(NOISE)}")
    sources = default_sources(args.seed, args.traces)
    agreement = {n: s.agreement() for n, s in sources.items() if isinstance(s, NestedTreeTraces)}
    for name, shares in agreement.items():
        print(
            f"{name}: every budget from the widest recording's paths; first steps agreeing with each budget's own "
            "recording: " + ", ".join(f"{b} {share:.0%}" for b, share in shares.items()),
            flush=True,
        )
    chosen = scenarios(sources, default_tables(args.costs), noises)
    if args.only:
        chosen = [s for s in chosen if args.only in s.name]
    if not chosen:
        ap.error("no scenario left to run")

    def columns(top: int) -> list[Traffic]:
        return traffics(args.tokens, args.seed, top, args.per_client)

    started = time.monotonic()
    if args.sweep is not None:
        settings = parse_sweep(args.sweep)
        seeds = [args.seed + i for i in range(args.seeds)]
        data = sweep(chosen, columns, seeds, settings, parse_base(args.base))
        print(sweep_table(data))
        out = args.out.with_name(args.out.stem + "_sweep.json")
        record = {"seeds": seeds, "base": parse_base(args.base), "settings": settings, "sweep": data}
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"\n{len(chosen)} scenarios in {time.monotonic() - started:.0f} s; results: {out}")
        return 0
    results, analyses = [], []
    for scenario in chosen:
        t0 = time.monotonic()
        result = run_scenario(scenario, columns, args.seed, cold=True)
        result["seconds"] = round(time.monotonic() - t0, 1)
        analysis = analyse(result)
        result["analysis"] = analysis
        results.append(result)
        analyses.append(analysis)
        print(table(result, analysis) + f"\n  ({result['seconds']} s)", flush=True)
    missed = [(scenario_name(r), t) for r, a in zip(results, analyses) for t, ok in a["targets"].items() if not ok]
    print(f"\n{len(results)} scenarios in {time.monotonic() - started:.0f} s; {len(missed)} targets missed")
    for name, target in missed:
        print(f"  MISSED {name}: {target}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "seed": args.seed,
                "tokens": args.tokens,
                "noise": {k: dataclasses.asdict(v) for k, v in NOISE.items()},
                "profile_off": PROFILE_OFF,
                "nested_tree_agreement": agreement,
                "scenarios": results,
            },
            indent=1,
        )  # fmt: skip
        + "\n"
    )
    png = args.out.with_suffix(".png")
    plot(results, analyses, png)
    print(f"results: {args.out}  plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
