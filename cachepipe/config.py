"""Validated configuration of a :class:`~cachepipe.TwoLevelCache` (all that gets pickled)."""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from cachepipe.l2.registry import check_replicas
from cachepipe.l2.spec import L2Spec, l2_setting, resolve_l2
from cachepipe.netfs import check_cache_dir
from cachepipe.source.reader import DEFAULT_MAX_FILE_BYTES
from cachepipe.source.timed import DEFAULT_SOURCE_TIMEOUT_S

__all__ = ["CacheConfig"]


@dataclass(frozen=True)
class CacheConfig:
    """Everything needed to reopen a cache in another process.

    Attributes:
        source: absolute ImageFolder root.
        cache_dir: absolute cache directory (manifests, L1, embedded Redis).
        l2: where L2 lives, an :class:`~cachepipe.l2.spec.L2Spec`; given as ``None``
            (embedded servers), ``False`` (no L2), a URL or a list of URLs, it is resolved
            once here (NOTE [L2 resolved once]).
        cache_size: shorter side of cached samples in pixels.
        prefix: first part of every L2 key.
        replicas: copies of each L2 value (plain shards only).
        timeout: Redis socket timeout in seconds.
        use_l1: keep the L1 mirror (``False``: L2 + source only).
        l1_map_size: LMDB map size in bytes (``None`` = from the manifest).
        follow_external_links: the scan follows links leaving the source root (NOTE
            [symlinks in the source]).
        max_file_bytes: the largest source file read for one sample; a larger one is a
            bad sample (NOTE [bounded reads] in ``cachepipe/source/reader.py``).
        share_manifest: publish a new scan in the L2 store and take another node's from
            it (NOTE [manifest through the store] in ``cachepipe/shared_manifest.py``): one
            scan per job instead of one per node. A shared L2 (Redis URLs or a cluster)
            only; off by default (its value takes L2 memory: ~60 MB for ImageNet).
        source_timeout: seconds one source read may take before it is tried again (NOTE
            [stalled source] in ``cachepipe/source/timed.py``).
    """

    source: str
    cache_dir: str
    l2: L2Spec | None | bool | str | Sequence[str] = None
    cache_size: int = 256
    prefix: str = "cachepipe"
    replicas: int = 1
    timeout: float = 1.0
    use_l1: bool = True
    l1_map_size: int | None = None
    follow_external_links: bool = False
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    share_manifest: bool = False
    source_timeout: float = DEFAULT_SOURCE_TIMEOUT_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", os.path.abspath(os.fspath(self.source)))
        object.__setattr__(self, "cache_dir", os.path.abspath(os.fspath(self.cache_dir)))
        object.__setattr__(self, "l2", resolve_l2(self.l2))
        if not isinstance(self.cache_size, int) or self.cache_size < 1:
            raise ValueError(f"cache_size must be a positive int, got {self.cache_size!r}")
        if not self.prefix or ":" in self.prefix:
            raise ValueError(f"prefix must be non-empty without ':', got {self.prefix!r}")
        if self.l2.urls:
            check_replicas(self.l2.urls, self.replicas)
        elif self.replicas != 1:
            raise ValueError(f"replicas must be in 1..1 (the number of shards), got {self.replicas}")
        if not isinstance(self.timeout, (int, float)) or not math.isfinite(self.timeout) or self.timeout <= 0:
            raise ValueError(f"timeout (--timeout) must be a finite number of seconds > 0, got {self.timeout!r}")
        if (not isinstance(self.source_timeout, (int, float)) or not math.isfinite(self.source_timeout)
                or self.source_timeout <= 0):
            raise ValueError(f"source_timeout (--source-timeout) must be a finite number of seconds > 0, "
                             f"got {self.source_timeout!r}")
        if not isinstance(self.max_file_bytes, int) or self.max_file_bytes < 1:
            raise ValueError(f"max_file_bytes (--max-file-size) must be a positive number of bytes, "
                             f"got {self.max_file_bytes!r}")
        if self.l1_map_size is not None and self.l1_map_size < 1 << 16:
            raise ValueError(f"l1_map_size must be >= 64 KiB, got {self.l1_map_size}")
        check_cache_dir(self.cache_dir)  # NOTE [cache dir on a network file system]


def shorthand_config(source, cache_dir, redis, cache_size: int | None, settings: dict) -> CacheConfig:
    """The :class:`CacheConfig` of ``TwoLevelCache(source, cache_dir, redis, cache_size, **settings)``
    (``settings`` may name ``l2``, ``l2_servers``, ``l2_memory`` and the config's fields)."""
    if cache_dir is None:
        raise ValueError("TwoLevelCache(source, cache_dir, ...): cache_dir is required")
    l2 = resolve_l2(l2_setting(settings.pop("l2", None), redis), servers=settings.pop("l2_servers", None),
                    memory=settings.pop("l2_memory", None))
    return CacheConfig(source, cache_dir, l2, 256 if cache_size is None else cache_size, **settings)
