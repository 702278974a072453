"""The registry of L2 stores: which implementation serves a list of Redis URLs.

The implementations import the protocol module (``cachepipe/l2_store.py``), and this one
imports them, so there is no import cycle between them.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from cachepipe.l2_cluster import ClusterStore
from cachepipe.l2_shards import ShardedRedisStore
from cachepipe.l2_store import SampleStore
from cachepipe.redis_url import redact

__all__ = ["STORES", "open_store", "store_kind"]


# URL scheme -> factory. NOTE [Redis Cluster URLs]: a cluster is named by the scheme
# ``redis-cluster://host:port`` (one or more seed nodes); plain ``redis://``,
# ``rediss://`` and ``unix://`` URLs are independent shards placed by rendezvous hashing.
STORES = {"redis": ShardedRedisStore, "rediss": ShardedRedisStore, "unix": ShardedRedisStore,
          "redis-cluster": ClusterStore}


def store_kind(urls: Sequence[str]) -> str:
    """``"redis"`` or ``"redis-cluster"`` for a list of URLs.

    Raises:
        ValueError: empty list, unknown scheme (lists the valid ones) or mixed kinds.
    """
    if not urls:
        raise ValueError("need at least one Redis URL")
    schemes = set()
    for url in urls:
        scheme = url.split("://", 1)[0] if "://" in url else ""
        if scheme not in STORES:
            raise ValueError(f"unknown Redis URL scheme in {redact(url)!r}; valid schemes: "
                             + ", ".join(f"{s}://" for s in STORES))
        schemes.add("redis-cluster" if scheme == "redis-cluster" else "redis")
    if len(schemes) > 1:
        raise ValueError(f"cannot mix redis-cluster:// and plain shard URLs: {[redact(u) for u in urls]}")
    return schemes.pop()


def open_store(urls: Sequence[str], namespace: str, counters: Counter, *, replicas: int = 1,
               timeout: float = 1.0) -> SampleStore:
    """Build the store for ``urls`` (see ``STORES``).

    Args:
        urls: shard URLs, or redis-cluster:// seed URLs.
        namespace: key prefix ending in ``:``.
        counters: where failures and fallbacks are counted.
        replicas: copies of each value (sharded store only; a cluster replicates itself).
        timeout: socket connect/read timeout in seconds.

    Raises:
        ValueError: see :func:`store_kind`; ``replicas`` out of range.
    """
    kind = store_kind(urls)
    factory = STORES[urls[0].split("://", 1)[0]]
    if kind == "redis-cluster" and replicas != 1:
        raise ValueError("replicas applies to plain shards; a Redis Cluster replicates by itself")
    return factory(list(urls), namespace=namespace, counters=counters, replicas=replicas, timeout=timeout)
