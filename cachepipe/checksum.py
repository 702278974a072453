"""The 64-bit checksum of cached bytes (L1 entries, L2 values).

NOTE [checksum]
XXH3-64 (``xxhash``), a non-cryptographic hash that runs at memory speed, one pass over
the bytes: a checksum is paid on every cached read, so a slower one (zlib's, or numpy
sums) becomes the largest cost of an L2 read (figures: ``docs/BENCHMARKS.md``,
"Measurements behind design decisions"). It guards against torn, truncated, shifted or
foreign values, not adversaries. XXH3 came in with L2 value format 2 (NOTE [L2 value
format]): values and L1 entries written with the old sums fail verification once, count
as corrupt, and are read again from the level below and rewritten (or delete the old
cache directory to skip that).
"""
from __future__ import annotations

import xxhash

__all__ = ["checksum64"]


def checksum64(data) -> int:
    """XXH3-64 (seed 0) of a bytes-like object, as an unsigned int (see NOTE [checksum])."""
    return xxhash.xxh3_64_intdigest(data)
