"""L2 above the raw levels: decoded samples by index, checked on read, written back on a miss.

The upper half of the two-level cache (:class:`~cachepipe.TwoLevelCache`); the lower half
is :class:`~cachepipe.l1.raw_levels.RawLevels`. Like it, a failure here (corrupt value, dead
embedded server) is counted, warned about once and read past, never a wrong sample.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from cachepipe.decode import possible_shape
from cachepipe.errors import warn_once
from cachepipe.l2.codec import decode_sample
from cachepipe.l2.store import SampleStore
from cachepipe.server.embedded import EmbeddedRedis

__all__ = ["L2Level"]


class L2Level:
    """Read decoded samples from an L2 store and write misses back (one per process).

    Args:
        store: the L2 store.
        cache_size: shorter side of the cached samples; a value of a shape impossible at it
            is corrupt (NOTE [decoder tag]).
        counters: where hits, misses and failures are counted (shared with the cache).
        embedded_server: when L2 is the cache's embedded servers, ``f(i)`` gives server ``i``
            (shard ``i``; :meth:`TwoLevelCache.embedded_server`), to restart it (empty) when it
            died and its backoff window is over; ``None`` for servers the cache does not own.
        l2_memory: an embedded server's memory limit when it is restarted.
    """

    def __init__(self, store: SampleStore, cache_size: int, counters: Counter,
                 embedded_server: Callable[[int], EmbeddedRedis] | None = None, l2_memory=None) -> None:
        self.store = store
        self.cache_size = cache_size
        self.counters = counters
        self.embedded_server, self.l2_memory = embedded_server, l2_memory
        self._warned: set = set()
        self._write_back: bool | None = None  # NOTE [fixed L2 subset]: asked once per process
        self._corrupt: set[int] = set()  # corrupt values read and not yet rewritten

    def read(self, indices: list[int], *, copy: bool = True) -> dict[int, np.ndarray]:
        """The samples of ``indices`` (distinct) that L2 holds, with one round trip per
        shard; a corrupt value is counted, warned about once and left out (a miss, rewritten).

        Args:
            copy: ``False`` gives read-only views of the Redis reply.
        """
        self._revive_embedded()
        c = self.counters
        result: dict[int, np.ndarray] = {}
        for i, value in zip(indices, self.store.get_many(indices)):
            if value is None:
                continue
            try:
                arr = decode_sample(value, i, copy=copy)
                if not possible_shape(arr.shape, self.cache_size):  # NOTE [decoder tag]
                    raise ValueError(f"shape {arr.shape} is impossible at cache size {self.cache_size}")
                result[i] = arr
                c["l2_bytes"] += len(value)
            except ValueError as exc:
                c["l2_corrupt"] += 1
                self._corrupt.add(i)
                warn_once(self._warned, "l2corrupt", f"corrupt L2 value for sample {i} "
                          f"({exc}); treated as a miss and rewritten")
        c["l2_hits"] += len(result)
        c["l2_misses"] += len(indices) - len(result)
        return result

    def write_back(self, encoded: list[tuple[int, bytes]]) -> None:
        """Store ``encoded`` (index, value) misses, unless warm-up left L2 a fixed subset of
        the source (NOTE [fixed L2 subset] in ``cachepipe/warmup.py``); the rest is read from
        L1. A value read as corrupt is rewritten either way: it is one of the subset."""
        if not encoded:
            return
        if self._write_back is None:
            self._write_back = not self.store.partial()
        if not self._write_back:
            encoded = [(i, v) for i, v in encoded if i in self._corrupt]
        self._corrupt.difference_update(i for i, _ in encoded)
        if encoded:
            self.counters["l2_writes"] += self.store.put_many(encoded)

    def _revive_embedded(self) -> None:
        """Restart the embedded server when it died and its backoff window is over
        (it starts empty and refills from L1 as samples are read)."""
        if self.embedded_server is None:
            return
        for i, shard in enumerate(self.store.health):  # declared by the store (NOTE [L2 store protocol])
            if not (shard.failures and shard.available()):
                continue
            server = self.embedded_server(i)
            if server.identity() is not None:
                continue  # ours and alive, only busy: never restarted under a reader (NOTE [server identity])
            try:
                if server.start(self.l2_memory):  # False: another process revived it
                    self.counters["l2_restarts"] += 1
            except (RuntimeError, OSError):
                pass  # still down: the read below fails fast and backs off again
