"""``sglang-kimi tune moe``: the offline Triton sweep of SGLang's fused-MoE kernel at Kimi's verify shapes, whose
tuned tables take precedence over the shipped starting-point tables (``kernels/configs/moe/``, derived by
``tests/support/moe_tables.py``). Serving never imports this module: the tables are served by ``moe_configs.py``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

from .moe_configs import (
    DEFAULT_USER_DIR,
    KIMI_EXPERTS,
    KIMI_HIDDEN,
    KIMI_MOE_INTERMEDIATE,
    KIMI_TOPK,
    MOE_CONFIG_MODULE,
    USER_DIR_ENV,
    VERIFY_BATCHES,
    config_file_name,
    find_table,
    logger,
    read_table,
    user_table_dir,
    verify_m_values,
)


def _version_key(vdir: str) -> tuple[int, ...]:
    return tuple(int(x) for x in vdir.removeprefix("triton_").split("_"))


DTYPE_CHOICES = ("bf16", "fp8_w8a8", "int4_w4a16")


def add_tune_moe_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``sglang-kimi tune moe``."""
    parser.add_argument("--tp", type=int, default=8, help="tensor parallel size: N = moe_intermediate / tp (default 8)")
    parser.add_argument("--ep", type=int, default=1, help="expert parallel size: E = experts / ep (default 1)")
    parser.add_argument(
        "--experts",
        type=int,
        default=KIMI_EXPERTS,
        help=f"routed experts, 385 with the shared one fused (default {KIMI_EXPERTS})",
    )
    parser.add_argument("--hidden", type=int, default=KIMI_HIDDEN, help=f"hidden size (default {KIMI_HIDDEN})")
    parser.add_argument(
        "--moe-intermediate",
        type=int,
        default=KIMI_MOE_INTERMEDIATE,
        help=f"intermediate size of one expert (default {KIMI_MOE_INTERMEDIATE})",
    )
    parser.add_argument("--topk", type=int, default=KIMI_TOPK, help=f"experts per token (default {KIMI_TOPK})")
    parser.add_argument(
        "--dtype", choices=DTYPE_CHOICES, default="fp8_w8a8", help="expert weight format (default fp8_w8a8)"
    )
    parser.add_argument(
        "--block-shape", type=int, nargs=2, default=[128, 128], help="fp8 block quantization [n k] (default 128 128)"
    )
    parser.add_argument("--group-size", type=int, default=32, help="int4_w4a16 weight group size (default 32)")
    parser.add_argument(
        "--batches",
        type=int,
        nargs="+",
        default=list(VERIFY_BATCHES),
        help=f"decode batch sizes (default {' '.join(map(str, VERIFY_BATCHES))})",
    )
    parser.add_argument(
        "--draft-tokens",
        type=int,
        nargs="+",
        default=[2, 4, 8, 16],
        help="verify window widths; the kernel is timed at M = batch x draft tokens (default 2 4 8 16)",
    )
    parser.add_argument("--output-dir", type=Path, default=None, help=f"default ${USER_DIR_ENV} or {DEFAULT_USER_DIR}")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs per config (default 5)")
    parser.add_argument("--iters", type=int, default=20, help="timed runs per config; the median counts (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and routing (default 0)")
    parser.add_argument(
        "--max-configs", type=int, default=None, help="time only the first N configs of the search space (quick runs)"
    )
    return parser


class TuneError(ValueError):
    """A flag of ``sglang-kimi tune moe`` that cannot describe a MoE layer or a timing run."""


def check_tune_args(args: argparse.Namespace) -> None:
    """Refuse flags that describe no MoE layer SGLang could run, before the GPU is looked for."""
    positive = [("--tp", args.tp), ("--ep", args.ep), ("--experts", args.experts), ("--hidden", args.hidden)]
    positive += [("--moe-intermediate", args.moe_intermediate), ("--topk", args.topk), ("--iters", args.iters)]
    positive += [("--batches", b) for b in args.batches] + [("--draft-tokens", d) for d in args.draft_tokens]
    positive += [("--block-shape", b) for b in args.block_shape] + [("--group-size", args.group_size)]
    if args.max_configs is not None:
        positive.append(("--max-configs", args.max_configs))
    for flag, value in positive:
        if value < 1:
            raise TuneError(f"{flag} {value}: give 1 or more")
    if args.warmup < 0:
        raise TuneError(f"--warmup {args.warmup}: give 0 or more")
    if args.moe_intermediate % args.tp:
        raise TuneError(f"--tp {args.tp} does not divide --moe-intermediate {args.moe_intermediate}")
    if args.experts % args.ep:
        raise TuneError(f"--ep {args.ep} does not divide --experts {args.experts}")
    if args.topk > args.experts // args.ep:
        raise TuneError(f"--topk {args.topk} is more than the {args.experts // args.ep} experts on one rank")
    if args.dtype == "int4_w4a16":
        n = args.moe_intermediate // args.tp
        for name, k in (("--hidden", args.hidden), ("the per-rank intermediate size", n)):
            if k % args.group_size or k % 2:
                raise TuneError(f"{name} {k} is not a multiple of --group-size {args.group_size} (and of 2)")


