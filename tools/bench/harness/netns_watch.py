"""Delete an emulated cluster's network namespaces once the process that made them is gone.

NOTE [namespaces end with their owner]: an :class:`~tools.bench.harness.cluster.EmulatedCluster`
deletes its namespaces on exit, on exceptions and on SIGINT/SIGTERM, but a benchmark killed
with SIGKILL runs no clean-up, and its namespaces stayed (``ip netns list``) for good. Two
things remove them now, both only ever touching names that prove whose they are: every
namespace is named ``cp-<pid>-<start>-<tag>-...`` after the process that made it (its pid
and start time in clock ticks since boot, which together name one process at any moment).
(1) The cluster starts this watcher, detached, with its owner and its names: it polls the
owner twice a second and, once that process is gone, deletes whichever of the names still
exist; it exits as soon as none exists (the owner's own ``close``). (2) A new cluster
first deletes every ``cp-<pid>-<start>-`` namespace whose process is gone (``stale``),
which covers a watcher killed with its owner. Processes still inside a deleted namespace
keep it alive until they end; the ranks and servers of a job end with it (NOTE [ranks end
with their launcher], NOTE [owned redis-server]). Standard library only (``python -I -S``).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

__all__ = ["NETNS_DIR", "OWNED", "owner_alive", "stale", "start_time"]

NETNS_DIR = "/run/netns"
OWNED = re.compile(r"cp-(\d+)-(\d+)-[0-9a-z]+-(?:sw|n\d+)")


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot; None when it is gone (or a zombie).
    (comm.shm_names.start_time's twin: this watcher runs ``python -I -S`` and must not import
    the comm package, which imports torch.)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return None if fields[0] == b"Z" else int(fields[19])


def owner_alive(name: str) -> bool:
    """Whether the process named in the owned namespace ``name`` still runs (True for other names)."""
    m = OWNED.fullmatch(name)
    return m is None or start_time(int(m.group(1))) == int(m.group(2))


def stale() -> list[str]:
    """Namespaces named by a cluster whose process is gone (NOTE above)."""
    try:
        names = os.listdir(NETNS_DIR)
    except OSError:
        return []
    return sorted(n for n in names if OWNED.fullmatch(n) and not owner_alive(n))


def _existing(names: list[str]) -> list[str]:
    return [n for n in names if os.path.exists(os.path.join(NETNS_DIR, n))]


def main(argv: list[str]) -> int:
    """``PID START NAME...``: wait for process PID (started at START) to end, then delete NAME..."""
    pid, started, names = int(argv[0]), int(argv[1]), argv[2:]
    if os.fork():  # detached: the cluster does not wait for it, nor reap it
        os._exit(0)
    os.setsid()
    os.chdir("/")
    while _existing(names):
        if start_time(pid) != started:
            for name in _existing(names):
                subprocess.run(["ip", "netns", "del", name], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=False)
            return 0
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
