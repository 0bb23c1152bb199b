"""Launch real SGLang server processes with the plugin, on a GPU box or on this CPU.

On a machine without a GPU, :func:`launch_command` applies SGLang's CPU settings (``SGLANG_USE_CPU_ENGINE=1``,
``--device cpu``, the plugin's ``kimi_cpu`` attention backend, the pytorch sampler, no CUDA graph, float32) and puts the
CPU import shims (``sglang_kimi/platform/cpu/shims``) on the server's ``PYTHONPATH`` for the packages that cannot be
imported here. The server runs in its own process group, and :meth:`ServerProcess.stop` ends the whole group:
SIGTERM alone can leave SGLang's scheduler and detokenizer behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from sglang_kimi.assets import TINY_DFLASH, TINY_EAGLE3, TINY_MODEL
from sglang_kimi.launcher.checks import (
    DEFAULT_HOST,
    HUB_ID,
    LaunchError,
    check_model_path,
    check_port_free,
    free_port,
    lacks_image_processor,
    port_number,
)
from sglang_kimi.platform.cpu import KIMI_CPU_BACKEND
from sglang_kimi.version import SUPPORTED_SGLANG

PACKAGE_DIR = Path(__file__).resolve().parent.parent
SHIMS_DIR = PACKAGE_DIR / "platform" / "cpu" / "shims"
# the drafter `serve` adds for a speculative algorithm when it serves the embedded model and no drafter is given
EMBEDDED_DRAFTERS = {"DFLASH": TINY_DFLASH, "EAGLE3": TINY_EAGLE3}
DEFAULT_PORT = 30000

# Flags applied on a CPU-only machine unless the user gives them.
CPU_DEFAULTS: dict[str, str | None] = {
    "--device": "cpu",
    # the plugin's CPU backend serves every mode (autoregressive, chains, trees, drafts); torch_native cannot verify
    "--attention-backend": KIMI_CPU_BACKEND,
    "--sampling-backend": "pytorch",
    # no CUDA graph in either phase (SGLang's per-phase spelling of the deprecated --disable-cuda-graph)
    "--cuda-graph-backend-decode": "disabled",
    "--cuda-graph-backend-prefill": "disabled",
    "--dtype": "float32",  # float32 on CPU: exact parity with transformers; bf16 CPU matmuls differ by ~2e-3
    # SGLang sizes the KV pool on a CPU from the host's available memory after loading, less (1 - this) x what was
    # available before: memory that other processes take meanwhile (servers started side by side) counts against
    # it, and at 0.3 a start-up failed whenever others took 30% of the free memory during its load. A high fraction
    # keeps that slack small; --max-total-tokens caps the pool (~0.5 GB for the tiny model) either way.
    "--mem-fraction-static": "0.85",
    "--max-total-tokens": "65536",
    "--skip-server-warmup": None,
    "--language-model-only": None,  # text only: image inputs need the real torchvision
    "--sleep-on-idle": None,  # an idle scheduler otherwise spins a core: servers side by side starve each other
}
DISAGGREGATION_REFUSES = ("--language-model-only",)  # CPU defaults SGLang refuses with --disaggregation-mode
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}
# set on CPU unless the user's environment has them (HF_HUB_OFFLINE is left out when a hub id is to be downloaded)
# The TP ranks of one CPU share its memory and each reads the machine's free memory at another moment: other
# processes allocating in between (servers starting beside it) made SGLang's balance check end the start-up ("The
# memory capacity is unbalanced"); it warns instead.
CPU_ENV_DEFAULTS = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                    "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "0"}  # fmt: skip
# SGLang wraps small helpers in torch.compile (the MoE router's grouped top-k, rotary embeddings); on a CPU every
# scheduler process compiles them with Inductor at its first batches, about 4 s on 2 cores before the first token
# (a 1-token shape, then again for longer ones). They run eagerly instead: the same operations, unfused. Left as
# it is when the environment sets it or --enable-torch-compile asks for compilation.
DYNAMO_DISABLE_ENV = "TORCHDYNAMO_DISABLE"


def has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()  # true on CUDA and ROCm builds with a device
    except ImportError:
        return False


def sglang_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


SGLANG_INSTALL_HINT = (
    "pip install 'sglang-kimi[sglang]' on a GPU machine; on a CPU-only machine run `make install` in the "
    "sglang-kimi checkout (it installs sglang==0.5.23 without its CUDA dependencies)"
)


def require_sglang(allow_untested: bool = False) -> str:
    from sglang_kimi.version import version_in_range

    version = sglang_version()
    if version is None:
        raise LaunchError(f"SGLang is not installed: {SGLANG_INSTALL_HINT}")
    if not allow_untested and not version_in_range(version, SUPPORTED_SGLANG):
        raise LaunchError(
            f"sglang {version} is installed but sglang-kimi is tested with sglang {SUPPORTED_SGLANG[1]}: "
            f"install it with `pip install sglang=={SUPPORTED_SGLANG[1]}` or pass --allow-untested-sglang"
        )
    return version


def _real_package_imports(name: str) -> bool:
    """Whether the real ``name`` imports in a fresh interpreter (checked out of process: a broken CUDA
    wheel can fail at import in ways that leave this process unusable)."""
    if importlib.util.find_spec(name) is None:
        return False
    probe = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, timeout=120)
    return probe.returncode == 0


def shims_needed() -> list[str]:
    """The CPU shims this machine needs: those whose real package is missing or does not import."""
    return [name for name in ("sgl_kernel", "torchvision") if not _real_package_imports(name)]


CPU_THREADS_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"


# SGLang's parallel sizes and their flag spellings; on CPU each rank of dp x tp x pp is one process with its cores.
# Attention data parallelism (--attn-dp-size, or the older --dp-size N --enable-dp-attention, which SGLang reads as
# --attn-dp-size N) splits the tensor-parallel ranks and starts no process of its own.
PARALLEL_FLAGS = {
    "--tp": ("--tp", "--tp-size", "--tensor-parallel-size"),
    "--dp": ("--dp", "--dp-size", "--data-parallel-size"),
    "--pp": ("--pp", "--pp-size", "--pipeline-parallel-size"),
}


def parallel_ranks(args: list[str]) -> tuple[int, str]:
    """The scheduler processes ``args`` start (dp x tp x pp) and the flags that set them, e.g. ``--tp 2 --dp 2``."""
    ranks, given = 1, []
    for size, spellings in PARALLEL_FLAGS.items():
        if size == "--dp" and _has_flag(args, "--enable-dp-attention"):
            continue
        given_as = [(f, v) for f in spellings if (v := _flag_value(args, f)) is not None]
        if not given_as:
            continue
        name, value = given_as[0]
        if not value.isdigit() or int(value) < 1:
            raise LaunchError(f"{name} {value} is not a positive number: pass {name} with a number of ranks")
        ranks *= int(value)
        given.append(f"{name} {value}")
    return ranks, " ".join(given)


@dataclass(frozen=True)
class Nodes:
    """SGLang's multi-node launch as this process sees it: ``--nnodes`` processes, one a node, each starting its
    share of the ranks; node 0 serves HTTP, the others only run their schedulers."""

    count: int = 1  # --nnodes
    rank: int = 0  # --node-rank
    one_host: bool = False  # every node on this machine (--dist-init-addr on the loopback): they share its cores


LOOPBACK_HOSTS = ("localhost", "::1", "[::1]")


def node_layout(args: list[str], ranks: int = 1) -> Nodes:
    """The nodes ``args`` ask for, checked before SGLang starts: ``--node-rank`` below ``--nnodes``, the ranks
    (dp x tp x pp) split evenly over the nodes, and ``--dist-init-addr`` (``--nccl-init-addr``), which every node
    must be given alike, present. A loopback address puts every node on this machine."""
    count_text, rank_text = _flag_value(args, "--nnodes") or "1", _flag_value(args, "--node-rank") or "0"
    if not count_text.isdigit() or int(count_text) < 1:
        raise LaunchError(f"--nnodes {count_text} is not a positive number: pass --nnodes with the number of nodes")
    if not rank_text.isdigit() or int(rank_text) >= int(count_text):
        raise LaunchError(
            f"--node-rank {rank_text} is not one of 0..{int(count_text) - 1}: give each of the --nnodes "
            f"{count_text} processes its own rank"
        )
    count, rank = int(count_text), int(rank_text)
    if count == 1:
        return Nodes()
    address = _flag_value(args, "--dist-init-addr") or _flag_value(args, "--nccl-init-addr")
    if not address:
        raise LaunchError(
            f"--nnodes {count} needs --dist-init-addr HOST:PORT, the same on every node (node 0's address, where the "
            "nodes meet): pass it to each of them"
        )
    if ranks % count:
        raise LaunchError(
            f"--nnodes {count} splits the {ranks} ranks (dp x tp x pp) evenly over the nodes, and {ranks} is not a "
            f"multiple of {count}: change --tp (or --pp) or --nnodes"
        )
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or address.startswith("[") else address
    one_host = host in LOOPBACK_HOSTS or host.startswith("127.")
    return Nodes(count, rank, one_host)


def cpu_threads_bind(ranks: int, cores: list[int] | None = None, flags: str = "--tp", nodes: Nodes = Nodes()) -> str:
    """SGLang's per-rank CPU core lists on CPU (``SGLANG_CPU_OMP_THREADS_BIND``, ranks separated by ``|``): this
    process's cores split into ``ranks`` (dp x tp x pp) contiguous groups. SGLang's CPU engine otherwise asserts one
    rank per NUMA node. Example: cores 0..5, 2 ranks -> ``"0-2|3-5"``; cores 0, 1, 2 ranks -> ``"0|1"``; cores 0, 2,
    4, 6, 2 ranks -> ``"0,2|4,6"``.

    SGLang reads the group of a rank at its index on its node (the local device id), so each node gets the groups
    of its own ranks: with every node on this machine the cores are split over all ranks and node ``r`` takes the
    ``r``-th share (node 1 of 2, cores 0..3, 2 ranks -> ``"2-3"``), else each node splits its own cores."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
    local = ranks // nodes.count
    split = ranks if nodes.one_host else local
    if split > len(cores):
        where = f" on the {nodes.count} nodes of this machine" if nodes.one_host else ""
        raise LaunchError(
            f"{flags} on CPU start {split} ranks{where}, which need at least one core each, but this process may "
            f"use {len(cores)}: lower them, or set {CPU_THREADS_BIND_ENV} yourself"
        )
    groups, start = [], 0
    for rank in range(split):
        size = len(cores) // split + (1 if rank < len(cores) % split else 0)
        group = cores[start : start + size]
        start += size
        groups.append(_core_list(group))
    if nodes.one_host:
        groups = groups[nodes.rank * local : (nodes.rank + 1) * local]
    return "|".join(groups)


