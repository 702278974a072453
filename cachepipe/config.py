"""Validated configuration of a :class:`~cachepipe.TwoLevelCache` (all that gets pickled)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from cachepipe.embedded import parse_memory
from cachepipe.embedded_group import default_l2_servers
from cachepipe.l2_registry import store_kind
from cachepipe.netfs import check_cache_dir
from cachepipe.redis_url import canonical, redact_all
from cachepipe.source import DEFAULT_MAX_FILE_BYTES

__all__ = ["CacheConfig", "normalize_redis"]


def normalize_redis(redis) -> tuple[str, ...] | None | bool:
    """``None`` (embedded), ``False`` (no L2) or a tuple of URLs.

    Raises:
        ValueError: an unknown URL scheme, mixed kinds, an empty list or a wrong type.
    """
    if redis is None or redis is False:
        return redis
    if isinstance(redis, str):
        redis = [redis]
    if not isinstance(redis, (list, tuple)) or not all(isinstance(u, str) for u in redis):
        raise ValueError(f"redis must be None (embedded), False (no L2), a URL or a list of URLs; "
                         f"got a {type(redis).__name__}")
    store_kind(redis)  # validates schemes
    for url in redis:
        canonical(url)  # validates port and db
    return tuple(redis)


@dataclass(frozen=True)
class CacheConfig:
    """Everything needed to reopen a cache in another process.

    Attributes:
        source: absolute ImageFolder root.
        cache_dir: absolute cache directory (manifests, L1, embedded Redis).
        redis: ``None`` = embedded server, ``False`` = no L2, or a tuple of URLs.
        cache_size: shorter side of cached samples in pixels.
        prefix: first part of every L2 key.
        replicas: copies of each L2 value (plain shards only).
        l2_memory: embedded server's maxmemory in bytes (``None`` = keep / 25 % of RAM);
            with several servers, their total.
        l2_servers: embedded ``redis-server`` processes, reads spread over them by key
            (NOTE [a node's L2] in ``cachepipe.embedded_group``); ``None``: one per 8 cores.
        timeout: Redis socket timeout in seconds.
        use_l1: keep the L1 mirror (``False``: L2 + source only).
        l1_map_size: LMDB map size in bytes (``None`` = from the manifest).
        follow_external_links: the scan follows links leaving the source root (NOTE
            [symlinks in the source]).
        max_file_bytes: the largest source file read for one sample; a larger one is a
            bad sample (NOTE [bounded reads] in ``cachepipe/source.py``).
    """

    source: str
    cache_dir: str
    redis: tuple[str, ...] | None | bool = None
    cache_size: int = 256
    prefix: str = "cachepipe"
    replicas: int = 1
    l2_memory: int | None = None
    timeout: float = 1.0
    use_l1: bool = True
    l1_map_size: int | None = None
    follow_external_links: bool = False
    l2_servers: int | None = None
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if k != "redis")
        return f"CacheConfig(redis={redact_all(self.redis)!r}, {fields})"

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", os.path.abspath(os.fspath(self.source)))
        object.__setattr__(self, "cache_dir", os.path.abspath(os.fspath(self.cache_dir)))
        object.__setattr__(self, "redis", normalize_redis(self.redis))
        if self.l2_memory is not None:
            object.__setattr__(self, "l2_memory", parse_memory(self.l2_memory))
        if self.l2_servers is None:
            object.__setattr__(self, "l2_servers", default_l2_servers())
        if not isinstance(self.l2_servers, int) or self.l2_servers < 1:
            raise ValueError(f"l2_servers (--l2-servers) must be a positive int, got {self.l2_servers!r}")
        if not isinstance(self.cache_size, int) or self.cache_size < 1:
            raise ValueError(f"cache_size must be a positive int, got {self.cache_size!r}")
        if not self.prefix or ":" in self.prefix:
            raise ValueError(f"prefix must be non-empty without ':', got {self.prefix!r}")
        n = 1 if self.redis in (None, False) else len(self.redis)
        kind = None if self.redis in (None, False) else store_kind(self.redis)
        if kind == "redis-cluster" and self.replicas != 1:
            raise ValueError("replicas applies to plain shards; a Redis Cluster replicates by itself")
        if not 1 <= self.replicas <= n:
            raise ValueError(f"replicas must be in 1..{n} (the number of shards), got {self.replicas}")
        if not isinstance(self.timeout, (int, float)) or not math.isfinite(self.timeout) or self.timeout <= 0:
            raise ValueError(f"timeout (--timeout) must be a finite number of seconds > 0, got {self.timeout!r}")
        if not isinstance(self.max_file_bytes, int) or self.max_file_bytes < 1:
            raise ValueError(f"max_file_bytes (--max-file-size) must be a positive number of bytes, "
                             f"got {self.max_file_bytes!r}")
        if self.l1_map_size is not None and self.l1_map_size < 1 << 16:
            raise ValueError(f"l1_map_size must be >= 64 KiB, got {self.l1_map_size}")
        check_cache_dir(self.cache_dir)  # NOTE [cache dir on a network file system]
