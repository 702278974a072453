"""The 64-bit checksum of cached bytes (L1 entries, L2 values).

NOTE [checksum]
XXH3-64 (``xxhash``), a non-cryptographic hash that runs at memory speed, one pass over
the bytes: a checksum is paid on every cached read, so a slower one (zlib's, or numpy
sums) becomes the largest cost of an L2 read (figures: ``docs/benchmarks/history/decisions.md``,
"Measurements behind design decisions"). It guards against torn, truncated, shifted or
foreign values, not adversaries: it is not keyed, so whoever can write a key can write a
value that passes, and L2 serves it.

Why no keyed MAC (issue 32): a MAC (HMAC-SHA256, keyed BLAKE2b) would make a value written
without the key a miss, but (1) every process that writes L2 (each node's warm-up, each
training rank writing back a miss) must hold the key, so it reaches exactly the
principals that hold the Redis credentials, and a party that can write the cache's keys
without those credentials is what the Redis ACL (a user limited to ``~<prefix>:*``,
docs/cache.md) and TLS keep out; (2) the source tree the cache mirrors, usually an NFS
export, is writable by at least as many; (3) it costs more than the read it guards:
one HMAC-SHA256 or keyed BLAKE2b per value made the L2 read path (fetch, parse, check)
1.8x and 2.6x as long per 256 px sample in interleaved rounds on the benchmark VM, where
XXH3 is a few microseconds (``docs/benchmarks/history/cache.md``); at the ~5 GB/s a node of GPUs reads,
HMAC-SHA256 (~2 GB/s per core with SHA-NI) alone would take two to three cores. So the boundary is the Redis ACL, and
docs/cache.md (Security) says so. XXH3 came in with L2 value format 2 (NOTE [L2 value
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