def _core_list(cores: list[int]) -> str:
    """Sorted core ids as ranges: [0, 1, 2, 5] -> "0-2,5"."""
    runs: list[list[int]] = []
    for core in cores:
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def sglang_env(cpu: bool) -> tuple[dict[str, str], list[str]]:
    """The environment of an SGLang process started by the plugin, and the shims put on its path."""
    env = dict(os.environ)
    # Served from the caller's working directory (relative paths in admin requests mean what the caller means), but
    # without it on sys.path: a source checkout holds folders named like PyPI packages (kernels, speculators, data).
    env["PYTHONSAFEPATH"] = "1"
    shims: list[str] = []
    if cpu:
        env.update(CPU_ENV)
        for name, value in CPU_ENV_DEFAULTS.items():
            env.setdefault(name, value)
        shims = shims_needed()
        if shims:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SHIMS_DIR), env.get("PYTHONPATH")]))
    return env, shims


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _has_flag(args: list[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in args)


def _switched_on(args: list[str], flag: str) -> bool:
    """A boolean flag given, and not as ``false`` (how :func:`config_file_args` writes a config file's false)."""
    return _has_flag(args, flag) and (_flag_value(args, flag) or "").lower() != "false"


# Paths are made absolute against the caller's working directory, so that the server's arguments (in /server_info,
# the logs) name them in full. Inputs where the path exists (a hub id, a template name stay as given); outputs always.
MODEL_PATH_FLAGS = ("--model-path", "--tokenizer-path", "--speculative-draft-model-path")
INPUT_PATH_FLAGS = MODEL_PATH_FLAGS + (
    "--config",
    "--chat-template",
    "--completion-template",
    "--speculative-token-map",
    "--speculative-kimi-adaptive-config",
    "--speculative-ngram-external-corpus-path",
    "--speculative-dspark-sps-table-path",
    "--quantization-param-path",
    "--decrypted-config-file",
    "--decrypted-draft-config-file",
    "--ssl-keyfile",
    "--ssl-certfile",
    "--ssl-ca-certs",
)
OUTPUT_PATH_FLAGS = (
    "--speculative-kimi-adaptive-profile",
    "--crash-dump-folder",
    "--export-metrics-to-file-dir",
    "--file-storage-path",
    "--debug-tensor-dump-output-folder",
    "--download-dir",
)


def _absolute(flag: str, value: str) -> str | None:
    """``value`` of ``flag`` as an absolute path, or None where it stays as given."""
    path = Path(value).expanduser()
    if flag in OUTPUT_PATH_FLAGS and value and not path.is_absolute():
        return str(path.resolve())
    if flag in INPUT_PATH_FLAGS and path.exists() and str(path.resolve()) != value:
        return str(path.resolve())
    return None


def _absolute_paths(args: list[str]) -> list[str]:
    out: list[str] = []
    for arg in args:  # SGLang merges a config file given as `--config FILE` only, never `--config=FILE`
        out += ["--config", arg.split("=", 1)[1]] if arg.startswith("--config=") else [arg]
    for i, arg in enumerate(out):
        flag, eq, value = arg.partition("=")
        if flag not in INPUT_PATH_FLAGS + OUTPUT_PATH_FLAGS:
            continue
        if eq and (absolute := _absolute(flag, value)):
            out[i] = f"{flag}={absolute}"
        elif not eq and i + 1 < len(out) and (absolute := _absolute(flag, out[i + 1])):
            out[i + 1] = absolute
    return out


def config_file_args(args: list[str]) -> list[str]:
    """The flags of the YAML file given by ``--config`` (SGLang's own config files: a mapping of flag names to values,
    which SGLang puts before the command line's flags, so the command line wins), as command-line flags: what the
    launcher reads to know which flags the user set. Booleans are kept as given (``false`` too: set by the user)."""
    path = _flag_value(args, "--config")
    if path is None:
        return []
    file = Path(path).expanduser()
    if file.suffix.lower() not in (".yaml", ".yml"):
        raise LaunchError(f"--config {path}: SGLang reads config files in YAML (.yaml or .yml): give one")
    if not file.is_file():
        raise LaunchError(f"--config {path} does not exist: give the path of a YAML config file")
    import yaml

    try:
        data = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise LaunchError(f"--config {path} is not readable YAML ({str(exc).splitlines()[0]}): fix the file") from None
    if data is None:
        return []
    if not isinstance(data, dict):
        raise LaunchError(f"--config {path}: SGLang wants a mapping of flag names to values at its top level")
    out: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if isinstance(value, bool):
            out += [flag] if value else [flag, "false"]
        elif isinstance(value, list):
            out += [flag, *(str(v) for v in value)]
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value)]
    return out


