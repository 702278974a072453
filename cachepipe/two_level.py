"""The two-level cache facade: L2 (Redis, decoded) -> L1 (LMDB, raw bytes) -> source.

NOTE [per-process handles]
An LMDB environment and Redis sockets must not cross ``fork``. The cache opens them lazily on first
use and again whenever ``os.getpid()`` changes; handles inherited from the parent are parked (never
closed in the child, which could disturb the parent's locks). Pickling keeps only the config and the
manifest (as its path), so one instance goes to DataLoader workers under any start method; counters are per process.
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from cachepipe.config import CacheConfig, shorthand_config
from cachepipe.counters import STAT_KEYS
from cachepipe.decode import decode_and_resize
from cachepipe.errors import CorruptSampleError, L2UnavailableError, SampleTooLargeError
from cachepipe.l1.guard import open_l1
from cachepipe.l1.mirror import L1Mirror
from cachepipe.l1.raw_levels import RawLevels
from cachepipe.l1.sizing import needed_map_size
from cachepipe.l2.codec import encode_sample
from cachepipe.l2.level import L2Level
from cachepipe.l2.registry import open_store
from cachepipe.l2.spec import L2Spec
from cachepipe.l2.store import SampleStore, namespace
from cachepipe.lease import Lease, hold_lease
from cachepipe.server.embedded import EmbeddedRedis, parse_memory
from cachepipe.server.embedded_group import EmbeddedGroup
from cachepipe.source.gone import check_source_alive
from cachepipe.source.manifest import Manifest
from cachepipe.shared_manifest import manifest_of

__all__ = ["TwoLevelCache"]

_INHERITED: list = []  # handles from a parent process; see NOTE [per-process handles]
_SOURCE_THREADS = 32  # reads in flight per process: NFS latency, not CPU, is their cost


class TwoLevelCache:
    """Decoded, resized RGB samples of an ImageFolder tree, read L2 -> L1 -> source.

    Each miss fills the levels above it, except L2 when warm-up left it a fixed subset of a
    source larger than its memory (NOTE [fixed L2 subset]). Failures of a level (shard down,
    OOM, corrupt value) are counted, warned about once and bypassed; they never give a
    wrong sample.

    Args:
        config: the cache's settings (:class:`~cachepipe.CacheConfig`, resolved once, e.g.
            from the command line); or, as a shorthand that builds it, the ImageFolder root
            (a path or a :class:`~cachepipe.Manifest`) followed by the settings below.
        cache_dir: holds manifests, the L1 mirror ``<fingerprint>/l1`` and the embedded
            Redis. Created if missing. (Shorthand only, as every setting up to
            ``max_file_bytes``.)
        redis: where L2 lives (also as ``l2=``, its name for what it is): ``None``
            (default): the embedded servers of ``cache_dir`` (started if not running, else
            reused); a list of ``redis://``/``unix://`` URLs: client-side shards (rendezvous
            hashing of the index); ``"redis-cluster://host:port"``: a Redis Cluster;
            ``"shm://"``: this node's memory (NOTE [shm store]); a URL of another registered
            scheme (NOTE [L2 store registry]); ``False``: no L2; or an
            :class:`~cachepipe.l2.spec.L2Spec`.
        cache_size: shorter side of cached samples (see NOTE [resize policy]; default 256).
        prefix: first part of L2 keys ``<prefix>:<fingerprint>:<cache_size>:<decoder tag>:<index>``.
        replicas: copies of each L2 value on distinct shards.
        l2_memory: embedded server's maxmemory, or an ``shm://`` store's size (``"4gb"``,
            ``"25%"``, bytes); ``None`` keeps a running server's (a store's recorded) setting
            and starts a new one at 25 % of RAM.
        l2_servers: embedded servers, reads spread over them by key (``None``: one per 8
            cores; NOTE [a node's L2] in ``cachepipe.server.embedded_group``); ``l2_memory`` is their total.
        timeout: Redis socket timeout in seconds.
        use_l1: keep the L1 mirror.
        l1_map_size: LMDB map size in bytes (default: from the file count and bytes, NOTE
            [L1 map size] in ``cachepipe/l1/sizing.py``).
        follow_external_links: follow symlinks that leave the source root (default: skip
            them with a warning; NOTE [symlinks in the source]).
        max_file_bytes: the largest source file read for one sample (default 1 GiB); a
            larger one is a bad sample, never read (NOTE [bounded reads]).
        manifest: a scan of the source to serve (e.g. ``Manifest.scan`` with
            ``extensions=``); default: the saved manifest, or a new scan.
        verify: manifest reuse check, ``"dirs"`` or ``"files"`` (see NOTE [manifest reuse]).
        rescan: always rescan the source.
        save_manifest: write a new scan to ``cache_dir`` (``False`` for inspection only,
            as ``cachepipe stats``: with it and without using L1/L2, nothing is written).

    Raises:
        FileNotFoundError: the source does not exist.
        ValueError: bad arguments, settings beside a ``CacheConfig``, a manifest of another
            root, or a source without classes/images.

    Example:
        >>> config = CacheConfig("/data/train", "/local/cache", ["redis://node0:6379/0"])
        >>> with TwoLevelCache(config) as cache:  # doctest: +SKIP
        ...     x = cache.get(0)            # (H, W, 3) uint8, min(H, W) == 256
        ...     xs = cache.get_many(range(64), errors="skip")
        >>> with TwoLevelCache("/data/train", "/local/cache") as cache:  # doctest: +SKIP
        ...     x = cache.get(0)            # the shorthand: embedded L2, 256 px
    """

    def __init__(self, config: CacheConfig | str | os.PathLike | Manifest, cache_dir: str | os.PathLike | None = None,
                 redis: L2Spec | None | bool | str | list[str] = None, cache_size: int | None = None, *,
                 manifest: Manifest | None = None, verify: str = "dirs", rescan: bool = False,
                 save_manifest: bool = True, **settings) -> None:
        if isinstance(config, CacheConfig):
            if cache_dir is not None or redis is not None or cache_size is not None or settings:
                raise ValueError("TwoLevelCache(config): the settings are the CacheConfig's; pass no others "
                                 "beside it (dataclasses.replace(config, ...) changes one)")
        else:
            if isinstance(config, Manifest):
                config, manifest = config.root, config
            config = shorthand_config(config, cache_dir, redis, cache_size, settings)
        self.config = config
        self._manifest = manifest_of(config, manifest, verify=verify, rescan=rescan, save=save_manifest)
        check_source_alive(config.source)  # a share that went away mid-scan: NOTE [source gone]
        self._fingerprint = self._manifest.fingerprint
        self._reset_process_state()
        self._lease = hold_lease(self.l1_path.parent) if save_manifest else None  # NOTE [namespace lease]

    # -- pickling and per-process state -----------------------------------------------
    def _reset_process_state(self) -> None:
        self._pid: int | None = None
        self._l1: L1Mirror | None = None
        self._store: SampleStore | None = None
        self._raw: RawLevels | None = None
        self._l2: L2Level | None = None
        self._lease: Lease | None = None  # NOTE [namespace lease]
        self.counters: Counter = Counter()
        self.started_server = False  # this process started the embedded server
        self.last_errors: dict[int, str] = {}  # bad samples of the last get_many: index -> reason
        self._missed = False  # the last get_many read from the source (NOTE [reads in flight])
        self.l1_problems: list[str] = []  # why L1 is bypassed in this process (NOTE [L1 guard])

    def __getstate__(self) -> dict:
        return {"config": self.config, "manifest": self._manifest}  # NOTE [manifest pickles as its path]

    def __setstate__(self, state: dict) -> None:
        self.config = state["config"]
        self._manifest = state["manifest"]
        self._fingerprint = self._manifest.fingerprint
        self._reset_process_state()

    def _open(self) -> None:
        if self._pid == os.getpid():
            return
        if self._pid is not None:
            _INHERITED.append((self._l1, self._store, self._raw))
            self._reset_process_state()
        cfg = self.config
        if cfg.use_l1:
            m = self.manifest  # files too large are never stored (NOTE [bounded reads])
            files, kept = m.kept_count(cfg.max_file_bytes), m.kept_bytes(cfg.max_file_bytes)
            map_size = cfg.l1_map_size or needed_map_size(files, kept)  # NOTE [L1 map size]
            self._l1, writable = open_l1(self.l1_path, map_size, self.counters, self.l1_problems)  # NOTE [L1 guard]
            if self._l1 is not None:
                self._l1.wanted = files, needed_map_size(files, kept)
        self._raw = RawLevels(self.manifest, self._l1, self.counters, _SOURCE_THREADS, cfg.max_file_bytes,
                              source_timeout=cfg.source_timeout)
        self._raw.l1_writable = self._l1 is not None and writable
        l2 = cfg.l2
        if l2.enabled:
            urls = self.embedded_group(start=True).urls if l2.is_embedded else l2.urls
            self._store = open_store(urls, self.namespace, self.counters, replicas=cfg.replicas, timeout=cfg.timeout,
                                     memory=None if l2.is_embedded else l2.memory)  # a sized store's (shm://)
            share = None if l2.memory is None else parse_memory(l2.memory) // l2.servers  # NOTE [a group's memory]
            self._l2 = L2Level(self._store, cfg.cache_size, self.counters,
                               (lambda i: self.embedded_server(index=i)) if l2.is_embedded else None, share)
        self._lease = self._lease or hold_lease(self.l1_path.parent)  # NOTE [namespace lease]
        self._pid = os.getpid()

    # -- properties --------------------------------------------------------------------
    @property
    def manifest(self) -> Manifest:
        """The source's :class:`~cachepipe.Manifest` (mapped from the cache dir, NOTE [manifest file])."""
        return self._manifest

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def namespace(self) -> str:
        """L2 key prefix ``<prefix>:<fingerprint>:<cache_size>:<decoder tag>:`` (NOTE [decoder tag])."""
        return namespace(self.config.prefix, self._fingerprint, self.config.cache_size)

    @property
    def l1_path(self) -> Path:
        return Path(self.config.cache_dir) / self._fingerprint / "l1"

    @property
    def l1(self) -> L1Mirror | None:
        self._open()
        return self._l1

    @property
    def store(self) -> SampleStore | None:
        self._open()
        return self._store

    def embedded_server(self, start: bool = False, index: int = 0) -> EmbeddedRedis:
        """Embedded server ``index`` of ``cache_dir`` (started when ``start``)."""
        return self.embedded_group(start).servers[index]

    def embedded_group(self, start: bool = False) -> EmbeddedGroup:
        """The embedded servers of ``cache_dir`` (``config.l2.servers`` of them, or one when L2
        is not embedded; started when ``start``: ``started_server`` then says whether this
        process started one)."""
        l2 = self.config.l2
        group = EmbeddedGroup(self.config.cache_dir, l2.servers, idle=l2.idle)
        if start and group.start(l2.memory):
            self.started_server = True
        return group

    def __len__(self) -> int:
        return len(self.manifest)

    # -- reads ---------------------------------------------------------------------------
    def get(self, index: int) -> np.ndarray:
        """Sample ``index`` as an ``(H, W, 3)`` uint8 RGB array.

        Raises:
            IndexError: out of range.
            CorruptSampleError: the source file cannot be decoded.
        """
        return self.get_many([index])[0]

    def get_many(self, indices: Iterable[int], *, errors: str = "raise",
                 copy: bool = True) -> list[np.ndarray | None]:
        """Samples of ``indices`` in order, with one L2 round trip per shard.

        Args:
            indices: sample indices (duplicates allowed).
            errors: ``"raise"``: a corrupt or unreadable source file raises
                :class:`CorruptSampleError` (after the good samples were cached); ``"skip"``:
                it gives ``None`` and is counted in ``stats()["corrupt"]``. Either way
                ``last_errors`` then maps each bad index of this call to what was wrong, and
                nothing is warned about here: the caller reports a bad sample (NOTE [bad
                samples reported once] in ``loaders/folder.py``).
            copy: ``False`` returns L2 hits as read-only views of the Redis reply (one
                copy less per sample, for callers that crop or convert anyway).

        Returns:
            ``(H, W, 3)`` uint8 arrays, writable unless ``copy=False`` (``None`` only with
            ``errors="skip"``).

        Raises:
            IndexError, CorruptSampleError, ValueError (bad ``errors``).
        """
        if errors not in ("raise", "skip"):
            raise ValueError(f"errors must be one of 'raise', 'skip'; got {errors!r}")
        idx = [int(i) for i in indices]
        n = len(self.manifest)
        for i in idx:
            if not 0 <= i < n:
                raise IndexError(f"sample index {i} out of range for {n} samples")
        self._open()
        c = self.counters
        c["requests"] += len(idx)
        uniq = list(dict.fromkeys(idx))
        result = self._l2.read(uniq, copy=copy) if self._l2 is not None and uniq else {}
        need = [i for i in uniq if i not in result]
        errors_seen: list[CorruptSampleError] = []
        self.last_errors = {}
        if need:
            before = c["source_reads"] + c["source_errors"]
            raw = self._raw.read(need)
            self._missed = c["source_reads"] + c["source_errors"] > before
            encoded = []
            for i in need:
                try:
                    if isinstance(raw[i], Exception):
                        what = "too large" if isinstance(raw[i], SampleTooLargeError) else "cannot read the file"
                        raise CorruptSampleError(f"{what} ({raw[i]})", index=i, path=self.manifest.relpaths[i])
                    arr = decode_and_resize(raw[i], self.config.cache_size, index=i,
                                            path=self.manifest.relpaths[i])
                except CorruptSampleError as exc:
                    c["corrupt"] += 1
                    errors_seen.append(exc)
                    continue
                result[i] = arr
                if self._l2 is not None and i not in self._raw.changed:
                    encoded.append((i, encode_sample(i, arr)))
            if encoded:
                self._l2.write_back(encoded)
        self.last_errors = {e.index: e.reason for e in errors_seen}
        if errors_seen and errors == "raise":
            raise errors_seen[0]
        out, seen = [], set()
        for i in idx:
            arr = result.get(i)
            out.append(arr.copy() if arr is not None and i in seen else arr)
            seen.add(i)
        return out

    def read_ahead(self, indices: Iterable[int]) -> int:
        """Start the source reads of ``indices`` that neither level holds, for a later
        :meth:`get_many`, if the last one read from the source (the miss path: NOTE [reads
        in flight]); free once the cache is warm. Returns how many reads were started."""
        if not self._missed:
            return 0
        self._missed = False
        idx = [int(i) for i in indices if 0 <= int(i) < len(self.manifest)]
        try:
            idx = self._store.missing(idx) if self._l2 is not None and idx else idx
        except L2UnavailableError:
            return 0  # the next read finds out and counts it
        return self._raw.prefetch(idx, unless_in_l1=True)

    def _read_raw(self, need: list[int], *, strict_l1: bool = False) -> dict[int, bytes | OSError]:
        """Raw bytes via L1, else the source (see :class:`~cachepipe.l1.raw_levels.RawLevels`)."""
        self._open()
        return self._raw.read(need, strict_l1=strict_l1)

    # -- bookkeeping ---------------------------------------------------------------------
    def stats(self) -> dict:
        """This process's counters: every name of ``STAT_KEYS`` (``cachepipe/counters.py``,
        each explained there), plus ``l2_hit_rate`` and ``pid``."""
        out = {k: int(self.counters.get(k, 0)) for k in STAT_KEYS}
        looked = out["l2_hits"] + out["l2_misses"]
        out["l2_hit_rate"] = out["l2_hits"] / looked if looked else 0.0
        out["pid"] = os.getpid()
        return out

    def close(self) -> None:
        """Close this process's handles (the cache can be used again: it reopens)."""
        if self._pid == os.getpid():
            if self._store is not None:
                self._store.close()
            if self._l1 is not None:
                self._l1.close()
            if self._raw is not None:
                self._raw.close()
            if self._lease is not None:
                self._lease.release()
        counters, started = self.counters, self.started_server
        self._reset_process_state()
        self.counters, self.started_server = counters, started

    def __enter__(self) -> TwoLevelCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"TwoLevelCache(source={self.config.source!r}, cache_dir={self.config.cache_dir!r}, "
                f"l2={self.config.l2!r}, cache_size={self.config.cache_size}, "
                f"fingerprint={self._fingerprint!r})")