def run_tune_moe(args: argparse.Namespace) -> Path:
    """Entry point of ``sglang-kimi tune moe``; returns the written table's path."""
    check_tune_args(args)
    out_dir = args.output_dir or user_table_dir()
    return tune_moe(
        experts=args.experts // args.ep,
        intermediate=args.moe_intermediate // args.tp,
        hidden=args.hidden,
        topk=args.topk,
        dtype=args.dtype,
        block_shape=tuple(args.block_shape) if args.dtype == "fp8_w8a8" else None,
        group_size=args.group_size,
        m_values=verify_m_values(args.batches, args.draft_tokens),
        output_dir=Path(out_dir),
        warmup=args.warmup,
        iters=args.iters,
        seed=args.seed,
        max_configs=args.max_configs,
    )


def search_space(dtype: str, block_shape, is_rocm: bool) -> list[dict]:
    """Candidate tiles (the space of SGLang's fused-MoE tuning script, pruned for small M and the dtype)."""
    configs = []
    for bm in (16, 32, 64):
        for bn in (32, 64, 128, 256):
            for bk in (64, 128, 256):
                if block_shape and (bk % block_shape[1] or (bn % block_shape[0] and block_shape[0] % bn)):
                    continue
                for gm in (1, 16, 32):
                    for warps in (4, 8):
                        for stages in (2,) if is_rocm else (2, 3, 4, 5):
                            cfg = {
                                "BLOCK_SIZE_M": bm,
                                "BLOCK_SIZE_N": bn,
                                "BLOCK_SIZE_K": bk,
                                "GROUP_SIZE_M": gm,
                                "num_warps": warps,
                                "num_stages": stages,
                            }
                            if is_rocm:
                                cfg["waves_per_eu"] = 0
                            configs.append(cfg)
    return configs