ANY_PORT = 0  # launch_command(port=ANY_PORT): a free port, picked again if another process binds it first
PORT_TAKEN = "address already in use"  # uvicorn's bind error in SGLang's log
PORT_PICKS = 4  # tries of ANY_PORT before start-up fails
LEADER_GRACE_S = 1.0  # how long stop() lets SGLang's launcher outlive its workers before killing it


@dataclass
class LaunchSpec:
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    cpu: bool
    shims: list[str] = field(default_factory=list)
    any_port: bool = False  # the port was picked free (ANY_PORT): another one may replace it if it is lost
    nodes: Nodes = field(default_factory=Nodes)  # --nnodes: this process starts one node's ranks

    def with_port(self, port: int) -> None:
        i = self.argv.index("--port")
        self.argv[i + 1] = str(port)
        self.port = port

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        return f"http://{host}:{self.port}"


# KV cache dtypes SGLang serves on CPU with the kimi_cpu backend (any model dtype); SGLang's CPU FP8 KV cache
# (fp8_e4m3) is for MHA models on the intel_amx backend and AMX CPUs, and it refuses fp8_e5m2 on every CPU.
CPU_KV_CACHE_DTYPES = ("auto", "bf16", "bfloat16")


# Flags whose SGLang machinery needs a GPU, and what fails on CPU; each ended SGLang's start-up there.
PINNED_LORA = "SGLang's LoRA layers keep their buffers in pinned host memory, which needs a CUDA or ROCm GPU"
CPU_UNSERVED_FLAGS = {
    "--enable-return-routed-experts": (
        "SGLang keeps the captured expert ids in pinned host memory, which needs a CUDA or ROCm GPU"
    ),
    "--enable-hierarchical-cache": (
        "SGLang's host KV cache registers its buffers with CUDA (cudaHostRegister); the radix cache keeps prefixes "
        "in the CPU KV pool without it"
    ),
    "--enable-deterministic-inference": (
        "SGLang's batch-invariant kernels run on CUDA and XPU devices only (without it a request's sampling_seed "
        "has no effect: SGLang reads it only in deterministic mode)"
    ),
    "--enable-memory-saver": "SGLang releases and restores memory through torch_memory_saver, a CUDA library",
    "--enable-lora": PINNED_LORA,
    "--lora-paths": PINNED_LORA,
    "--enable-single-batch-overlap": "SGLang overlaps the MoE combine on a second CUDA stream",
    "--enable-two-batch-overlap": "SGLang overlaps two micro-batches on CUDA streams",
    "--enable-watermark": "SGLang's watermarking runs on CUDA devices only",
    "--speculative-use-block-verification": (
        "SGLang's block verification is a CUDA and ROCm sampling kernel (on CPU, sampled drafts are verified token by "
        "token with the lossless rule)"
    ),
}


