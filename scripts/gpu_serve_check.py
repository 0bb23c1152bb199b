#!/usr/bin/env python
"""The embedded tiny Kimi model served by SGLang with the plugin on a GPU: greedy parity of every speculative mode
with the autoregressive server, tokens/s at several concurrencies, and tau, with CUDA graphs off and on.

Each configuration is one real server (``--attention-backend triton --sampling-backend pytorch``), started, asked,
and stopped in turn:

- parity: the demo's GSM8K questions, greedy, ``--max-new-tokens`` tokens each (``ignore_eos``), one at a time; a
  speculative mode's tokens must equal those of the autoregressive server with the same CUDA-graph setting;
- two sampled requests (temperature 0.8): the sampled verify path serves (its distribution is tested on CPU);
- throughput: at each ``--concurrency`` c, c untimed requests (Triton compiles kernels for the batch sizes it
  meets), then 2c requests (at least 4) from c client threads; tokens/s is the completion tokens over the wall
  time of those;
- tau and per-position acceptance from the plugin's metrics in ``/server_info``;
- the GPU's idle share over ``--profile-steps`` steps of SGLang's torch profiler at ``--profile-concurrency``: the
  host's part of a step that the device waits on (:func:`gpu_idle_share`); from the same trace, for the plugin's
  tree worker, each step phase's host milliseconds (``sglang_kimi.speculative.step_phases``) and the share of the step
  spent
  on the host outside the target forward (the ``host`` column)

The script stops starting servers once less than ``--min-left-s`` of ``--deadline-s`` is left and reports the rest
as not run; when the first autoregressive server cannot serve, it stops there (every other mode would fail the
same way). Results: a table, ``serve-<device>-<time>.json`` and ``.png`` in ``--out``.

    python scripts/gpu_serve_check.py --out /tmp/out          # on a GPU machine, SGLang and the plugin installed
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import requests

from sglang_kimi.cli.demo import gsm8k_prompt, load_questions, mode_args
from sglang_kimi.launcher.server import ANY_PORT, fetch_plugin_state, start_server

GPU_ARGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--mem-fraction-static", "0.3"]
# the profiled requests' length: a server with CUDA graphs still decodes them 1 s in (they are aborted after the
# profile), within the tiny model's 4096-token context
PROFILE_MAX_NEW_TOKENS = 3000
GRAPHS = {"eager": ["--disable-cuda-graph"], "graphs": ["--cuda-graph-max-bs-decode", "32"]}


def modes() -> dict[str, list[str]]:
    demo = mode_args()
    return {
        "autoregressive": demo["autoregressive"],
        "dflash-chain": demo["dflash-chain"],
        "dflash-tree-8": demo["dflash-chain"] + ["--speculative-dflash-tree-budget", "8"],
        "dflash-tree-32": demo["dflash-chain"] + ["--speculative-dflash-tree-budget", "32"],
        "eagle3-tree": demo["eagle3-tree"],
    }


def stand_ins() -> list[str]:
    """The plugin's CUDA stand-in entries that apply in this environment: servers with other ones compute other
    numbers (the MoE on the native loop or on the Triton fused MoE), so tokens are compared only between equal sets."""
    from sglang_kimi import plugin

    return sorted(e.name for e in plugin.REGISTRATIONS if e.when == plugin.CUDA_STAND_IN and not plugin.skip_reason(e))


def generate(base_url: str, prompt: str, max_new_tokens: int, temperature: float = 0.0) -> dict:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature}}
    body["sampling_params"]["ignore_eos"] = True
    response = requests.post(base_url + "/generate", json=body, timeout=300)
    response.raise_for_status()
    return response.json()


def throughput(base_url: str, prompts: list[str], concurrency: int, max_new_tokens: int) -> dict:
    n = max(4, 2 * concurrency)
    batch = [prompts[i % len(prompts)] for i in range(n)]
    with ThreadPoolExecutor(concurrency) as pool:  # untimed: Triton compiles its kernels for the batch sizes met
        list(pool.map(lambda p: generate(base_url, p, max_new_tokens), batch[:concurrency]))
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        outs = list(pool.map(lambda p: generate(base_url, p, max_new_tokens), batch))
    seconds = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"concurrency": concurrency, "requests": n, "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}


GPU_EVENT_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def trace_events(trace: Path) -> list[dict]:
    """The events of a torch profiler trace (Chrome JSON, gzipped or not)."""
    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt") as f:
        return json.load(f)["traceEvents"]


def gpu_idle_share(events: list[dict]) -> dict:
    """From a torch profiler trace's events (:func:`trace_events`) of a server decoding: the GPU's busy time (the union
    of its kernel and copy intervals) and the share of the window, first GPU event to last, in which the GPU had
    nothing to run. That idle share is the host's part of a step that the device waits on (drafting, tree build,
    verify bookkeeping, scheduling) whatever overlaps it; 0 for a step bound by the device alone."""
    spans = sorted(
        (e["ts"], e["ts"] + e.get("dur", 0))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_EVENT_CATEGORIES
    )
    if not spans:
        return {"gpu_events": 0}
    busy, (start, end) = 0.0, spans[0]
    for s, e in spans[1:]:
        if s > end:
            busy, start = busy + end - start, s
        end = max(end, e)
    busy += end - start
    window = max(e for _, e in spans) - spans[0][0]
    share = 1.0 - busy / window if window > 0 else 0.0
    return {"gpu_events": len(spans), "window_ms": window / 1e3, "gpu_busy_ms": busy / 1e3, "gpu_idle_share": share}


PHASE_PREFIX = "sglang_kimi."  # sglang_kimi.speculative.step_phases: the named ranges of a speculative step
STEP_RANGE = PHASE_PREFIX + "step"  # the whole step, around its phases
RUNTIME_CATEGORIES = {"cuda_runtime", "cuda_driver"}  # the host's calls into the CUDA (or HIP) runtime and driver
LAUNCH_CALLS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel", "hipGraphLaunch"}  # fmt: skip


def step_phases(events: list[dict]) -> dict:
    """From a profiler trace's events of a server whose worker marks its step phases
    (``sglang_kimi.speculative.step_phases``):
    each phase's host milliseconds per step, the step's period (first phase start to first phase start) and the
    share of the period spent on the host outside the target forward: drafting, tree build, verify bookkeeping.
    With more than one step the means are over the steps the period spans (all but the last, whose end the trace
    may cut or stretch), so the phases of a step add up to at most its period. Empty for a worker without phases
    (SGLang's own)."""
    named = [
        e
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name", "").startswith(PHASE_PREFIX)
    ]
    ranges = [e for e in named if e["name"] != STEP_RANGE]  # the phases; the step range holds them
    if not ranges:
        return {}
    first = STEP_RANGE if any(e["name"] == STEP_RANGE for e in named) else min(ranges, key=lambda e: e["ts"])["name"]
    starts = sorted(e["ts"] for e in named if e["name"] == first)  # each step's start
    steps = len(starts)
    timed = steps
    if steps > 1:  # the means over the steps the period spans: from the first start up to the last one
        ranges = [e for e in ranges if e["ts"] < starts[-1]]
        named = [e for e in named if e["ts"] < starts[-1]]
        timed = steps - 1
    per_phase: dict[str, float] = {}
    for e in ranges:
        name = e["name"][len(PHASE_PREFIX) :]
        per_phase[name] = per_phase.get(name, 0.0) + e.get("dur", 0) / 1e3 / timed
    out = {"steps": steps, "host_ms_per_step": {k: round(v, 4) for k, v in per_phase.items()}}
    out.update(_runtime_calls_per_phase(events, ranges, timed))
    if steps > 1:
        period = (starts[-1] - starts[0]) / 1e3 / (steps - 1)
        step_host = [e.get("dur", 0) / 1e3 for e in named if e["name"] == STEP_RANGE]
        if step_host:  # the step's range: everything in it but the target forward (SGLang's chain names no phase)
            outside = sum(step_host) / timed - per_phase.get("target_forward", 0.0)
        else:
            outside = sum(v for k, v in per_phase.items() if k != "target_forward")
        out.update(step_ms=round(period, 4), host_share_outside_target_forward=outside / period)
    return out


def _runtime_calls_per_phase(events: list[dict], ranges: list[dict], steps: int) -> dict:
    """Per phase and step: the kernels (and CUDA graphs) the host launched, the times it waited for the device
    (``*Synchronize`` calls: a ``.item()``, a device-to-host copy, a data-dependent shape) and the milliseconds it
    waited. A phase's calls are those of its thread within its range."""
    by_thread: dict[tuple, list[dict]] = {}
    for r in ranges:
        by_thread.setdefault((r.get("pid"), r.get("tid")), []).append(r)
    for rs in by_thread.values():
        rs.sort(key=lambda r: r["ts"])
    starts = {key: [r["ts"] for r in rs] for key, rs in by_thread.items()}
    launches: dict[str, float] = {}
    syncs: dict[str, float] = {}
    sync_ms: dict[str, float] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in RUNTIME_CATEGORIES:
            continue
        key = (e.get("pid"), e.get("tid"))
        i = bisect.bisect_right(starts.get(key, []), e["ts"]) - 1
        if i < 0 or e["ts"] > by_thread[key][i]["ts"] + by_thread[key][i].get("dur", 0):
            continue  # outside every phase: the scheduler's own work
        name = by_thread[key][i]["name"][len(PHASE_PREFIX) :]
        if e["name"] in LAUNCH_CALLS:
            launches[name] = launches.get(name, 0) + 1 / steps
        elif "Synchronize" in e["name"]:
            syncs[name] = syncs.get(name, 0) + 1 / steps
            sync_ms[name] = sync_ms.get(name, 0.0) + e.get("dur", 0) / 1e3 / steps
    return {
        "launches_per_step": {k: round(v, 2) for k, v in launches.items()},
        "syncs_per_step": {k: round(v, 2) for k, v in syncs.items()},
        "sync_ms_per_step": {k: round(v, 4) for k, v in sync_ms.items()},
    }


def _growing(path: Path, interval_s: float = 0.5) -> bool:
    size = path.stat().st_size
    time.sleep(interval_s)
    return path.stat().st_size != size


def profile(base_url: str, prompts: list[str], folder: Path, steps: int, concurrency: int, max_new_tokens: int,
            with_stack: bool = False, temperature: float = 0.0):  # fmt: skip
    """``steps`` scheduler steps of SGLang's torch profiler (``/start_profile``; ``with_stack``: with the Python
    calls) while ``concurrency`` requests decode (greedy, or sampled at ``temperature``); the trace's
    :func:`gpu_idle_share`. The requests ask for
    ``max_new_tokens`` so that even a server with CUDA graphs is still decoding when the profile starts, and are
    aborted once the trace is written."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    activities = ["CPU", "GPU"] if torch.cuda.is_available() else ["CPU"]
    with ThreadPoolExecutor(concurrency) as pool:
        jobs = [pool.submit(generate, base_url, prompts[i % len(prompts)], max_new_tokens, temperature)
                for i in range(concurrency)]  # fmt: skip
        try:
            time.sleep(1.0)  # past the prefills: the profiled steps decode
            if any(job.done() for job in jobs):
                raise RuntimeError(f"a request of {max_new_tokens} tokens ended within 1 s: nothing left to profile")
            body = {"output_dir": str(folder), "num_steps": steps, "activities": activities, "with_stack": with_stack}
            requests.post(base_url + "/start_profile", json=body, timeout=120).raise_for_status()
            deadline = time.monotonic() + 60  # the trace is written after the last profiled step
            while not (traces := sorted(folder.glob("*.trace.json*"))) and time.monotonic() < deadline:
                time.sleep(0.5)
            while traces and time.monotonic() < deadline and _growing(traces[0]):
                pass  # still being written
        finally:
            requests.post(base_url + "/abort_request", json={"abort_all": True}, timeout=60).raise_for_status()
            wait(jobs)
    complete = sum(job.exception() is None and job.result()["meta_info"]["completion_tokens"] == max_new_tokens
                   for job in jobs)  # fmt: skip
    if not traces:
        raise RuntimeError(f"no trace in {folder} 60 s after /start_profile: fewer than {steps} steps were profiled")
    events = trace_events(traces[0])
    return dict(gpu_idle_share(events), phases=step_phases(events), trace=str(traces[0].relative_to(folder.parent)),
                steps=steps, aborted=len(jobs) - complete)  # fmt: skip


def run_config(name: str, args: list[str], prompts: list[str], opts, out: Path) -> dict:
    row = {"config": name, "args": args}
    t0 = time.perf_counter()
    try:
        with start_server(args, cpu=False, port=ANY_PORT, log_path=out / f"{name}.log", timeout=opts.ready_s) as srv:
            row["ready_s"] = round(time.perf_counter() - t0, 1)
            row["output_ids"] = [generate(srv.base_url, p, opts.max_new_tokens)["output_ids"] for p in prompts]
            # the sampled verify path served at all (its distribution is tested on CPU): tokens of 2 requests
            row["sampled_tokens"] = [
                generate(srv.base_url, p, opts.max_new_tokens, temperature=0.8)["meta_info"]["completion_tokens"]
                for p in prompts[:2]
            ]
            row["throughput"] = [throughput(srv.base_url, prompts, c, opts.max_new_tokens) for c in opts.concurrency]
            if opts.profile_steps:  # long requests, so that the profiled steps all decode
                try:
                    row["profile"] = profile(srv.base_url, prompts, out / f"{name}-profile", opts.profile_steps,
                                             opts.profile_concurrency, PROFILE_MAX_NEW_TOKENS)  # fmt: skip
                except Exception as exc:  # the serving numbers stand without it
                    row["profile"] = {"error": f"{type(exc).__name__}: {str(exc)[-500:]}"}
            state = fetch_plugin_state(srv.base_url)
            metrics = state.get("spec_metrics") or {}
            row["tau"] = metrics.get("tau")
            row["acceptance_rate_per_position"] = metrics.get("acceptance_rate_per_position")
            row["registrations_failed"] = state.get("failed")
    except Exception as exc:  # one configuration's failure is a result; the log says why
        row["error"] = f"{type(exc).__name__}: {str(exc)[-1500:]}"
        log = out / f"{name}.log"
        if log.exists():
            lines = log.read_text(errors="replace").splitlines()
            row["log_tail"] = [ln for ln in lines if "Traceback" in ln or "Error" in ln][-6:] + lines[-25:]
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    return row


def compare(rows: list[dict], references: list[dict] = ()) -> None:
    """Each speculative row's parity with the autoregressive row of the same CUDA-graph setting (this run's, else a
    reference run's; the eager one where there is none with graphs)."""
    by_name = {r["config"]: r for r in list(references) + rows if "output_ids" in r}
    for row in rows:
        graphs, _, mode = row["config"].partition("/")
        ref = by_name.get(f"{graphs}/autoregressive") or by_name.get("eager/autoregressive")
        if mode == "autoregressive" or "output_ids" not in row or not ref:
            continue
        diverged = []
        for i, (ids, ref_ids) in enumerate(zip(row["output_ids"], ref["output_ids"])):
            if ids[: len(ref_ids)] != ref_ids:  # the demo's rule: every reference token, in order
                at = next((k for k, (a, b) in enumerate(zip(ids, ref_ids)) if a != b), min(len(ids), len(ref_ids)))
                diverged.append({"prompt": i, "first_different_token": at})
        row["equals_autoregressive"] = not diverged
        row["diverged"] = diverged
        row["reference"] = ref.get("from", "this run") + " " + ref["config"]


def print_table(rows: list[dict], concurrency: list[int]) -> None:
    head = (
        f"{'config':<24}{'ready s':>8}{'tau':>6}  {'= AR':<5}"
        + "".join(f"{f'c={c} tok/s':>12}" for c in concurrency)
        + f"{'GPU idle':>10}{'host':>8}"
    )
    print("\n" + head)
    for row in rows:
        if "error" in row or "skipped" in row:
            print(f"{row['config']:<24} {row.get('skipped') or row['error'][:120]}")
            continue
        tau = f"{row['tau']:.2f}" if row.get("tau") else "-"
        same = {True: "yes", False: "NO", None: "ref"}[row.get("equals_autoregressive")]
        tps = "".join(f"{t['tok_s']:>12.1f}" for t in row["throughput"])
        idle = (row.get("profile") or {}).get("gpu_idle_share")
        idle = "-" if idle is None else f"{idle:.1%}"
        host = ((row.get("profile") or {}).get("phases") or {}).get("host_share_outside_target_forward")
        host = "-" if host is None else f"{host:.1%}"  # the tree worker's host phases outside the target forward
        print(f"{row['config']:<24}{row['ready_s']:>8.1f}{tau:>6}  {same:<5}{tps}{idle:>10}{host:>8}")
    for row in rows:
        print_phases(row)


def print_phases(row: dict) -> None:
    """A tree worker's step, phase by phase: host ms, kernel launches and waits for the device per step."""
    phases = ((row.get("profile") or {}).get("phases")) or {}
    if not phases.get("host_ms_per_step"):
        return
    print(f"\n{row['config']}: {phases['steps']} steps of {phases.get('step_ms', float('nan')):.2f} ms (profiled)")
    print(f"  {'phase':<18}{'host ms':>9}{'launches':>10}{'syncs':>7}{'sync ms':>9}")
    for name, ms in phases["host_ms_per_step"].items():
        launches = phases.get("launches_per_step", {}).get(name, 0)
        syncs = phases.get("syncs_per_step", {}).get(name, 0)
        sync_ms = phases.get("sync_ms_per_step", {}).get(name, 0.0)
        print(f"  {name:<18}{ms:>9.3f}{launches:>10.1f}{syncs:>7.1f}{sync_ms:>9.3f}")


def plot(rows: list[dict], path: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    served = [r for r in rows if "throughput" in r]
    if not served:
        return
    fig, ax = plt.subplots(figsize=(10, 4.5))
    conc = [t["concurrency"] for t in served[0]["throughput"]]
    width = 0.8 / len(served)
    for k, row in enumerate(served):
        ax.bar([i + k * width for i in range(len(conc))], [t["tok_s"] for t in row["throughput"]], width,
               label=row["config"])  # fmt: skip
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(conc))], [f"concurrency {c}" for c in conc])
    ax.set_ylabel("completion tokens/s")
    ax.set_title(f"tiny Kimi model served by SGLang with sglang-kimi, {device}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the logs, the JSON and the PNG")
    p.add_argument("--graphs", default="eager,graphs", help="CUDA-graph settings in order: eager, graphs")
    p.add_argument("--modes", default=",".join(modes()), help=f"modes in order (of {', '.join(modes())})")
    p.add_argument(
        "--configs",
        help="GRAPHS/MODE items in the order to serve (eager/dflash-chain,graphs/dflash-chain,...); "
        "overrides --graphs and --modes",
    )
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 8, 32])
    p.add_argument("--deadline-s", type=float, default=500.0, help="wall time of the whole run")
    p.add_argument("--min-left-s", type=float, default=60.0, help="start no server with less than this left")
    p.add_argument("--ready-s", type=float, default=150.0, help="longest wait for one server to answer /health")
    p.add_argument(
        "--reference",
        type=Path,
        help="a JSON of an earlier run on the same device and settings whose autoregressive rows serve as the "
        "reference where this run has none",
    )
    p.add_argument(
        "--profile-steps",
        type=int,
        default=20,
        help="scheduler steps profiled per server for the GPU's idle share, the host's part of a step (0: none)",
    )
    p.add_argument("--profile-concurrency", type=int, default=8, help="requests decoding while profiled")
    p.add_argument("--dtype", default=None, help="--dtype for every server (default: the checkpoint's, bfloat16)")
    opts = p.parse_args(argv)
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    opts.out.mkdir(parents=True, exist_ok=True)
    prompts = [gsm8k_prompt(q) for q in load_questions()]
    all_modes = modes()
    if opts.configs:
        configs = [tuple(c.split("/", 1)) for c in opts.configs.split(",")]
    else:
        configs = [(g, m) for g in opts.graphs.split(",") for m in opts.modes.split(",")]
    bad = [f"{g}/{m}" for g, m in ((c + ("",))[:2] for c in configs) if g not in GRAPHS or m not in all_modes]
    if bad:
        p.error(f"unknown configurations {bad}; graphs: {list(GRAPHS)}, modes: {list(all_modes)}")
    applied = stand_ins()
    references = []
    if opts.reference:
        earlier = json.loads(opts.reference.read_text())
        dtype = opts.dtype or "checkpoint (bfloat16)"
        keys = ("max_new_tokens", "device", "stand_ins", "dtype")
        if tuple(earlier.get(k) for k in keys) != (opts.max_new_tokens, device, applied, dtype):
            print(
                f"--reference {opts.reference}: another device, --max-new-tokens, stand-ins or dtype; not used",
                flush=True,
            )
        else:
            references = [dict(r, **{"from": opts.reference.name}) for r in earlier["rows"] if "output_ids" in r]
    has_reference = any(r["config"] == "eager/autoregressive" for r in references)
    if not has_reference and ("eager", "autoregressive") not in configs:
        configs.insert(0, ("eager", "autoregressive"))  # parity needs a reference: serve it first
        print("no usable autoregressive reference: the autoregressive server is served first", flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    stem = f"serve-{device.replace(' ', '_')}-{stamp}"
    result = {"device": device, "torch": torch.__version__, "max_new_tokens": opts.max_new_tokens,
              "dtype": opts.dtype or "checkpoint (bfloat16)", "stand_ins": applied, "rows": []}  # fmt: skip
    rows = result["rows"]

    def save() -> None:  # after every configuration: a run cut short by its time limit keeps what it measured
        compare(rows, references)
        (opts.out / f"{stem}.json").write_text(json.dumps(result, indent=1))

    start = time.perf_counter()
    for graphs, mode in configs:
        name = f"{graphs}/{mode}"
        left = opts.deadline_s - (time.perf_counter() - start)
        if left < opts.min_left_s:
            rows.append({"config": name, "skipped": f"not run: {left:.0f} s of the deadline left"})
            continue
        args = GPU_ARGS + GRAPHS[graphs] + all_modes[mode] + (["--dtype", opts.dtype] if opts.dtype else [])
        print(f"[{time.perf_counter() - start:6.1f} s] {name} ...", flush=True)
        row = run_config(name.replace("/", "-"), args, prompts, opts, opts.out)
        row["config"] = name
        rows.append(row)
        save()
        print(f"[{time.perf_counter() - start:6.1f} s] {name}: {row.get('error', 'served')}", flush=True)
        if "error" in row:
            print("\n".join(row.get("log_tail", [])), flush=True)
            if mode == "autoregressive" and not any("throughput" in r for r in rows):
                print("the first autoregressive server did not serve: stopping", flush=True)
                break
    save()
    print_table(rows, opts.concurrency)
    plot(rows, opts.out / f"{stem}.png", device)
    failed = [r["config"] for r in rows if "error" in r or r.get("equals_autoregressive") is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
