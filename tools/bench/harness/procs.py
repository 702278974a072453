"""CPU and page faults of processes, read from ``/proc``: what a benchmark charges to each
stage (this process, its workers, the L2 servers)."""
from __future__ import annotations

import os

__all__ = ["children_of", "proc_stat", "tree_cpu_seconds"]

_TICK = os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> tuple[float, int]:
    """(CPU seconds, minor faults) of process ``pid`` ((0, 0) when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0
    return (int(fields[11]) + int(fields[12])) / _TICK, int(fields[7])


def children_of(pid: int) -> list[int]:
    """The direct children of ``pid`` (by the parent pid in ``/proc/N/stat``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds so far of ``pid`` (default: this process) and its direct children (a
    loader's worker processes)."""
    pid = os.getpid() if pid is None else pid
    return sum(proc_stat(p)[0] for p in [pid, *children_of(pid)])