def check_cpu_args(args: list[str]) -> None:
    """Refuse, before SGLang loads weights, CPU settings its scheduler would fail on: a KV cache dtype SGLang cannot
    keep on CPU, a page size the kimi_cpu backend does not serve, :data:`CPU_UNSERVED_FLAGS` (pinned buffers, CUDA
    streams, batch-invariant kernels), prefill graphs (CUDA graph pools), and ``--enable-torch-compile`` where
    SGLang's CPU graph runner cannot run (it captures decoding with the attention backend's CPU-graph methods, which
    only ``intel_amx`` has, and serves no speculative algorithm)."""
    backend = _flag_value(args, "--attention-backend")
    value = _flag_value(args, "--kv-cache-dtype")
    if value is not None and value not in CPU_KV_CACHE_DTYPES and not (value == "fp8_e4m3" and backend == "intel_amx"):
        raise LaunchError(
            f"--kv-cache-dtype {value} is not served on CPU with --attention-backend {backend}: SGLang keeps a CPU KV "
            "cache in FP8 only for MHA models on the intel_amx backend, and Kimi attends with MLA; on CPU use "
            "--kv-cache-dtype auto or bf16 (FP8 and FP4 KV caches run on CUDA and ROCm GPUs)"
        )
    for flag, reason in CPU_UNSERVED_FLAGS.items():
        if _switched_on(args, flag):
            raise LaunchError(f"{flag} is not served on CPU: {reason}; drop the flag on CPU")
    prefill_graphs = _flag_value(args, "--cuda-graph-backend-prefill")
    if prefill_graphs not in (None, "disabled"):
        raise LaunchError(
            f"--cuda-graph-backend-prefill {prefill_graphs} is not served on CPU: SGLang captures prefill graphs in "
            "CUDA graph memory pools, which torch has only on a GPU; pass disabled (the CPU default) or drop the flag"
        )
    if _switched_on(args, "--enable-torch-compile"):
        algorithm = _flag_value(args, "--speculative-algorithm")
        if algorithm:
            raise LaunchError(
                f"--enable-torch-compile with --speculative-algorithm {algorithm} is not served on CPU: SGLang "
                "compiles CPU decoding through its CPU graph runner, which serves no speculative algorithm; drop "
                "--enable-torch-compile"
            )
        if backend != "intel_amx":
            raise LaunchError(
                f"--enable-torch-compile is not served on CPU with --attention-backend {backend}: SGLang compiles CPU "
                "decoding through its CPU graph runner, which only the intel_amx backend (AMX CPUs) supports; drop "
                "--enable-torch-compile"
            )
    page_size = _flag_value(args, "--page-size")
    if backend == KIMI_CPU_BACKEND and page_size is not None and page_size != "1":
        raise LaunchError(
            f"--page-size {page_size}: the {KIMI_CPU_BACKEND} attention backend keeps one token per KV page; "
            "drop --page-size (or pass --page-size 1) on CPU"
        )


