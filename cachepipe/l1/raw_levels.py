"""L1 in front of the source: raw file bytes by sample index, read-through.

The lower half of the two-level cache: the decoded L2 (:class:`~cachepipe.l2.level.L2Level`)
sits above it in :class:`~cachepipe.TwoLevelCache`, and the warm-up uses it directly.

NOTE [reads in flight]
A networked source gives bandwidth only to many requests in flight: one reader waiting
out each file's latency in turn gets a fraction of it (at 5 ms a file and 110 KB a JPEG,
22 MB/s). A caller that knows what it reads next (the warm-up, its next batches; the
loader, the next batch of its sampler order: NOTE [loader read-ahead]) calls
:meth:`RawLevels.prefetch`, which starts those files' stable reads in the reader's threads
now; :meth:`RawLevels.read` then takes their results in its own order, so what is
returned, stored and counted does not depend on which read finishes first. The reads
ahead are bounded (``ahead_files``, ``ahead_bytes``): beyond them a prefetch starts
nothing, and the oldest finished reads nobody asked for are dropped.
"""
from __future__ import annotations

import errno
import warnings
from collections import Counter

import lmdb

from cachepipe.errors import CacheWarning, L1FullError, warn_once
from cachepipe.l1.base import RawStore
from cachepipe.source.base import SampleSource
from cachepipe.source.manifest import Manifest
from cachepipe.source.reader import DEFAULT_MAX_FILE_BYTES, SourceReader
from cachepipe.source.timed import DEFAULT_SOURCE_TIMEOUT_S

__all__ = ["RawLevels"]


