"""Processes seen through /proc, for the tests that check what a launcher started and left behind."""

from __future__ import annotations

import os
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