def launch_command(sglang_args: list[str], *, cpu: bool | None = None, port: int | None = None) -> LaunchSpec:
    """The argv and environment that start ``sglang.launch_server`` with ``sglang_args``.

    Defaults: ``--model-path`` is the embedded tiny Kimi model (with ``--speculative-algorithm DFLASH`` or
    ``EAGLE3``, ``--speculative-draft-model-path`` its embedded drafter), ``--host`` 127.0.0.1, ``--port`` 30000
    (or ``port``; :data:`ANY_PORT`: a free one, which :class:`ServerProcess` replaces if another process binds it
    between the pick and SGLang's bind, as servers started side by side and their clients' sockets can); on a
    CPU-only machine (``cpu`` None: detected) the :data:`CPU_DEFAULTS` the user did not give, the CPU environment
    and the needed shims.
    """
    args = _absolute_paths(list(sglang_args))
    config = config_file_args(args)  # flags set in a --config file count as given; the command line wins
    for flag in INPUT_PATH_FLAGS + OUTPUT_PATH_FLAGS:  # a config file's relative paths, absolute on the command line
        value = _flag_value(config, flag)
        if value and not _has_flag(args, flag) and (absolute := _absolute(flag, value)):
            args += [flag, absolute]
    if not _has_flag(args + config, "--model-path"):
        args = ["--model-path", str(TINY_MODEL)] + args
        drafter = EMBEDDED_DRAFTERS.get((_flag_value(args + config, "--speculative-algorithm") or "").upper())
        if drafter is not None and not _has_flag(args + config, "--speculative-draft-model-path"):
            args += ["--speculative-draft-model-path", str(drafter)]  # the embedded model's own drafter
    model_path = _flag_value(args + config, "--model-path")
    check_model_path(model_path, _flag_value(args + config, "--revision"))
    draft_path = _flag_value(args + config, "--speculative-draft-model-path")
    if draft_path and HUB_ID.match(draft_path) and not Path(draft_path).expanduser().exists():
        draft_revision = _flag_value(args + config, "--speculative-draft-model-revision")
        check_model_path(draft_path, draft_revision, flag="--speculative-draft-model-path")
    disaggregation = _flag_value(args + config, "--disaggregation-mode") or "null"
    if lacks_image_processor(model_path) and not _has_flag(args + config, "--language-model-only"):
        if disaggregation != "null":
            raise LaunchError(
                f"{model_path} is a multimodal checkpoint without an image processor: SGLang starts it only with "
                f"--language-model-only, which it refuses with --disaggregation-mode {disaggregation}; serve a "
                "text-only checkpoint of it (its text_config as config.json, the language_model.* weights without "
                "that prefix) or one with its image processor"
            )
        args += ["--language-model-only"]  # SGLang cannot start it multimodal: it has no image processor
    host = _flag_value(args + config, "--host") or DEFAULT_HOST
    if not _has_flag(args + config, "--host"):
        args += ["--host", host]
    ranks, flags = parallel_ranks(args + config)
    nodes = node_layout(args + config, ranks)
    given_port = _flag_value(args + config, "--port")
    any_port = not given_port and port == ANY_PORT
    if any_port:
        port = free_port(host)  # bound and released just now: SGLang's own bind may still lose it (ServerProcess)
    else:  # every node binds it: node 0 serves there, the others answer /health only
        port = port_number(given_port) if given_port else (port or DEFAULT_PORT)
        check_port_free(host, port)
    if not given_port:
        args += ["--port", str(port)]

    device = (_flag_value(args + config, "--device") or "").lower()
    if cpu is None:
        gpu = has_gpu()
        if device == "cuda" and not gpu:
            raise LaunchError(
                "--device cuda, but torch sees no GPU here (torch.cuda.is_available() is False): check the driver and "
                "CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES, or drop --device to serve on this CPU"
            )
        cpu = device == "cpu" or not gpu  # --device cpu on a GPU machine serves on the CPU, with the CPU settings
    if cpu:
        for flag, value in CPU_DEFAULTS.items():
            if flag in DISAGGREGATION_REFUSES and disaggregation != "null":
                continue  # SGLang refuses it on a prefill or decode server
            if not _has_flag(args + config, flag):
                args += [flag] if value is None else [flag, value]
        check_cpu_args(args + config)
    env, shims = sglang_env(cpu)
    if cpu and DYNAMO_DISABLE_ENV not in env and not _switched_on(args + config, "--enable-torch-compile"):
        env[DYNAMO_DISABLE_ENV] = "1"
    hub = [v for f in MODEL_PATH_FLAGS if (v := _flag_value(args + config, f)) and not Path(v).expanduser().exists()]
    if cpu and hub and "HF_HUB_OFFLINE" not in os.environ:
        del env["HF_HUB_OFFLINE"]  # a hub id given here is downloaded
    from sglang_kimi.models.kv_scales import ENV as KV_SCALES_ENV

    scales = env.get(KV_SCALES_ENV, "")  # a scales file named relative to the caller's working directory
    if scales not in ("", "dynamic", "observe", "off") and Path(scales).expanduser().is_file():
        env[KV_SCALES_ENV] = str(Path(scales).expanduser().resolve())
    if cpu and ranks > 1 and CPU_THREADS_BIND_ENV not in env:
        env[CPU_THREADS_BIND_ENV] = cpu_threads_bind(ranks, flags=flags, nodes=nodes)
    argv = [sys.executable, "-m", "sglang.launch_server", *args]
    return LaunchSpec(argv=argv, env=env, host=host, port=port, cpu=cpu, shims=shims, any_port=any_port, nodes=nodes)


