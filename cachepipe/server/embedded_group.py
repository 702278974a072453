"""A node's embedded L2 as several ``redis-server`` processes, reads spread over them by key.

NOTE [a node's L2]: one ``redis-server`` executes every command on one thread, so one
server serves at most what one core can copy out: 0.32-0.35 s of its main thread per GB
on the 2-core benchmark VM (``cachepipe bench l2``; ``docs/benchmarks/history/l2.md``, "A node's
L2"), ~3 GB/s. A node of 8 GPUs at ~3,000 images/s each reads ~6 GB/s of 256 px samples:
several cores' worth. io-threads did not lower the main thread's CPU per GB there (Redis
6.2 used them only when many clients wait at once, and the main thread still executes
every MGET and copies every value into its reply buffers). Several servers do scale: each holds the samples
whose rendezvous hash names it and serves only their reads, exactly as the sharded store
spreads keys over the shards of several nodes. So the embedded default starts
``l2_servers`` servers in the cache dir (``redis/``, ``redis-1/``, ...), each with its share
of ``l2_memory``; ``default_l2_servers`` sizes it from the cores (one server per
``CORES_PER_SERVER``, the rule in ``docs/cache.md``). Every command of a node must use the
same count (the default is the same on one machine): another count moves keys to other
servers, which then read from L1 (the same pixels, slower) until refilled.

NOTE [a group's memory]: ``l2_memory`` is the node's total, split evenly. Without it a
running server keeps its ``maxmemory`` (as one server does: training and every loader
worker start the group, and none of them may resize it), a new one takes the last size
given for its directory, else its share of the default 25 % of RAM. A group is at most
``max_l2_servers()``: ``MAX_SERVERS``, or one per core where there are more cores (a
server is one core's worth of work; ``--l2-servers 100`` on 2 cores only starts daemons).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from cachepipe.server.embedded import EmbeddedRedis, parse_memory

__all__ = ["CORES_PER_SERVER", "MAX_SERVERS", "SERVER_CORE_SHARE", "SERVER_S_PER_GB", "EmbeddedGroup",
           "default_l2_servers", "max_l2_servers", "servers_for"]

CORES_PER_SERVER = 8  # a GPU node has ~8-16 cores per GPU pair; one server per 8 keeps up (docs/cache.md)
MAX_SERVERS = 8
SERVER_S_PER_GB = 0.33  # c: a server's main thread per GB served (bench l2: 0.32-0.35 s, docs/benchmarks/l2.md)
SERVER_CORE_SHARE = 0.5  # u: the share of a core one server may take, room for bursts (docs/cache.md)


def servers_for(bytes_per_s: float, *, s_per_gb: float = SERVER_S_PER_GB,
                core_share: float = SERVER_CORE_SHARE) -> int:
    """Servers a node needs to serve ``bytes_per_s`` of samples: ``ceil(bytes/s x c / u)``
    (NOTE [a node's L2]; docs/cache.md), at least one.

    Example:
        >>> servers_for(8 * 3000 * 250e3)  # 8 GPUs x 3,000 images/s x 250 KB
        4
    """
    return max(1, math.ceil(bytes_per_s / 1e9 * s_per_gb / core_share))


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_l2_servers(cores: int | None = None) -> int:
    """Embedded servers for a node of ``cores`` CPU cores (default: this machine's usable ones)."""
    return max(1, min(MAX_SERVERS, (_cores() if cores is None else cores) // CORES_PER_SERVER))


def max_l2_servers(cores: int | None = None) -> int:
    """The most embedded servers a node of ``cores`` cores may run (NOTE [a group's memory])."""
    return max(MAX_SERVERS, _cores() if cores is None else cores)


class EmbeddedGroup:
    """The embedded servers ``0 .. servers - 1`` of a cache dir (NOTE above).

    Args:
        cache_dir: the cache directory.
        servers: how many (>= 1).
        idle: seconds without a client after which a server started here stops by itself
            (NOTE [idle embedded server]); ``None``: the default; 0: never.
    """

    def __init__(self, cache_dir: str | os.PathLike, servers: int = 1, *, idle: float | None = None) -> None:
        if servers < 1:
            raise ValueError(f"l2_servers (--l2-servers) must be >= 1, got {servers}")
        self.cache_dir = Path(cache_dir)
        share = 1 / servers  # of the default memory, for a new server (NOTE [a group's memory])
        self.servers = [EmbeddedRedis(cache_dir, index=i, default_share=share, idle=idle) for i in range(servers)]

    @classmethod
    def found(cls, cache_dir: str | os.PathLike) -> EmbeddedGroup:
        """Every server directory present in ``cache_dir`` (at least server 0)."""
        n = 1
        while (Path(cache_dir).absolute() / f"redis-{n}").is_dir():
            n += 1
        return cls(cache_dir, n)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self, l2_memory: int | str | None = None) -> bool:
        """Start the servers not running; ``l2_memory`` is the node's total, split evenly;
        unset keeps a running server's (NOTE [a group's memory]). Returns whether any was started."""
        share = None if l2_memory is None else max(1, parse_memory(l2_memory) // len(self.servers))
        started = [s.start(share) for s in self.servers]
        return any(started)

    def stop(self) -> bool:
        """Stop them all; whether any was running."""
        return any([s.stop() for s in self.servers])
