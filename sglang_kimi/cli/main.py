"""``sglang-kimi``: serve, demo, doctor (and the eval, bench and tuning commands).

Every command has ``--help``. Bad input ends with one line on stderr naming the problem and the fix, and a
non-zero exit code.
"""

from __future__ import annotations

import argparse
import signal
import sys

from sglang_kimi.cli.demo import MODES, load_questions
from sglang_kimi.errors import command_failed
from sglang_kimi.version import __version__

SERVE_EPILOG = """\
Every argument not listed above goes to `python -m sglang.launch_server` unchanged. Defaults added when not
given: --model-path (the embedded tiny Kimi-K2.6 model; with it, --speculative-algorithm DFLASH or EAGLE3 gets
--speculative-draft-model-path the embedded drafter trained for it), --host 127.0.0.1, --port 30000, and
--language-model-only for a local multimodal checkpoint that ships no image processor (such as the embedded
model: SGLang cannot start it otherwise). On a machine without a GPU also: SGLANG_USE_CPU_ENGINE=1,
--device cpu, --attention-backend kimi_cpu (the plugin's CPU backend, which serves autoregressive and every
speculative mode), --sampling-backend pytorch, --cuda-graph-backend-decode disabled,
--cuda-graph-backend-prefill disabled, --dtype float32, TORCHDYNAMO_DISABLE=1 (SGLang's torch.compile'd helpers
run eagerly instead of compiling at the first requests), and the CPU import shims for sgl_kernel / torchvision. On
CPU, flags whose SGLang machinery needs a GPU are refused before weights load, naming the flag: LoRA, the
hierarchical cache, deterministic inference, the memory saver, watermarking, batch overlaps, the routed-experts
capture, block verification, prefill graphs, and --enable-torch-compile (SGLang's CPU graph runner serves only
intel_amx, and no speculative algorithm); so is a triton attention backend (--attention-backend, or the drafter's
--speculative-draft-attention-backend) without TRITON_INTERPRET=1. A flag set in SGLang's --config YAML file counts
as given (the command line still wins over the file), and relative paths work in both.

Several nodes (--nnodes N): run one `sglang-kimi serve` per node with the same flags, the same --dist-init-addr
HOST:PORT and its own --node-rank; node 0 serves the requests, the others answer /health only. Nodes on one
machine (a loopback --dist-init-addr) each take their share of its cores and need their own --port.

PD disaggregation (--disaggregation-mode prefill / decode): --language-model-only is not added (SGLang refuses it
there), so a multimodal checkpoint without an image processor is refused: serve a text-only one. On CPU the KV moves
with --disaggregation-transfer-backend mooncake_tcp. Requests go through sglang-router --pd-disaggregation
(docs/scale-out.md).

examples:
  sglang-kimi serve
  sglang-kimi serve --speculative-algorithm DFLASH --speculative-dflash-tree-budget 16
  sglang-kimi serve --model-path moonshotai/Kimi-K2.6 --tp 8 --speculative-algorithm DFLASH \\
      --speculative-draft-model-path z-lab/Kimi-K2.6-DFlash --speculative-num-draft-tokens 8
  sglang-kimi serve --tp 2 --nnodes 2 --node-rank 0 --dist-init-addr 127.0.0.1:5757 --port 30000 &
  sglang-kimi serve --tp 2 --nnodes 2 --node-rank 1 --dist-init-addr 127.0.0.1:5757 --port 30001
"""