class ServerProcess:
    """A running SGLang server in its own process group; a context manager that always stops it."""

    def __init__(self, spec: LaunchSpec, log_path: Path | None = None):
        self.spec = spec
        self.log_path = log_path
        self._log = open(log_path, "wb") if log_path else None
        self._picks = 1
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            self.spec.argv,
            env=self.spec.env,
            stdout=self._log,
            stderr=subprocess.STDOUT if self._log else None,
            start_new_session=True,
        )
        self._log_start = self._log.tell() if self._log else 0

    def _lost_port(self) -> bool:
        """SGLang's HTTP server could not bind its port (this launch's part of the log says so)."""
        if not self.log_path or not self.log_path.exists():
            return False
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            text = f.read().decode(errors="replace")
        return PORT_TAKEN in text and f":{self.spec.port}" in text.replace("', ", ":")

    def _pick_another_port(self) -> bool:
        """A port picked free but lost to another process before SGLang bound it: start again on a new one."""
        if not self.spec.any_port or self._picks >= PORT_PICKS or not self._lost_port():
            return False
        self.stop(close_log=False)
        lost = self.spec.port
        self.spec.with_port(free_port(self.spec.host))
        self._picks += 1
        if self._log:
            self._log.write(
                f"[sglang-kimi] port {lost} was taken by another process; starting again on {self.spec.port}\n".encode()
            )
            self._log.flush()
        self._start()
        return True

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session: the leader's pid is the group id

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join([line for line in text if "Ignore import error" not in line][-lines:])

    def answers_health(self) -> bool:
        """Whether ``/health`` at the server's port answers 200 now (whoever holds the port: see ``wait_ready``)."""
        try:
            return requests.get(self.base_url + "/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self._pick_another_port():
                    continue
                raise LaunchError(
                    f"SGLang exited with code {self.proc.returncode} during start-up"
                    + (f"; its log ({self.log_path}) ends with:\n{self.log_tail()}" if self.log_path else "")
                )
            if self.answers_health() and not self._lost_port():
                return
            # (healthy with the port lost: whoever holds the port answered; this server exits, and is restarted)
            time.sleep(0.5)
        self.stop()
        raise LaunchError(f"SGLang did not become ready within {timeout:.0f} s (log: {self.log_path})")

    def stop(self, timeout: float = 20.0, close_log: bool = True) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left of it.

        Once SGLang's workers (the group's other processes) are gone, its launcher process only sleeps before its
        crash diagnostics (5 s, for a GPU to settle), which find nothing to report: it is killed after
        ``LEADER_GRACE_S`` instead. Its multiprocessing resource tracker is not a worker: it lives as long as the
        launcher. A leader that had no worker in its group (``sglang-kimi serve``, which runs SGLang in a group of
        its own and stops it on SIGTERM) is left to exit by itself."""
        workers = {pid for pid in group_members(self.pgid) - {self.proc.pid} if not _is_resource_tracker(pid)}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + timeout
            workers_gone_at = None
            while time.monotonic() < deadline and (members := group_members(self.pgid)):
                if workers and not members & workers:
                    workers_gone_at = workers_gone_at or time.monotonic()
                    if time.monotonic() - workers_gone_at > LEADER_GRACE_S:
                        break
                try:
                    self.proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
            if not group_alive(self.pgid):
                break
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if self._log and close_log:
            self._log.close()
            self._log = None

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def group_members(pgid: int) -> set[int]:
    """The live (non-zombie) processes of process group ``pgid``."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            found.add(int(stat.parent.name))
    return found


def _is_resource_tracker(pid: int) -> bool:
    """Whether ``pid`` is a multiprocessing resource tracker (started by, and exiting with, the process using it)."""
    try:
        return b"multiprocessing.resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is left in process group ``pgid``."""
    return bool(group_members(pgid))


def start_server(
    sglang_args: list[str],
    *,
    cpu: bool | None = None,
    port: int | None = None,
    log_path: Path | None = None,
    timeout: float = 300.0,
) -> ServerProcess:
    """Launch SGLang with ``sglang_args`` and wait until it answers ``/health``."""
    spec = launch_command(sglang_args, cpu=cpu, port=port)
    server = ServerProcess(spec, log_path)
    try:
        server.wait_ready(timeout)
    except BaseException:
        server.stop()
        raise
    return server


def fetch_plugin_state(base_url: str) -> dict:
    """The plugin's state reported by the server's schedulers (``/server_info``), merged over data-parallel ranks;
    behind ``sglang-router``, over every worker's ranks (``router.server_info``). ``ServerQueryError`` when the URL
    is not such a server."""
    from sglang_kimi.launcher.dp_reports import merged_report
    from sglang_kimi.launcher.router import server_info

    return merged_report(server_info(base_url))
