"""Reading source files: a small thread pool, because NFS latency, not bandwidth, limits
one reader (the GIL is released while a thread waits on the file system).

NOTE [stable reads]
A file is read between two ``fstat`` calls on the open descriptor: the bytes count only
when size and mtime are the same both times and the length read equals that size, so
a file caught mid-write is never taken for its content. A read that is unstable, or
stable but not the size and mtime the manifest expects (a writer that truncated the
file and is filling it again), is retried with backoff (``cachepipe.backoff.
retry_delays``), and so are the errors a network file system gives for a moment
(ENOENT while a file is replaced, EIO, ESTALE, ETIMEDOUT, ...). Then a stable read that
still differs from the manifest is returned for what it is (the caller serves it but
does not cache it, NOTE [changed files]); an error is returned as its ``OSError``, which
callers count as unreadable, never as a corrupt file.
"""
from __future__ import annotations

import errno
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cachepipe.backoff import retry_delays

__all__ = ["SourceChangedError", "SourceFile", "SourceReader", "STAT_KEYS", "TRANSIENT_ERRNOS"]

# Counters reported by TwoLevelCache.stats(), in display order.
STAT_KEYS = ("requests", "l2_hits", "l2_misses", "l2_bytes", "l2_writes", "l2_corrupt",
             "l2_errors", "l2_skipped", "l2_fallbacks", "l2_oom", "l2_write_errors", "l2_restarts",
             "l1_hits", "l1_misses", "l1_writes", "l1_corrupt", "l1_write_errors", "l1_errors",
             "l1_quarantined", "source_reads",
             "source_bytes", "source_errors", "source_changed", "corrupt")


TRANSIENT_ERRNOS = frozenset({errno.ENOENT, errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.EAGAIN,
                               errno.EINTR, errno.EBUSY, errno.ECONNRESET, errno.EHOSTUNREACH})


class SourceChangedError(OSError):
    """The file changed while it was read (NOTE [stable reads]), on every attempt."""


@dataclass(frozen=True)
class SourceFile:
    """The bytes of one stable read and the file's size and mtime while they were read."""

    data: bytes
    size: int
    mtime_ns: int


def _read_once(path: str) -> SourceFile:
    with open(path, "rb") as f:
        before = os.fstat(f.fileno())
        data = f.read()
        after = os.fstat(f.fileno())
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or len(data) != after.st_size:
        raise SourceChangedError(errno.EAGAIN, f"changed while it was read ({before.st_size} -> "
                                 f"{after.st_size} bytes, {len(data)} read)", path)
    return SourceFile(data, after.st_size, after.st_mtime_ns)


def read_stable(path: str, expect: tuple[int, int] | None = None,
                attempts: int = 4) -> SourceFile | OSError:
    """One file by NOTE [stable reads].

    Args:
        path: the file.
        expect: ``(size, mtime_ns)`` from the manifest; a stable read that differs is
            retried, then returned as it is.
        attempts: reads before giving up.

    Returns:
        The :class:`SourceFile`, or the last ``OSError``.
    """
    delays = retry_delays()
    result: SourceFile | OSError = OSError(errno.EIO, "not read", path)
    for attempt in range(attempts):
        try:
            result = _read_once(path)
            if expect is None or (result.size, result.mtime_ns) == tuple(expect):
                return result
        except SourceChangedError as exc:
            result = exc if not isinstance(result, SourceFile) else result
        except OSError as exc:
            if exc.errno not in TRANSIENT_ERRNOS:
                return exc
            result = exc
        if attempt + 1 < attempts:
            time.sleep(next(delays))
    return result


class SourceReader:
    """Read whole files, in parallel threads when there are several.

    Args:
        threads: pool size (created on first use, per process).
    """

    def __init__(self, threads: int = 8) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    def read(self, paths: list[str], expect: list[tuple[int, int]] | None = None) -> list[SourceFile | OSError]:
        """Stable reads in order (NOTE [stable reads]); an unreadable file gives its ``OSError``.

        Args:
            paths: files.
            expect: per file, ``(size, mtime_ns)`` from the manifest.
        """
        expect = expect or [None] * len(paths)
        if len(paths) <= 1:
            return [read_stable(p, e) for p, e in zip(paths, expect)]
        if self._pool is None or self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="cachepipe-read")
            self._pid = os.getpid()
        return list(self._pool.map(read_stable, paths, expect))

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=False)
        self._pool = None