def _count(text: str) -> int:
    """argparse type: an integer of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: give 1 or more")
    return value


def _port(text: str) -> int:
    from sglang_kimi.launcher.checks import LaunchError, port_number

    try:
        return port_number(text)
    except LaunchError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--port ")) from None


def cmd_serve(args: argparse.Namespace, sglang_args: list[str]) -> int:
    from sglang_kimi.launcher.server import LaunchError, ServerProcess, launch_command, require_sglang

    try:
        require_sglang(args.allow_untested_sglang)
        spec = launch_command(sglang_args)
    except LaunchError as exc:
        return command_failed(str(exc))
    mode = "CPU (shims: " + (", ".join(spec.shims) or "none") + ")" if spec.cpu else "GPU"
    if spec.nodes.rank == 0:
        print(f"sglang-kimi {__version__}: starting SGLang on {mode} at {spec.base_url}", flush=True)
    else:  # SGLang's other nodes run their ranks' schedulers only
        print(
            f"sglang-kimi {__version__}: starting node {spec.nodes.rank} of {spec.nodes.count} of SGLang on {mode}; "
            f"{spec.base_url} answers /health only (node 0 serves the requests)",
            flush=True,
        )
    print("  " + " ".join(spec.argv[1:]), flush=True)
    server = ServerProcess(spec)
    try:
        return server.proc.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        server.stop()


def cmd_demo(args: argparse.Namespace) -> int:
    from sglang_kimi.cli.demo import run_demo
    from sglang_kimi.launcher.server import LaunchError

    try:
        return run_demo(args)
    except LaunchError as exc:
        return command_failed(str(exc))
    except KeyboardInterrupt:
        print("\ninterrupted: the server was stopped", file=sys.stderr)
        return 130


def cmd_doctor(args: argparse.Namespace) -> int:
    from sglang_kimi.cli.doctor import run_doctor

    return run_doctor(args)


def cmd_tune(args: argparse.Namespace) -> int:
    from sglang_kimi.kernels.moe_tuner import TuneError, run_tune_moe

    try:
        path = run_tune_moe(args)
    except TuneError as exc:
        return command_failed(str(exc))
    print(f"wrote {path}")
    return 0


def cmd_calibrate_kv(args: argparse.Namespace) -> int:
    from sglang_kimi.models.kv_calibration import CalibrationError, run_calibrate_kv

    try:
        return run_calibrate_kv(args)
    except CalibrationError as exc:
        return command_failed(str(exc))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-kimi",
        description="SGLang plugin for fast, lossless speculative decoding of Kimi-K2.6 "
        "(DFlash with DDTree draft trees, EAGLE3 trees).",
    )
    parser.add_argument("--version", action="version", version=f"sglang-kimi {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="launch real SGLang with the plugin (CPU settings applied on a machine without a GPU)",
        description="Launch `python -m sglang.launch_server` with the plugin loaded.",
        epilog=SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--allow-untested-sglang",
        action="store_true",
        help="start even when the installed SGLang is outside the tested version range",
    )

    demo = sub.add_parser(
        "demo",
        help="the embedded tiny Kimi model in real SGLang: autoregressive, DFLASH chain and tree, EAGLE3 tree",
        description="The first run: starts the embedded tiny Kimi-K2.6-architecture model in real SGLang (on CPU "
        "when there is no GPU), answers a few GSM8K questions autoregressively and prints the answers and the "
        "plugin's registrations read back from /server_info; then serves the same questions with DFLASH chains, "
        "DFLASH draft trees (DDTree) and EAGLE3 trees, and prints tau, acceptance by draft position, tokens/s and "
        "whether every speculative output equals the autoregressive one. Every server is stopped (also on Ctrl-C).",
    )
    demo.add_argument(
        "--questions",
        type=_count,
        default=3,
        help=f"how many GSM8K questions to ask, 1 to {len(load_questions())} (default 3)",
    )
    demo.add_argument("--max-new-tokens", type=_count, default=96, help="tokens per answer (default 96)")
    demo.add_argument("--port", type=_port, default=None, help="server port (default: a free port)")
    demo.add_argument(
        "--modes",
        nargs="+",
        choices=list(MODES),
        default=list(MODES),
        help="what to run, in order; the first is the reference the others are compared with "
        f"(default: {' '.join(MODES)})",
    )
    demo.add_argument("--log-dir", default=None, help="where to write the servers' logs (default: a temporary folder)")

    doctor = sub.add_parser(
        "doctor",
        help="versions, device, what the plugin registers in SGLang, problems found (exit 1 on a problem)",
        description="Checks this machine: versions (sglang, torch, triton, transformers, aiter), the device, "
        "whether SGLang loads the plugin and what it registers (checked in a fresh SGLang process), the embedded "
        "assets and the kernel overrides that would be active. Exits 1 when it finds a problem.",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument(
        "--strict",
        action="store_true",
        help="also audit the plugin against the installed SGLang: every hook target of the registration table "
        "resolves, every hook still fits its target's signature, every serving module imports, the SGLang version "
        "is in the supported range and SGLang's plugin loader sees the entry point. Exit 1 naming each problem "
        "(the gate of an image build)",
    )
    doctor.add_argument(
        "--model-path",
        default=None,
        help="a local Kimi checkpoint folder: also report the vision tower and projector bytes that text-only "
        "serving (--language-model-only) does not load (read from the safetensors headers)",
    )

    tune = sub.add_parser("tune", help="generate kernel tuning tables on a GPU")
    tune_sub = tune.add_subparsers(dest="tune_target", metavar="TARGET", required=True)
    from sglang_kimi.kernels.moe_tuner import add_tune_moe_args

    add_tune_moe_args(
        tune_sub.add_parser(
            "moe",
            help="Triton autotune sweep of SGLang's fused-MoE kernel at the verify shapes (needs a GPU)",
            description="Times SGLang's Triton fused-MoE kernel for Kimi's expert shapes at M = batch x draft "
            "tokens over a config search space (progress bar), and writes a table in SGLang's JSON format that the "
            "plugin serves on this device from then on.",
        )
    )

    from sglang_kimi.models.kv_calibration import add_calibrate_kv_parser

    add_calibrate_kv_parser(sub)

    from sglang_kimi.evals.parsers import add_bench_parser, add_eval_parser

    add_eval_parser(sub)
    add_bench_parser(sub)

    from sglang_kimi.cli.acceptance import add_acceptance_parser
    from sglang_kimi.cli.drafter import add_drafter_parser

    add_acceptance_parser(sub)
    add_drafter_parser(sub)
    return parser


def _interrupt(signum, frame):
    raise KeyboardInterrupt


# Options whose value is itself SGLang flags: "--server-args --enable-lora" is what a user types, and argparse takes a
# value that starts with "-" (and holds no space) for an option of its own ("expected one argument").
SGLANG_FLAGS_OPTIONS = ("--server-args", "--baseline-args", "--candidate-args")


def _attach_flags_values(argv: list[str]) -> list[str]:
    """``--server-args --enable-lora`` as ``--server-args=--enable-lora``, for each of :data:`SGLANG_FLAGS_OPTIONS`."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in SGLANG_FLAGS_OPTIONS and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    if argv is None:
        # As the command: SIGTERM unwinds like Ctrl-C, so every server a command started is stopped with its group.
        signal.signal(signal.SIGTERM, _interrupt)
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":
        args, rest = parser.parse_known_args(argv)
        return cmd_serve(args, rest)
    if argv[:2] == ["drafter", "compare"] and "--" in argv:  # SGLang flags for the servers after --
        split = argv.index("--")
        args = parser.parse_args(argv[:split])
        from sglang_kimi.cli.drafter import run_drafter

        return run_drafter(args, argv[split + 1 :])
    if argv and argv[0] in ("eval", "bench"):
        argv = _attach_flags_values(argv)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return cmd_demo(args)
    if args.command == "doctor":
        return cmd_doctor(args)
    if args.command == "tune":
        return cmd_tune(args)
    if args.command == "calibrate-kv":
        return cmd_calibrate_kv(args)
    if args.command == "drafter":
        from sglang_kimi.cli.drafter import run_drafter

        return run_drafter(args)
    if args.command == "acceptance":
        from sglang_kimi.cli.acceptance import run_acceptance

        return run_acceptance(args)
    if args.command in ("eval", "bench"):
        from sglang_kimi.evals.parsers import cmd_bench, cmd_eval

        return cmd_eval(args) if args.command == "eval" else cmd_bench(args)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
