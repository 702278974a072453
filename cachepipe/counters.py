"""The names of a cache's counters (``TwoLevelCache.stats()``).

One ``collections.Counter`` per process is shared by the levels of a
:class:`~cachepipe.TwoLevelCache`: each level counts its own events under these names
(``l2_*`` in ``cachepipe/l2/``, ``l1_*`` and ``source_*`` in ``cachepipe/l1/raw_levels.py``,
``requests`` and ``corrupt`` in the facade), and ``stats()`` reports them in this order.
"""
from __future__ import annotations

__all__ = ["STAT_KEYS"]

STAT_KEYS = (
    "requests",                                               # samples asked for
    "l2_hits", "l2_misses", "l2_bytes", "l2_writes",
    "l2_corrupt",                                             # values failing their checks (rewritten)
    "l2_errors",                                              # failed reads of a shard
    "l2_skipped",                                             # reads not sent to a shard in backoff
    "l2_fallbacks",                                           # served by a replica
    "l2_oom", "l2_write_errors",                              # writes refused for maxmemory / failed
    "l2_restarts",                                            # embedded server restarted after it died
    "l1_hits", "l1_misses", "l1_writes", "l1_corrupt", "l1_write_errors",
    "l1_errors",                                              # L1 bypassed: cannot be opened or read
    "l1_quarantined",                                         # a broken L1 moved aside (NOTE [L1 guard])
    "source_reads", "source_bytes", "source_errors",
    "source_changed",                                         # files unlike the manifest (NOTE [changed files])
    "source_timeouts",                                        # reads past their deadline (NOTE [stalled source])
    "corrupt",                                                # undecodable samples
)
