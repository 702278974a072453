"""Reading source files: a small thread pool, because NFS latency, not bandwidth, limits
one reader (the GIL is released while a thread waits on the file system).

NOTE [stable reads]
A file is read between two ``fstat`` calls on the open descriptor: the bytes count only
when its identity (size, mtime, inode, ctime: NOTE [file identity]) is the same both
times and the length read equals that size, so a file caught mid-write is never taken
for its content. A read that is unstable, or stable but not the identity the manifest
expects (a writer that truncated the file and is filling it again), is retried with backoff (``cachepipe.backoff.
retry_delays``), and so are the errors a network file system gives for a moment
(ENOENT while a file is replaced, EIO, ESTALE, ETIMEDOUT, ...). Then a stable read that
still differs from the manifest is returned for what it is (the caller serves it but
does not cache it, NOTE [changed files]); an error is returned as its ``OSError``, which
callers count as unreadable, never as a corrupt file.

Each read has a deadline (NOTE [stalled source] in ``timed.py``): a file system that stops
answering costs a timeout, a warning and a retry, never a hang.

NOTE [bounded reads]
Only a regular file is read: the file is opened with ``O_NONBLOCK`` (opening a FIFO
would wait for a writer forever) and anything but a regular file is refused before a
byte is read. One sample's read is bounded by ``max_bytes`` (``CacheConfig.
max_file_bytes``, ``--max-file-size``, default 1 GiB: an 8-bit RGB image at Pillow's own
pixel limit, stored uncompressed, is 512 MiB): a larger file raises
:class:`~cachepipe.errors.SampleTooLargeError` without being read, so a 40 GB file named
``x.jpg`` is one bad sample (skipped in training, recorded as corrupt by the warm-up)
instead of a ``MemoryError`` that ends the job. A reader holds at most threads x limit.
"""
from __future__ import annotations

import errno
import os
import time
import warnings
from collections import Counter
from dataclasses import dataclass

from cachepipe.backoff import retry_delays
from cachepipe.errors import CacheWarning, SampleTooLargeError
from cachepipe.source.file_identity import identity, is_regular
from cachepipe.source.timed import DEFAULT_SOURCE_TIMEOUT_S, TimedPool

__all__ = ["DEFAULT_MAX_FILE_BYTES", "SourceChangedError", "SourceFile", "SourceReader",
           "TRANSIENT_ERRNOS", "open_regular", "read_file", "read_stable"]

DEFAULT_MAX_FILE_BYTES = 1 << 30  # NOTE [bounded reads]


TRANSIENT_ERRNOS = frozenset({errno.ENOENT, errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.EAGAIN,
                               errno.EINTR, errno.EBUSY, errno.ECONNRESET, errno.EHOSTUNREACH})


class SourceChangedError(OSError):
    """The file changed while it was read (NOTE [stable reads]), on every attempt."""


@dataclass(frozen=True)
class SourceFile:
    """The bytes of one stable read and the file's identity while they were read."""

    data: bytes
    identity: tuple[int, int, int, int]  # (size, mtime_ns, inode, ctime_ns): NOTE [file identity]

    @property
    def size(self) -> int:
        return self.identity[0]


def _nonblocking(path, flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK)  # NOTE [bounded reads]: a FIFO's open would block


def open_regular(path: str):
    """``open(path, "rb")`` that never blocks on a FIFO and refuses anything but a regular
    file (NOTE [bounded reads]).

    Raises:
        OSError: as ``open``; ``EINVAL`` for a FIFO, socket or device.
    """
    f = open(path, "rb", opener=_nonblocking)
    if not is_regular(os.fstat(f.fileno())):
        f.close()
        raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device is never read)", path)
    os.set_blocking(f.fileno(), True)
    return f


def _read_once(path: str, max_bytes: int) -> SourceFile:
    with open_regular(path) as f:
        before = os.fstat(f.fileno())
        if before.st_size > max_bytes:
            raise SampleTooLargeError(before.st_size, max_bytes, path)
        data = f.read(min(before.st_size, max_bytes) + 1)  # one byte more shows growth; never a max_bytes buffer
        after = os.fstat(f.fileno())
    if identity(before) != identity(after) or len(data) != after.st_size:
        if len(data) > max_bytes:
            raise SampleTooLargeError(len(data), max_bytes, path)
        raise SourceChangedError(errno.EAGAIN, f"changed while it was read ({before.st_size} -> "
                                 f"{after.st_size} bytes, {len(data)} read)", path)
    return SourceFile(data, identity(after))