class RawLevels:
    """Read raw bytes from L1, else from the source (filling L1).

    Args:
        manifest: the source's manifest.
        l1: the L1 store (the LMDB mirror), or ``None`` for source only.
        counters: where hits, misses and failures are counted (shared with the cache).
        threads: source reader threads.
        max_file_bytes: the largest file read for one sample (NOTE [bounded reads]).
        source: how files are read (default: a :class:`SourceReader` of ``threads``,
            ``max_file_bytes`` and ``source_timeout``; another :class:`SampleSource`, e.g. of
            an object store).
        source_timeout: seconds one source read may take (NOTE [stalled source]).
    """

    def __init__(self, manifest: Manifest, l1: RawStore | None, counters: Counter,
                 threads: int = 8, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, *,
                 source: SampleSource | None = None, source_timeout: float = DEFAULT_SOURCE_TIMEOUT_S) -> None:
        self.manifest = manifest
        self.l1 = l1
        self.counters = counters
        self.reader: SampleSource = source or SourceReader(threads, max_file_bytes, source_timeout, counters)
        self.l1_writable = True
        self.changed: set[int] = set()  # of the last read: bytes that do not match the manifest
        self._warned: set = set()
        self.ahead_files, self.ahead_bytes = 4 * threads, 64 << 20  # NOTE [reads in flight]
        self._ahead: dict[int, tuple[int, object]] = {}  # index -> (order started, its read), by prefetch
        self._ahead_size = self._seq = 0

    def prefetch(self, indices, *, unless_in_l1: bool = False) -> int:
        """Start the source reads of ``indices`` now, for a later :meth:`read` (NOTE [reads
        in flight]), in the order they will be read: indices to be read from the source
        (``unless_in_l1``: those L1 lacks). Returns how many were started."""
        submit = getattr(self.reader, "submit", None)
        if submit is None:
            return 0
        has = getattr(self.l1, "has_many", None)
        if unless_in_l1 and has is not None and len(indices):
            try:
                indices = [i for i, there in zip(indices, has(indices)) if not there]
            except lmdb.Error:
                return 0  # the read that follows bypasses L1 and says so
        m, started = self.manifest, 0
        for i in indices:
            i = int(i)
            if i in self._ahead:
                continue
            size = int(m.sizes[i])
            if len(self._ahead) >= self.ahead_files or (self._ahead and self._ahead_size + size > self.ahead_bytes):
                break
            self._seq += 1
            self._ahead[i] = (self._seq, submit(m.path(i), m.identity(i)))
            self._ahead_size += size
            started += 1
        return started

    def peek(self, indices: list[int]) -> list:
        """Read ``indices`` from the source now and keep the reads for a later :meth:`read`
        of them (NOTE [reads in flight]; they are not counted until then); returns each
        read's :class:`~cachepipe.source.reader.SourceFile` or ``OSError``. ``None`` per
        index when the reader cannot keep reads (a :class:`SampleSource` without ``submit``)."""
        submit = getattr(self.reader, "submit", None)
        if submit is None:
            return [None] * len(indices)
        m = self.manifest
        for i in indices:
            if i not in self._ahead:
                self._ahead[i] = (-1, submit(m.path(i), m.identity(i)))  # pinned: never dropped as passed
                self._ahead_size += int(m.sizes[i])
        return self.reader.read([m.path(i) for i in indices], [m.identity(i) for i in indices],
                                started={k: self._ahead[i][1] for k, i in enumerate(indices)})

    def _take(self, i: int) -> tuple[int, object]:
        got = self._ahead.pop(i)
        self._ahead_size -= int(self.manifest.sizes[i])
        return got

    def _drop_passed(self, oldest: int) -> None:
        """Forget finished reads ahead started before ``oldest`` that no read took: the
        reads went past them (a batch served from elsewhere, an epoch's end)."""
        for i in [i for i, (seq, fut) in self._ahead.items() if 0 <= seq < oldest and fut.future.done()]:
            self._take(i)

    def read(self, need: list[int], *, strict_l1: bool = False) -> dict[int, bytes | OSError]:
        """Raw bytes of ``need``; an unreadable file maps to its ``OSError``.

        Bytes whose file no longer has the manifest's identity are returned (they
        are the file as it is now) but never stored: their indices are in ``self.changed``
        after the call, so the caller keeps them out of L2 too (NOTE [changed files]).

        Args:
            need: sample indices.
            strict_l1: raise :class:`L1FullError` instead of warning and turning L1 writes
                off for this process (the warm-up wants the error).
        """
        c, m = self.counters, self.manifest
        raw: dict[int, bytes | OSError] = {}
        if self.l1 is not None:
            try:
                values, corrupt = self.l1.get_many(need)
            except lmdb.Error as exc:  # NOTE [L1 guard]: bypass it, never fail the read
                values, corrupt = [None] * len(need), []
                self._bypass_l1(exc)
            if corrupt:
                c["l1_corrupt"] += len(corrupt)
                warn_once(self._warned, "l1corrupt", f"L1 entries failed verification (e.g. sample "
                          f"{corrupt[0]}); re-reading them from the source")
            raw = {i: v for i, v in zip(need, values) if v is not None}
            c["l1_hits"] += len(raw)
            c["l1_misses"] += len(need) - len(raw)
        self.changed = set()
        todo = [i for i in need if i not in raw]
        if not todo:
            return raw
        fresh = []
        started = {i: self._take(i) for i in todo if i in self._ahead}  # NOTE [reads in flight]
        ordered = [seq for seq, _ in started.values() if seq >= 0]
        if ordered:
            self._drop_passed(min(ordered))
        paths, expect = [m.path(i) for i in todo], [m.identity(i) for i in todo]
        got_all = (self.reader.read(paths, expect, started={k: started[i][1] for k, i in enumerate(todo)
                                                              if i in started})
                   if started else self.reader.read(paths, expect))  # the deadline covers the reads ahead too
        for i, got in zip(todo, got_all):
            if isinstance(got, OSError):
                raw[i] = got  # the caller reports the bad sample, once (NOTE [bad samples reported once])
                c["source_errors"] += 1
                continue
            raw[i] = got.data
            c["source_reads"] += 1
            c["source_bytes"] += got.size
            if got.identity != m.identity(i):
                c["source_changed"] += 1
                self.changed.add(i)
                warn_once(self._warned, "changed", f"{m.relpaths[i]!r} is not the file the manifest "
                          f"describes (size, mtime, inode, ctime {got.identity}, the scan saw "
                          f"{m.identity(i)}): the source changed since it was scanned; served but not "
                          f"cached (rescan to refresh the cache)")
                continue
            fresh.append((i, got.data))
        if self.l1 is not None and fresh and (self.l1_writable or strict_l1):
            try:
                c["l1_writes"] += self.l1.put_many(fresh)
            except (L1FullError, lmdb.Error) as exc:
                if strict_l1:
                    raise L1FullError(errno.ENOSPC, f"cannot write L1 mirror {self.l1.path}: {exc}") from None
                self.l1_writable = False
                c["l1_write_errors"] += len(fresh)
                warnings.warn(f"{exc}; L1 writes are off in this process", CacheWarning, stacklevel=3)
        elif self.l1 is not None and fresh and strict_l1:
            raise L1FullError(errno.EROFS, f"L1 mirror {self.l1.path} cannot be written here "
                              f"(read-only); warm-up needs a writable cache dir")
        return raw

    def _bypass_l1(self, exc: BaseException) -> None:
        self.counters["l1_errors"] += 1
        warnings.warn(f"L1 mirror {self.l1.path} failed a read ({type(exc).__name__}: {exc}); L1 is "
                      f"bypassed in this process: reads come from L2 and the source", CacheWarning,
                      stacklevel=4)
        self.l1 = None

    def close(self) -> None:
        self.reader.close()
