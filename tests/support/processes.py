"""Processes seen through /proc, for the tests that check what a launcher started and left behind."""

from __future__ import annotations

import os
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def tagged(name: str, value: str) -> set[int]:
    """The live (non-zombie) pids whose environment has ``name=value``: what one launch started, told apart from
    the processes of tests running beside it."""
    entry = f"{name}={value}".encode()
    found = set()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            variables = environ.read_bytes().split(b"\0")
            state = (environ.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if entry in variables and state != "Z":
            found.add(int(environ.parent.name))
    return found


def titled(pids, prefix: bytes) -> list[int]:
    """Those of ``pids`` whose command line starts with ``prefix`` (SGLang titles its processes, e.g.
    ``sglang::scheduler``)."""
    return [pid for pid in pids if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(prefix)]


def cpu_seconds(pid: int) -> float:
    """CPU time ``pid`` has used so far (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_core_share(pids, wait_s: float = 3.0) -> dict[int, float]:
    """pid -> the share of one core each of ``pids`` used over the next ``wait_s`` seconds (user + system time of all
    its threads). Read over a window, not as ``ps``'s %CPU, which averages over the process's life and so counts a
    server's start-up long after it ended."""
    pids = list(pids)
    before = {pid: cpu_seconds(pid) for pid in pids}
    time.sleep(wait_s)
    return {pid: (cpu_seconds(pid) - before[pid]) / wait_s for pid in pids}


IDLE_CORE_SHARE = 0.2  # a process that polls instead of waiting takes most of a core, even beside busy ones


def busy_while_idle(server, settle_s: float = 1.0, wait_s: float = 3.0) -> dict[str, float]:
    """The processes of ``server`` (a ``launcher.server.ServerProcess`` with no request in flight) that use more than
    :data:`IDLE_CORE_SHARE` of a core over ``wait_s`` seconds, ``settle_s`` after its last answer: name and pid ->
    share. Empty when every process waits (SGLang's scheduler with ``--sleep-on-idle``, which the launcher adds on
    CPU, blocks on its sockets; without it the scheduler polls them in a loop)."""
    from sglang_kimi.launcher.server import group_members

    time.sleep(settle_s)
    shares = idle_core_share(group_members(server.pgid), wait_s)
    names = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace") for pid in shares}
    return {f"{names[pid]} ({pid})": share for pid, share in shares.items() if share > IDLE_CORE_SHARE}
