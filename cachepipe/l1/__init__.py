"""L1: raw source-file bytes on local disk, by sample index.

- ``base.py``: :class:`~cachepipe.l1.base.RawStore`, what the cache needs from an L1.
- ``mirror.py``: the LMDB mirror (checksummed values); ``sizing.py``: its map size (NOTE
  [L1 map size]); ``lmdb_check.py``, ``guard.py``:
  its checks before use and the quarantine of a broken one (NOTE [L1 guard]).
- ``raw_levels.py``: L1 in front of the source (read-through; the lower half of the cache).
- ``corrupt_record.py``: the source files the warm-up found undecodable.
"""
