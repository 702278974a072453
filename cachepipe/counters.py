"""The names of a cache's counters (``TwoLevelCache.stats()``).

One ``collections.Counter`` per process is shared by the levels of a
:class:`~cachepipe.TwoLevelCache`: each level counts its own events under these names
(``l2_*`` in ``cachepipe/l2/``, ``l1_*`` and ``source_*`` in ``cachepipe/l1/raw_levels.py``,
``requests`` and ``corrupt`` in the facade), and ``stats()`` reports them in this order.
"""
from __future__ import annotations

__all__ = ["STAT_KEYS"]

STAT_KEYS = ("requests", "l2_hits", "l2_misses", "l2_bytes", "l2_writes", "l2_corrupt",
             "l2_errors", "l2_skipped", "l2_fallbacks", "l2_oom", "l2_write_errors", "l2_restarts",
             "l1_hits", "l1_misses", "l1_writes", "l1_corrupt", "l1_write_errors", "l1_errors",
             "l1_quarantined", "source_reads",
             "source_bytes", "source_errors", "source_changed", "corrupt")
