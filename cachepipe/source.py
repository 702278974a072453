"""Reading source files: a small thread pool, because NFS latency, not bandwidth, limits
one reader (the GIL is released while a thread waits on the file system)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

__all__ = ["SourceReader", "STAT_KEYS"]

# Counters reported by TwoLevelCache.stats(), in display order.
STAT_KEYS = ("requests", "l2_hits", "l2_misses", "l2_bytes", "l2_writes", "l2_corrupt",
             "l2_errors", "l2_skipped", "l2_fallbacks", "l2_oom", "l2_write_errors", "l2_restarts",
             "l1_hits", "l1_misses", "l1_writes", "l1_corrupt", "l1_write_errors", "l1_errors",
             "l1_quarantined", "source_reads",
             "source_bytes", "source_errors", "source_changed", "corrupt")


def _read(path: str) -> bytes | OSError:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        return exc


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

    def read(self, paths: list[str]) -> list[bytes | OSError]:
        """File contents in order; an unreadable file gives its ``OSError``."""
        if len(paths) <= 1:
            return [_read(p) for p in paths]
        if self._pool is None or self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="cachepipe-read")
            self._pid = os.getpid()
        return list(self._pool.map(_read, paths))

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=False)
        self._pool = None
