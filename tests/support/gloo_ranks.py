"""Tensor-parallel ranks on CPU for unit tests: ``run_ranks(fn, world_size, *args)`` runs ``fn(rank, group, *args)``
in ``world_size`` spawned processes joined by a gloo process group and returns their results in rank order.
``group`` stands in for SGLang's ``GroupCoordinator`` as far as the plugin uses it (``world_size``,
``rank_in_group``, ``all_gather_into_tensor``). ``fn`` must be importable (a module-level function)."""

from __future__ import annotations

import multiprocessing
import pickle
import socket


class GlooGroup:
    def __init__(self, rank: int, world_size: int):
        self.rank_in_group, self.world_size = rank, world_size

    def all_gather_into_tensor(self, out, inp):
        import torch.distributed as dist

        dist.all_gather_into_tensor(out, inp)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn, rank: int, world_size: int, port: int, args: tuple, results) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:  # pickled by value here: torch's queue would pass tensors by shared memory, gone with this process
        results.put((rank, pickle.dumps(fn(rank, GlooGroup(rank, world_size), *args))))
    except BaseException as e:  # reported to the parent, which fails the test with it
        results.put((rank, pickle.dumps(RuntimeError(f"{type(e).__name__}: {e}"))))
        raise
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world_size: int, *args, timeout: float = 300.0) -> list:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    procs = [
        context.Process(target=_rank_main, args=(fn, r, world_size, port, args, results)) for r in range(world_size)
    ]
    for proc in procs:
        proc.start()
    try:
        got = {rank: pickle.loads(value) for rank, value in (results.get(timeout=timeout) for _ in procs)}
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    for rank, value in got.items():
        if isinstance(value, BaseException):
            raise RuntimeError(f"rank {rank} failed: {value}")
    return [got[r] for r in range(world_size)]
