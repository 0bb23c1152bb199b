"""PNG plots of a benchmark (matplotlib, headless Agg backend).

- ``throughput.png``: output throughput (tok/s, all requests together) vs concurrency; baseline dashed.
- ``tpot.png``: TPOT mean and p99 (ms per output token after the first) vs concurrency; baseline dashed.
- ``acceptance.png``: acceptance rate (accepted / drafted) by draft position, one bar group per concurrency;
  a labelled empty frame ("n/a") when the server runs without speculative decoding.
"""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(levels: list[dict], pick) -> tuple[list[int], list[float]]:
    return [lv["concurrency"] for lv in levels], [pick(lv) for lv in levels]


def _concurrency_axis(ax, levels: list[dict]) -> None:
    ax.set_xscale("log", base=2)
    ticks = [lv["concurrency"] for lv in levels]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.grid(True, alpha=0.3)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_throughput(data: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(*_series(data["levels"], lambda lv: lv["output_throughput"]), "o-", label="server")
    if data.get("baseline"):
        ax.plot(*_series(data["baseline"]["levels"], lambda lv: lv["output_throughput"]), "s--", label="baseline")
    _concurrency_axis(ax, data["levels"])
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title("Output throughput vs concurrency")
    ax.legend()
    return _save(plt, fig, path)


def plot_tpot(data: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    runs = [("server", data["levels"], "-")]
    if data.get("baseline"):
        runs.append(("baseline", data["baseline"]["levels"], "--"))
    for name, levels, style in runs:
        ax.plot(*_series(levels, lambda lv: lv["tpot_ms"]["mean"]), "o" + style, label=f"{name} mean")
        ax.plot(*_series(levels, lambda lv: lv["tpot_ms"]["p99"]), "^" + style, label=f"{name} p99", alpha=0.6)
    _concurrency_axis(ax, data["levels"])
    ax.set_ylabel("TPOT (ms / output token)")
    ax.set_title("Time per output token vs concurrency")
    ax.legend()
    return _save(plt, fig, path)


def plot_acceptance(data: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    levels = [lv for lv in data["levels"] if lv.get("acceptance")]
    if not levels:
        ax.text(0.5, 0.5, "n/a: the server reports no\nspeculative-decoding counters", ha="center", va="center")
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        width = 0.8 / len(levels)
        depth = max(len(lv["acceptance"]["acceptance_per_position"]) for lv in levels)
        for j, lv in enumerate(levels):
            rates = [r if r is not None else 0.0 for r in lv["acceptance"]["acceptance_per_position"]]
            xs = [i + 1 + (j - (len(levels) - 1) / 2) * width for i in range(len(rates))]
            tau = lv["acceptance"].get("tau_level")
            label = f"concurrency {lv['concurrency']}" + (f" (tau {tau:.2f})" if tau is not None else "")
            ax.bar(xs, rates, width=width, label=label)
        ax.set_xticks(range(1, depth + 1))
        ax.set_xlabel("draft position (1 = first draft token)")
        ax.set_ylabel("acceptance rate (accepted / drafted)")
        ax.set_ylim(0, 1)
        ax.legend()
    ax.set_title("Acceptance by draft position")
    return _save(plt, fig, path)


def write_all(data: dict, out_dir: Path) -> list[Path]:
    return [
        plot_throughput(data, out_dir / "throughput.png"),
        plot_tpot(data, out_dir / "tpot.png"),
        plot_acceptance(data, out_dir / "acceptance.png"),
    ]
