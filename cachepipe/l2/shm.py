"""L2 in this node's memory (``shm://``): decoded samples in LMDB on a tmpfs, read in place.

NOTE [shm store]
With node-local sampling a rank reads only its node's partition (NOTE [warm-up
partitions]), so that partition can live in the node's memory with no server: each
namespace is one LMDB environment in the store directory (NOTE [shm store directory] in
``shm_dir.py``; ``<namespace>/data.mdb``), key the index as 8 big-endian bytes, value the
L2 value format (header + pixels + XXH3, NOTE [L2 value format]), and a ``meta`` table
with the namespace, the value format and the warm-up's partial record. Every process
maps the same pages: a read is a lookup in the map and a view of it, checked by the
reader (``cachepipe/l2/level.py``), with no copy and no server's CPU. Writes (warm-up,
misses) are LMDB transactions, one writer at a time: a killed writer loses its open
transaction and nothing else (LMDB commits by switching a meta page; its writer lock is a
robust mutex, taken over by the next writer), and a value that is torn anyway (by a bug,
by hand) fails its checksum, counts as ``l2_corrupt`` and is written again. Placement: the
same URL names every node's own store, so the store is ``node_local`` and a sample's node
is drawn by hashing (``placement.node_local_owner``); a job of several nodes therefore
needs ``locality="node"``. The size is the store's limit (``--l2-memory``), shared by its
namespaces: a write that would pass it is refused as Redis refuses one past ``maxmemory``
(``l2_oom``), so the warm-up keeps a fixed subset (NOTE [fixed L2 subset]). Nothing is
evicted. ``drop`` deletes the keys it matches and removes an environment it empties, which
gives its memory back to the system once no process maps it.

NOTE [shm failures]
A store that may not be used (NOTE [shm store directory]) or an LMDB error is counted
(``l2_errors`` for reads, ``l2_write_errors`` for writes), warned about once per process
with the one line that says why, and read past: the samples come from L1. The store is
asked again after the backoff of NOTE [dead shard backoff]. The explicit checks raise
``L2UnavailableError`` with that line.
"""
from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import quote, unquote

import lmdb
import numpy as np

from cachepipe.backoff import ShardHealth
from cachepipe.errors import L2UnavailableError, warn_once
from cachepipe.l2 import shm_dir
from cachepipe.l2.codec import VERSION
from cachepipe.l2.placement import node_local_owner
from cachepipe.l2.shm_env import KEY, PAGE, environment, footprint, forget, read_pinned
from cachepipe.l2.store import PARTIAL_KEY, SampleStore, glob_matcher, shard_row

__all__ = ["ShmStore"]

_TXN_PAGES = 8  # pages a write transaction may add beside its values (copied branch and leaf pages, meta)
_PARTIAL = b"partial:"


def _env_name(namespace: str) -> str:
    return quote(namespace, safe=":-_.,+=@")