def _make_moe_inputs(E, N, hidden, topk, dtype, block_shape, group_size, M, device, gen):
    """Random weights and routing for one M (never zeros), in the layouts SGLang's fused_moe takes."""
    import torch
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    x = torch.randn(M, hidden, device=device, dtype=torch.bfloat16, generator=gen)
    logits = torch.randn(M, E, device=device, dtype=torch.float32, generator=gen)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), topk, dim=-1)
    topk_output = StandardTopKOutput(weights, ids.to(torch.int32), logits)
    kw = {}
    if dtype == "bf16":
        w1 = torch.randn(E, 2 * N, hidden, device=device, dtype=torch.bfloat16, generator=gen) / hidden**0.5
        w2 = torch.randn(E, hidden, N, device=device, dtype=torch.bfloat16, generator=gen) / N**0.5
    elif dtype == "fp8_w8a8":
        bn, bk = block_shape
        fp8 = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn
        w1 = (torch.randn(E, 2 * N, hidden, device=device, generator=gen) * 0.5).to(fp8)
        w2 = (torch.randn(E, hidden, N, device=device, generator=gen) * 0.5).to(fp8)
        kw = {
            "use_fp8_w8a8": True,
            "w1_scale": torch.rand(E, -(-2 * N // bn), -(-hidden // bk), device=device, generator=gen) * 1e-2 + 1e-3,
            "w2_scale": torch.rand(E, -(-hidden // bn), -(-N // bk), device=device, generator=gen) * 1e-2 + 1e-3,
            "block_shape": list(block_shape),
        }
    else:  # int4_w4a16: two 4-bit weights per byte along K, one scale per group of K
        w1 = torch.randint(0, 256, (E, 2 * N, hidden // 2), device=device, dtype=torch.uint8, generator=gen)
        w2 = torch.randint(0, 256, (E, hidden, N // 2), device=device, dtype=torch.uint8, generator=gen)
        kw = {
            "use_int4_w4a16": True,
            "w1_scale": torch.rand(E, 2 * N, hidden // group_size, device=device, generator=gen).to(torch.bfloat16),
            "w2_scale": torch.rand(E, hidden, N // group_size, device=device, generator=gen).to(torch.bfloat16),
            "block_shape": [0, group_size],
        }
    return x, w1, w2, topk_output, kw


@contextlib.contextmanager
def sglang_exec_context():
    """What SGLang's fused-MoE path reads outside a server, for a tuning or benchmark process.

    In SGLang 0.5.23 that path reads the process's published server configuration (``runtime_context.get_exec()``)
    and its tensor-parallel group (``get_parallel().tp_group``). A server process has both. Outside one, this
    publishes SGLang's default server arguments under SGLang's own role for such processes (``"test"``, rank 0)
    and builds world-size-1 groups (NCCL on a GPU, gloo on CPU), then tears both down. Older SGLang releases have
    no runtime context: nothing to do."""
    try:
        from sglang.srt import runtime_context as rc
    except ImportError:
        yield
        return
    if not hasattr(rc, "publish") or rc.get_context().is_config_namespace_published("exec"):
        yield
        return
    import torch
    from sglang.srt.distributed import parallel_state
    from sglang.srt.server_args import ServerArgs

    from sglang_kimi.launcher.checks import free_port

    rc.publish(ServerArgs(model_path="dummy"), role="test", ranks=rc.SpawnRanks(world_rank=0))
    built = False
    try:
        if not torch.distributed.is_initialized():
            parallel_state.init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
                backend="nccl" if torch.cuda.is_available() else "gloo",
            )
            built = True
            parallel_state.initialize_model_parallel()
        yield
    finally:
        if built:
            parallel_state.destroy_model_parallel()
            parallel_state.destroy_distributed_environment()
        rc.reset_context()


def _time_config(run, config, warmup, iters) -> float:
    """Median milliseconds of ``run()`` under ``override_config(config)`` (CUDA events)."""
    import torch
    from sglang.srt.layers.moe.moe_runner.triton_utils import override_config

    with override_config(config):
        for _ in range(warmup):
            run()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def tune_moe(
    *,
    experts: int,
    intermediate: int,
    hidden: int = KIMI_HIDDEN,
    topk: int = KIMI_TOPK,
    dtype: str = "fp8_w8a8",
    block_shape=(128, 128),
    group_size: int = 32,
    m_values: list[int] | None = None,
    output_dir: Path = DEFAULT_USER_DIR,
    warmup: int = 5,
    iters: int = 20,
    seed: int = 0,
    max_configs: int | None = None,
) -> Path:
    """Time every candidate tile of SGLang's fused-MoE Triton kernel at each verify M (tqdm progress), keep the
    fastest, and write the table in SGLang's format to ``output_dir`` (merged over the table SGLang or the plugin
    would use today, so rows for other M stay). Returns the file's path. GPU only."""
    import torch

    if not torch.cuda.is_available():  # before SGLang's MoE modules, whose imports need a GPU build
        raise TuneError(
            "tuning the fused-MoE kernel needs a CUDA or ROCm GPU (torch.cuda.is_available() is False); it times "
            "SGLang's Triton fused-MoE kernel on the device the tables are for"
        )
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts
    from tqdm import tqdm

    device = torch.device("cuda", torch.cuda.current_device())
    device_name = torch.cuda.get_device_name(device).replace(" ", "_")
    m_values = m_values or verify_m_values()
    config_dtype = None if dtype == "bf16" else dtype
    name = config_file_name(experts, intermediate, device_name, config_dtype, block_shape)
    space = search_space(dtype, block_shape, bool(torch.version.hip))
    if max_configs:
        space = space[:max_configs]
    gen = torch.Generator(device=device).manual_seed(seed)
    runner_config = MoeRunnerConfig(inplace=False)
    best: dict[int, dict] = {}
    with sglang_exec_context(), tqdm(total=len(m_values) * len(space), desc=f"tune {name}", unit="cfg") as bar:
        for M in m_values:
            x, w1, w2, topk_output, kw = _make_moe_inputs(
                experts, intermediate, hidden, topk, dtype, block_shape, group_size, M, device, gen
            )

            def run():
                return fused_experts(x, w1, w2, topk_output, runner_config, **kw)

            timings = []
            for cfg in space:
                try:
                    timings.append((_time_config(run, cfg, warmup, iters), cfg))
                except Exception as exc:  # noqa: BLE001 - a tile that does not compile or fit is skipped
                    logger.debug("config %s failed at M=%d: %s", cfg, M, exc)
                bar.update(1)
            if not timings:
                raise RuntimeError(f"no candidate config ran at M={M}")
            ms, cfg = min(timings, key=lambda t: t[0])
            best[M] = cfg
            bar.set_postfix(M=M, best_us=f"{ms * 1e3:.1f}")
    base = _current_table(name)
    merged = {**base, **best}
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / name
    with open(path, "w") as f:
        json.dump({str(k): merged[k] for k in sorted(merged)}, f, indent=4)
        f.write("\n")
    note = {
        "tuned": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "device": device_name,
        "triton": __import__("triton").__version__,
        "m_values": m_values,
        "rows_kept_from_previous_table": sorted(set(base) - set(best)),
    }
    with open(output_dir / (name[: -len(".json")] + ".tuning.json"), "w") as f:
        json.dump(note, f, indent=2)
    return path


def _current_table(name: str) -> dict[int, dict]:
    """The table in effect for ``name`` before tuning: the plugin's, else SGLang's shipped file, else empty."""
    found = find_table(name)
    if found is not None:
        return found[0]
    try:
        import importlib

        module = importlib.import_module(MOE_CONFIG_MODULE)
        root = Path(os.environ.get("SGLANG_MOE_CONFIG_DIR", os.path.dirname(module.__file__))) / "configs"
        for vdir in sorted(root.glob("triton_*"), key=lambda p: _version_key(p.name), reverse=True):
            if (vdir / name).is_file():
                return read_table(vdir / name)
    except Exception:  # noqa: BLE001 - no SGLang table: the tuned rows alone
        pass
    return {}
