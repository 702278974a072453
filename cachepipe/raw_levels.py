"""L1 in front of the source: raw file bytes by sample index, read-through.

The lower half of the two-level cache: the decoded L2 sits above it in
:class:`~cachepipe.TwoLevelCache`, and the warm-up uses it directly.
"""
from __future__ import annotations

import warnings
from collections import Counter

from cachepipe.errors import CacheWarning, L1FullError
from cachepipe.l1_mirror import L1Mirror
from cachepipe.l2_store import warn_once
from cachepipe.manifest import Manifest
from cachepipe.source import SourceReader

__all__ = ["RawLevels"]


class RawLevels:
    """Read raw bytes from L1, else from the source (filling L1).

    Args:
        manifest: the source's manifest.
        l1: the mirror, or ``None`` for source only.
        counters: where hits, misses and failures are counted (shared with the cache).
        threads: source reader threads.
    """

    def __init__(self, manifest: Manifest, l1: L1Mirror | None, counters: Counter,
                 threads: int = 8) -> None:
        self.manifest = manifest
        self.l1 = l1
        self.counters = counters
        self.reader = SourceReader(threads)
        self.l1_writable = True
        self._warned: set = set()

    def read(self, need: list[int], *, strict_l1: bool = False) -> dict[int, bytes | OSError]:
        """Raw bytes of ``need``; an unreadable file maps to its ``OSError``.

        Args:
            need: sample indices.
            strict_l1: raise :class:`L1FullError` instead of warning and turning L1 writes
                off for this process (the warm-up wants the error).
        """
        c, m = self.counters, self.manifest
        raw: dict[int, bytes | OSError] = {}
        if self.l1 is not None:
            values, corrupt = self.l1.get_many(need)
            if corrupt:
                c["l1_corrupt"] += len(corrupt)
                warn_once(self._warned, "l1corrupt", f"L1 entries failed verification (e.g. sample "
                          f"{corrupt[0]}); re-reading them from the source")
            raw = {i: v for i, v in zip(need, values) if v is not None}
            c["l1_hits"] += len(raw)
            c["l1_misses"] += len(need) - len(raw)
        todo = [i for i in need if i not in raw]
        if not todo:
            return raw
        fresh = []
        for i, data in zip(todo, self.reader.read([m.path(i) for i in todo])):
            raw[i] = data
            if isinstance(data, OSError):
                warnings.warn(f"cannot read {m.path(i)}: {data}", CacheWarning, stacklevel=3)
                c["source_errors"] += 1
                continue
            c["source_reads"] += 1
            c["source_bytes"] += len(data)
            if len(data) != m.sizes[i]:
                c["source_changed"] += 1
                warn_once(self._warned, "changed", f"{m.relpaths[i]} has {len(data)} bytes, the "
                          f"manifest says {m.sizes[i]}: the source changed since it was scanned "
                          f"(rescan to refresh the cache)")
            fresh.append((i, data))
        if self.l1 is not None and fresh and (self.l1_writable or strict_l1):
            try:
                c["l1_writes"] += self.l1.put_many(fresh)
            except L1FullError as exc:
                if strict_l1:
                    raise
                self.l1_writable = False
                c["l1_write_errors"] += len(fresh)
                warnings.warn(f"{exc}; L1 writes are off in this process", CacheWarning, stacklevel=3)
        return raw

    def close(self) -> None:
        self.reader.close()