def read_stable(path: str, expect: tuple[int, int, int, int] | None = None, attempts: int = 4,
                max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> SourceFile | OSError:
    """One file by NOTE [stable reads] and NOTE [bounded reads].

    Args:
        path: the file.
        expect: its identity from the manifest; a stable read that differs is
            retried, then returned as it is.
        attempts: reads before giving up.
        max_bytes: a larger file is a :class:`SampleTooLargeError`, not read.

    Returns:
        The :class:`SourceFile`, or the last ``OSError``.
    """
    delays = retry_delays()
    result: SourceFile | OSError = OSError(errno.EIO, "not read", path)
    for attempt in range(attempts):
        try:
            result = _read_once(path, max_bytes)
            if expect is None or result.identity == tuple(expect):
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


_FILE_READERS: dict = {}  # (pid, max_bytes, timeout) -> the SourceReader of read_file


def read_file(path: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES, timeout: float = DEFAULT_SOURCE_TIMEOUT_S) -> bytes:
    """One sample file's bytes, read as the cache reads them (NOTE [stable reads], NOTE
    [bounded reads], with the deadline of NOTE [stalled source]), for loaders that bypass
    the cache.

    Raises:
        OSError: the last error (``SampleTooLargeError`` for a file over ``max_bytes``,
            ``ETIMEDOUT`` for a file system that stalls).
    """
    key = (os.getpid(), max_bytes, float(timeout))
    reader = _FILE_READERS.get(key)
    if reader is None:
        reader = _FILE_READERS[key] = SourceReader(4, max_bytes, timeout)
    (got,) = reader.read([path])
    if isinstance(got, OSError):
        raise got
    return got.data


class SourceReader:
    """Read whole files, in parallel threads, each with a deadline (NOTE [stalled source]).

    Args:
        threads: pool size (created on first use, per process).
        max_bytes: the largest file read for one sample (NOTE [bounded reads]).
        timeout: seconds one read may take before it is tried again on a fresh thread
            (twice; then the file is an ``OSError(ETIMEDOUT)``).
        counters: where ``source_timeouts`` are counted (the cache's counters).
    """

    def __init__(self, threads: int = 8, max_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 timeout: float = DEFAULT_SOURCE_TIMEOUT_S, counters: Counter | None = None) -> None:
        if threads < 1 or max_bytes < 1:
            raise ValueError(f"threads and max_bytes must be >= 1, got {threads}, {max_bytes}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.threads = threads
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.counters = Counter() if counters is None else counters
        self._pool: TimedPool | None = None
        self._pid = os.getpid()
        self._warned = False

    def read(self, paths: list[str], expect: list[tuple[int, int, int, int]] | None = None,
             started: dict | None = None) -> list[SourceFile | OSError]:
        """Stable reads in order (NOTE [stable reads]); an unreadable file gives its ``OSError``.

        Args:
            paths: files.
            expect: per file, its identity from the manifest (NOTE [file identity]).
            started: position in ``paths`` -> what :meth:`submit` returned for that file
                (its read is taken, not started again).
        """
        expect = expect or [None] * len(paths)
        return self._threads().map(self._read_one, list(zip(paths, expect)), on_timeout=self._timed_out,
                                   describe=lambda call: call[0], started=started)

    def submit(self, path: str, expect: tuple[int, int, int, int] | None = None):
        """Start one stable read now (a read ahead: NOTE [reads in flight]); hand what it
        returns to :meth:`read` as ``started`` to take its result, with the deadline."""
        return self._threads().start(self._read_one, (path, expect))

    def _threads(self) -> TimedPool:
        if self._pool is None or self._pid != os.getpid():  # threads do not survive fork
            self._pool = TimedPool(self.threads, self.timeout)
            self._pid = os.getpid()
        return self._pool

    def _read_one(self, path: str, expect) -> SourceFile | OSError:
        return read_stable(path, expect, max_bytes=self.max_bytes)

    def _timed_out(self, call: tuple, attempt: int) -> None:
        self.counters["source_timeouts"] += 1
        if not self._warned:  # once per reader and process: a stalled share stalls every read
            self._warned = True
            warnings.warn(f"source file {call[0]} gave no answer within {self.timeout:g} s (try {attempt}); "
                          f"reading it again on a fresh thread: the file system under it stalls (NOTE [stalled "
                          f"source]); counted in source_timeouts", CacheWarning, stacklevel=2)

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.close()
        self._pool = None
