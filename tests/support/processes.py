"""Processes seen through /proc, for the tests that check what a launcher started and left behind."""

from __future__ import annotations

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
