"""Each CPU rank on its own cores, on every CPU SGLang serves.

SGLang gives each CPU rank (dp x tp x pp of them) a group of cores: ``SGLANG_CPU_OMP_THREADS_BIND``, which
``sglang-kimi serve`` sets to one contiguous group per rank, or one NUMA node per rank when it is unset. It binds a
rank to its group in ``bootstrap._init_cpu_threads_env`` through ``sgl_kernel.init_cpu_threads_env``, but only on
CPUs with Intel AMX or on arm64; on any other CPU it logs that the binding is disabled and each rank's torch runs one
thread per core of the whole machine. Two ranks on two cores then run four busy threads, whose OpenMP workers spin
against each other's: on a two-core machine a DFLASH tree server at ``--dp-size 2`` decoded 50 tokens/s with a
request on each rank, against 105 tokens/s with one request on one rank.

The AFTER hook binds the rank there, with the operating system and torch: every thread of the scheduler process is
restricted to the rank's cores (``os.sched_setaffinity``; threads started later inherit it) and torch's intra-op
pool gets one thread per core of the group. Where SGLang binds by itself (AMX, arm64), and for a server of one rank,
nothing is done.
"""

from __future__ import annotations

import logging
import os

from sglang_kimi.hooks import hook

logger = logging.getLogger("sglang_kimi")


def parse_core_list(cores: str) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]`` (the form of ``SGLANG_CPU_OMP_THREADS_BIND``'s groups)."""
    found: set[int] = set()
    for part in str(cores).split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    if not found:
        raise ValueError(f"no core in {cores!r}")
    return sorted(found)


def bind_process_to_cores(cores: list[int]) -> None:
    """Restrict every thread of this process to ``cores`` and size torch's intra-op pool to them."""
    import torch

    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cores)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass
    torch.set_num_threads(len(cores))


def _sglang_binds_itself() -> bool:
    from sglang.srt.distributed import bootstrap

    return bool(getattr(bootstrap, "_is_cpu_amx_available", False) or getattr(bootstrap, "_is_cpu_arm64", False))


def _ranks() -> int:
    """The CPU ranks SGLang starts for this server, as it counts them for the binding (dp x tp x pp)."""
    from sglang.srt.distributed import bootstrap

    parallel = bootstrap.get_parallel()
    return parallel.dp_size * parallel.tp_size * parallel.pp_size


def bind_rank_threads(result, *args, local_omp_cpuid=None, **kwargs):
    """AFTER ``bootstrap._init_cpu_threads_env(*, local_omp_cpuid, dist_init_method)``. A lone rank keeps the
    threads SGLang gives it: it shares the cores with no other rank."""
    if local_omp_cpuid is None or _sglang_binds_itself() or _ranks() == 1:
        return None
    cores = parse_core_list(local_omp_cpuid)
    usable = set(os.sched_getaffinity(0))
    if not set(cores) <= usable:
        logger.warning(
            "sglang-kimi: this rank's cores %s are not all usable by the process (%s); its threads are left unbound",
            cores,
            sorted(usable),
        )
        return None
    bind_process_to_cores(cores)
    logger.info("sglang-kimi: this CPU rank's threads run on cores %s (%d torch threads)", cores, len(cores))
    return None


def install_rank_thread_binding(target: str):
    hook(target, bind_rank_threads, "AFTER")
