"""A process's memory as Linux counts it: RSS, PSS, USS and anonymous, from ``/proc/PID/smaps_rollup``.

RSS counts every resident page the process maps, PSS divides each shared page among the
processes that map it, and USS counts only the pages no other process maps (private
clean + private dirty). A memory-mapped manifest's pages are in the RSS of every process
that touched them, but in no one's USS while another process maps them too. File pages
only one process touched (the LMDB pages a warm-up worker wrote) are in its USS although
the kernel may drop them at any time; ``anon`` (anonymous memory: heap, stacks, private
copies) is what no file backs, the memory the process really costs.
"""
from __future__ import annotations

import os

__all__ = ["memory"]

_FIELDS = {"Rss:": "rss", "Pss:": "pss", "Private_Clean:": "uss", "Private_Dirty:": "uss", "Anonymous:": "anon"}


def memory(pid: int | None = None) -> dict[str, int]:
    """``{"rss", "pss", "uss", "anon"}`` of ``pid`` (default: this process) in bytes.

    Raises:
        OSError: no such process (or no ``smaps_rollup``: Linux before 4.14).
    """
    out = {"rss": 0, "pss": 0, "uss": 0, "anon": 0}
    with open(f"/proc/{pid or os.getpid()}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] in _FIELDS:
                out[_FIELDS[parts[0]]] += int(parts[1]) * 1024
    return out