class ShmStore(SampleStore):
    """One ``shm://`` store directory, the namespace ``namespace`` of it (NOTE [shm store]).

    Args:
        urls: one ``shm://`` URL.
        namespace, counters, timeout: as :class:`~cachepipe.l2.shards.ShardedRedisStore`.
        replicas: must be 1 (one store per node).
        memory: the store's size in bytes (``--l2-memory``); None: the one recorded in the
            store, else 25 % of RAM.

    Raises:
        ValueError: not exactly one URL, a malformed one, or replicas.
    """

    node_local = True

    def __init__(self, urls: Sequence[str], *, namespace: str, counters: Counter, replicas: int = 1,
                 timeout: float = 1.0, memory: int | None = None) -> None:
        if len(urls) != 1:
            raise ValueError(f"an shm:// L2 is one URL, this node's store; got {len(urls)}: {list(urls)}")
        if replicas != 1:
            raise ValueError("replicas must be 1 for an shm:// L2 (one store per node)")
        self.path = shm_dir.path_of(urls[0])
        self.url = f"shm://{self.path}"
        self.namespace, self.counters, self.memory = namespace, counters, memory
        self.health = [ShardHealth()]  # the store, for reads (declared: NOTE [L2 store protocol])
        self._writes = ShardHealth()  # its writes (a full tmpfs refuses them, not reads)
        self._warned: set = set()
        self._pid = -1
        self._reset()

    def _reset(self) -> None:
        self._env = self._values = self._meta = None
        self._checked = False  # the directory passed NOTE [shm store directory] in this process

    @property
    def limit(self) -> int:
        """The store's size in bytes: ``memory``, else the recorded one, else 25 % of RAM."""
        return self.memory or shm_dir.read_limit(self.path) or shm_dir.default_limit()

    # -- the environment, per process ------------------------------------------------------
    def _open(self, create: bool):
        """This namespace's environment (None: it does not exist and ``create`` is False).

        Raises:
            ShmRefused, lmdb.Error, OSError: the store cannot be used (NOTE [shm failures]).
        """
        if self._pid != os.getpid():  # NOTE [per-process handles]: the parent's are left alone
            self._pid = os.getpid()
            self._reset()
        if self._env is not None:
            return self._env
        limit, recorded = self.limit, shm_dir.read_limit(self.path)
        if not self._checked or create:
            shm_dir.check(self.url, self.path, limit, setting=create and recorded != limit, create=create)
            self._checked = True
        if create and recorded != limit:
            shm_dir.record_limit(self.path, limit)
        where = self.path / _env_name(self.namespace)
        opened = environment(where, self._map_size(limit), create)
        if opened is None:
            return None
        env, values, meta = opened
        with env.begin(db=meta) as txn:
            held, fmt = txn.get(b"namespace"), txn.get(b"format")
        if held is None or fmt is None:  # a new environment: say what it holds, once
            with env.begin(write=True, db=meta) as txn:
                txn.put(b"namespace", self.namespace.encode(), overwrite=False)
                txn.put(b"format", str(VERSION).encode(), overwrite=False)
                held, fmt = txn.get(b"namespace"), txn.get(b"format")
        held, fmt = held.decode(errors="replace"), int(fmt) if fmt.isdigit() else VERSION + 1
        if held != self.namespace:
            raise shm_dir.ShmRefused(self.url, f"{where} holds namespace {held!r}, not {self.namespace!r} (two "
                                               f"sources in one environment); remove it")
        if fmt > VERSION:
            raise shm_dir.ShmRefused(self.url, f"{where} holds values of format {fmt}, written by a newer cachepipe "
                                               f"(this one reads format {VERSION}); upgrade, or remove it")
        self._env, self._values, self._meta = env, values, meta
        return env

    def _map_size(self, limit: int) -> int:
        """The map: the tmpfs's size (virtual; the limit is kept by ``put_many``), so that
        no process's map is outgrown by another's writes."""
        return max(limit, shm_dir.free_bytes(self.path if self.path.exists() else self.path.parent)[0])

    def _failed(self, exc: BaseException, what: str, counter: str, n: int) -> None:
        self.health[0].failed(exc)
        self.counters[counter] += n
        self._reset()
        why = str(exc) if isinstance(exc, shm_dir.ShmRefused) else f"{type(exc).__name__}: {exc}"
        warn_once(self._warned, f"fail-{what}", f"L2 store {self.url} failed on {what} ({why}); reading from "
                                                f"L1/source and trying it again with backoff")

    def _checked_env(self, create: bool):
        """The environment for an explicit check; raises ``L2UnavailableError``."""
        try:
            return self._open(create)
        except (shm_dir.ShmRefused, lmdb.Error, OSError) as exc:
            self._reset()
            raise L2UnavailableError(str(exc) if isinstance(exc, shm_dir.ShmRefused)
                                     else f"cannot use L2 store {self.url}: {type(exc).__name__}: {exc}") from None

    # -- reads and writes --------------------------------------------------------------------
    def get_many(self, indices: Sequence[int]) -> list:
        out: list = [None] * len(indices)
        if not len(indices):
            return out
        if not self.health[0].available():
            self.counters["l2_skipped"] += len(indices)
            return out
        try:
            env = self._open(create=False)
            if env is None:
                return out  # a cold store: nothing written yet
            out = read_pinned(env, self._values, indices)  # views of the map (NOTE [pinned snapshots])
        except (shm_dir.ShmRefused, lmdb.Error, OSError) as exc:
            self._failed(exc, "read", "l2_errors", 1)
            return [None] * len(indices)
        self.health[0].succeeded()
        return out

    def put_many(self, items: Sequence[tuple[int, bytes]]) -> int:
        if not items:
            return 0
        if not (self.health[0].available() and self._writes.available()):
            self.counters["l2_write_errors"] += len(items)
            return 0
        stored = refused = 0
        try:
            env = self._open(create=True)
            room = self.limit - shm_dir.used_bytes(self.path) - _TXN_PAGES * PAGE
            with env.begin(write=True, db=self._values) as txn:
                for i, value in items:
                    need = footprint(len(value))
                    if need > room:
                        refused += 1
                        continue
                    txn.put(KEY.pack(int(i)), value)
                    room, stored = room - need, stored + 1
        except (shm_dir.ShmRefused, lmdb.Error, OSError) as exc:
            if not (isinstance(exc, lmdb.MapFullError) or self._tmpfs_full(items)):
                self._writes.failed(exc)  # a write that failed says nothing of reads: they go on
                self.counters["l2_write_errors"] += len(items)
                warn_once(self._warned, "fail-write", f"L2 store {self.url} refused a write ({type(exc).__name__}: "
                                                      f"{exc}); trying again with backoff")
                return 0
            stored, refused = 0, len(items)  # the tmpfs is full (LMDB says EIO): refused for room, as past the limit
        if refused:
            self.counters["l2_oom"] += refused
            self.counters["l2_write_errors"] += refused
            warn_once(self._warned, "oom", f"L2 shard {self.url} is out of memory (its limit of "
                      f"{self.limit / 2**20:.1f} MiB, --l2-memory, is reached, or its tmpfs is full): samples "
                      f"it cannot hold are served from L1/source; raise --l2-memory")
        self._writes.succeeded()
        return stored

    def _tmpfs_full(self, items) -> bool:
        """Whether the tmpfs lacks the room ``items`` need (the store's limit aside)."""
        try:
            return shm_dir.free_bytes(self.path)[1] < sum(footprint(len(v)) for _, v in items)
        except OSError:
            return False

    def missing(self, indices: Sequence[int]) -> list[int]:
        env = self._checked_env(create=False)
        if env is None:
            return [int(i) for i in indices]
        with env.begin(db=self._values, buffers=True) as txn:
            return [int(i) for i in indices if txn.get(KEY.pack(int(i))) is None]

    # -- the partial record -----------------------------------------------------------------
    def mark_partial(self, node: str, uncached: int) -> None:
        env = self._checked_env(create=True)
        with env.begin(write=True, db=self._meta) as txn:
            if uncached > 0:
                txn.put(_PARTIAL + node.encode(), str(int(uncached)).encode())
            else:
                txn.delete(_PARTIAL + node.encode())

    def partial(self) -> dict[str, int]:
        try:
            env = self._open(create=False)
            if env is None:
                return {}
            with env.begin(db=self._meta) as txn:
                cursor = txn.cursor()
                found = cursor.set_range(_PARTIAL)
                out = {}
                while found and cursor.key().startswith(_PARTIAL):
                    if cursor.value().isdigit():
                        out[cursor.key()[len(_PARTIAL):].decode(errors="replace")] = int(cursor.value())
                    found = cursor.next()
                return out
        except (shm_dir.ShmRefused, lmdb.Error, OSError):
            self._reset()
            return {}

    # -- every namespace of the store: stats, scan, drop -----------------------------------
    def _namespaces(self) -> Iterator[tuple[str, Path]]:
        self._checked_env(create=False)  # refuses a store that may not be used
        if not self.path.is_dir():
            return
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False) and os.path.exists(os.path.join(entry.path, "data.mdb")):
                yield unquote(entry.name), Path(entry.path)

    def _other(self, where: Path) -> tuple:
        """``(env, values)`` of another namespace's environment of the store (it exists)."""
        env, values, _ = environment(where, self._map_size(self.limit), create=False)
        return env, values

    def _keys(self, where: Path) -> tuple[int, list[bytes]]:
        """(entries, every key) of the environment at ``where``."""
        env, values = self._other(where)
        with env.begin(db=values) as txn:
            return txn.stat(values)["entries"], list(txn.cursor().iternext(values=False))

    def scan(self, match: str) -> Iterator[bytes]:
        matches = glob_matcher(match)
        try:
            for ns, where in self._namespaces():
                for key in self._keys(where)[1]:
                    full = f"{ns}{KEY.unpack(key)[0]}".encode()
                    if matches(full):
                        yield full
        except (lmdb.Error, OSError) as exc:
            raise L2UnavailableError(f"cannot list L2 store {self.url}: {type(exc).__name__}: {exc}") from None

    def drop(self, match: str) -> int:
        matches, deleted = glob_matcher(match), 0
        try:
            for ns, where in list(self._namespaces()):
                entries, keys = self._keys(where)
                hit = [k for k in keys if matches(f"{ns}{KEY.unpack(k)[0]}".encode())]
                if len(hit) == entries and (entries or matches(f"{ns}{PARTIAL_KEY}".encode())):
                    if ns == self.namespace:
                        self._reset()
                    forget(where)
                    shutil.rmtree(where)  # its memory returns once no process maps it
                elif hit:
                    env, values = self._other(where)
                    with env.begin(write=True, db=values) as txn:
                        for k in hit:
                            txn.delete(k)
                deleted += len(hit)
        except (lmdb.Error, OSError) as exc:
            raise L2UnavailableError(f"cannot drop keys of L2 store {self.url}: {type(exc).__name__}: {exc}") from None
        return deleted

    def shard_info(self) -> list[dict]:
        try:
            keys = sum(self._keys(where)[0] for _, where in self._namespaces())
            size = shm_dir.free_bytes(next(p for p in (self.path, *self.path.parents) if p.exists()))[0]
        except (L2UnavailableError, lmdb.Error, OSError) as exc:
            why = exc.__context__ if isinstance(exc, L2UnavailableError) else exc
            return [shard_row(self.url, error=why.why if isinstance(why, shm_dir.ShmRefused) else str(exc))]
        return [shard_row(self.url, reachable=True, used_memory=shm_dir.used_bytes(self.path), maxmemory=self.limit,
                          keys=keys, policy="noeviction", system_memory=size)]

    # -- declared capabilities --------------------------------------------------------------
    def node_of(self, indices: Sequence[int], nodes: int | None = None) -> np.ndarray:
        """Each index's node among ``nodes``, by hashing (NOTE [placement]: a node-local store)."""
        return node_local_owner(np.asarray(indices, dtype=np.int64), nodes or 1)

    def server_cpu_seconds(self) -> float:
        return 0.0  # no server: reads run in the reading processes

    def close(self) -> None:
        if self._pid == os.getpid():
            self._reset()  # the environment closes when its last view lets go (NOTE [pinned snapshots])
