"""One batch of the warm-up, and batches in a row with their source reads in flight.

Split from ``cachepipe/warmup.py`` (NOTE [warm-up partitions], NOTE [corrupt files] and
NOTE [fixed L2 subset] there); the reads ahead are NOTE [reads in flight] in
``cachepipe/l1/raw_levels.py``.
"""
from __future__ import annotations

import warnings
from collections import Counter, deque
from collections.abc import Iterator
from itertools import islice

from cachepipe.decode import decode_and_resize
from cachepipe.errors import CacheWarning, CorruptSampleError, SampleTooLargeError
from cachepipe.l2.codec import encode_sample

__all__ = ["GROUP", "pipelined", "run_group", "set_worker_cache", "warm_chunk"]


def warm_chunk(cache, indices: list[int], l2_indices: list[int], ahead: list[int] = ()) -> dict:
    """Mirror ``indices`` into L1 and decode ``l2_indices`` into L2 (one batch each),
    after starting the source reads of ``ahead`` (NOTE [reads in flight]).

    Returns:
        Counts (``done``, ``l1_written``, ``l2_written``, ``l2_full`` (refused for
        maxmemory: NOTE [fixed L2 subset]), ``bytes_read``, ``l2_write_errors`` (other
        failures)) and index lists: ``corrupt`` (stable, unchanged bytes that do
        not decode, or too large to read), ``unreadable`` (read errors after retries;
        ``why``: index -> the error), ``changed`` (the file differs from the manifest),
        ``decoded``.

    Raises:
        L1FullError: the L1 map or disk is full.
    """
    before = Counter(cache.counters)
    cache._open()
    if len(ahead):
        cache._raw.prefetch(ahead, unless_in_l1=True)  # e.g. the capacity estimate's samples are there
    raw = cache._read_raw(indices, strict_l1=True)
    changed = set(cache._raw.changed)
    corrupt, unreadable, encoded = [], [], []
    for i in indices:  # every file read, L1's too (an L1-only warm-up's errors were lost)
        data = raw[i]
        if isinstance(data, OSError):  # NOTE [corrupt files]: a file too large to read is not a sample
            (corrupt if isinstance(data, SampleTooLargeError) else unreadable).append(i)
    bad = set(corrupt) | set(unreadable)
    for i in l2_indices:
        data = raw[i]
        if i in bad or i in changed:
            continue
        try:
            encoded.append((i, encode_sample(i, decode_and_resize(data, cache.config.cache_size, index=i))))
        except CorruptSampleError:
            corrupt.append(i)
    with warnings.catch_warnings():  # NOTE [fixed L2 subset]: a full shard is expected here
        warnings.filterwarnings("ignore", "L2 shard .* is out of memory", CacheWarning)
        l2_written = cache.store.put_many(encoded) if encoded and cache.store is not None else 0
    after = cache.counters
    oom = after["l2_oom"] - before["l2_oom"]  # NOTE [fixed L2 subset]: left out, not an error
    return {"done": len(indices), "l1_written": after["l1_writes"] - before["l1_writes"],
            "l2_written": l2_written, "bytes_read": after["source_bytes"] - before["source_bytes"],
            "l2_write_errors": after["l2_write_errors"] - before["l2_write_errors"] - oom,
            "l2_full": oom, "corrupt": corrupt, "unreadable": unreadable, "changed": sorted(changed),
            "decoded": [i for i, _ in encoded], "why": {i: str(raw[i]) for i in unreadable}}


_WORKER_CACHE = None


def set_worker_cache(cache) -> None:
    """Pool initializer: the cache a worker process warms with."""
    global _WORKER_CACHE
    _WORKER_CACHE = cache


def run_group(group) -> list[dict]:
    """A worker process's task: :func:`pipelined` over a group of chunks."""
    return list(pipelined(_WORKER_CACHE, group))


_DEPTH = 2  # chunks whose source reads run ahead of the one being written (NOTE [reads in flight])
GROUP = 4  # chunks per task of a worker process, pipelined inside it


def pipelined(cache, chunks) -> Iterator[dict]:
    """:func:`warm_chunk` of each ``(indices, l2_indices, from_source)`` in order, the source
    reads of the next :data:`_DEPTH` chunks in flight meanwhile (NOTE [reads in flight])."""
    it = iter(chunks)
    window = deque(islice(it, _DEPTH + 1))
    while window:
        indices, l2_indices, _ = window[0]
        ahead = [i for c in window for i in c[2]]
        yield warm_chunk(cache, indices, l2_indices, ahead)
        window.popleft()
        window.extend(islice(it, 1))


