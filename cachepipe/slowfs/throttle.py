"""The share's bandwidth, shared by every reader, and what was read.

NOTE [shared bandwidth]
A token bucket on a virtual clock: ``until`` is when every byte granted so far has been
sent at the cap. A request of n bytes is granted from ``max(until, now - burst/rate)``
and finishes n/rate later; the caller sleeps until then outside the lock, so concurrent
readers queue behind each other's bytes (they divide the cap) while their latencies still
overlap. ``burst`` (one 128 KiB FUSE read) lets an idle share answer one request at once,
as a real server's buffers do, without letting a crowd exceed the cap.
"""
from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict

__all__ = ["Bandwidth", "ReadStats"]


class Bandwidth:
    """A bandwidth cap shared by all threads (NOTE [shared bandwidth]).

    Args:
        bytes_per_s: the cap; 0 means none.
        burst_bytes: bytes an idle share may send at once.
    """

    def __init__(self, bytes_per_s: float, burst_bytes: int = 128 * 1024) -> None:
        if bytes_per_s < 0 or burst_bytes < 0:
            raise ValueError(f"bytes_per_s and burst_bytes must be >= 0, got {bytes_per_s}, {burst_bytes}")
        self.rate = float(bytes_per_s)
        self.burst_s = burst_bytes / self.rate if self.rate else 0.0
        self._until = 0.0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> float:
        """Wait until ``nbytes`` may have been sent; returns the seconds waited."""
        if not self.rate or nbytes <= 0:
            return 0.0
        with self._lock:
            now = time.monotonic()
            self._until = max(self._until, now - self.burst_s) + nbytes / self.rate
            wait = self._until - now
        if wait > 0:
            time.sleep(wait)
        return max(wait, 0.0)


class ReadStats:
    """Opens, read calls and bytes per file, and calls per operation (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.files: dict[str, Counter] = defaultdict(Counter)
        self.ops: Counter = Counter()

    def op(self, name: str) -> None:
        with self._lock:
            self.ops[name] += 1

    def opened(self, path: str) -> None:
        with self._lock:
            self.ops["open"] += 1
            self.files[path]["opens"] += 1

    def read(self, path: str, nbytes: int) -> None:
        with self._lock:
            self.ops["read"] += 1
            entry = self.files[path]
            entry["reads"] += 1
            entry["bytes"] += nbytes

    @property
    def reads(self) -> int:
        with self._lock:
            return self.ops["read"]

    def document(self) -> dict:
        """``{"files": {relpath: {"opens", "reads", "bytes"}}, "ops": {...}, "totals": {...}}``."""
        with self._lock:
            files = {p.lstrip("/"): {k: int(c.get(k, 0)) for k in ("opens", "reads", "bytes")}
                     for p, c in sorted(self.files.items())}
            ops = dict(sorted(self.ops.items()))
        totals = {k: sum(f[k] for f in files.values()) for k in ("opens", "reads", "bytes")}
        return {"files": files, "ops": ops, "totals": {**totals, "files": len(files)}}
