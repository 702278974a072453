"""The fingerprint of a manifest: a hash of its classes, relpaths, labels and identities.

NOTE [fingerprint stable across file formats]
The fingerprint names the cache's namespaces (the L1 directory, every L2 key), so it hashes
what a sample *is*, never how a manifest file lays it out: the bytes hashed are those of
manifest format 2 (``cachepipe-manifest-v2``, then each class name and ``\\0``, ``\\1``,
then per file ``<relpath>\\0<label>\\0<size>\\0<mtime_ns>\\0<inode>\\0<ctime_ns>\\n``),
so a source scanned by the binary format keeps the fingerprint, and the warm caches,
it had. It is computed once, when a scan ends, and stored in the manifest file; loading
one never recomputes it (the file's checksum guards the stored value). The records are
formatted and hashed a chunk at a time, so its memory does not grow with N.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

from cachepipe.source.columns import Columns

__all__ = ["fingerprint"]

_TAG = b"cachepipe-manifest-v2\0"  # the identity rule's version, not the file format's
_CHUNK = 1 << 13  # rows formatted at once: ~2 MB of Python objects, not ~25 MB (a scan under 100 MB at 100k)


def fingerprint(classes: Sequence[str], cols: Columns) -> str:
    """16 hex digits of SHA-256 over NOTE [fingerprint stable across file formats]'s records."""
    h = hashlib.sha256(_TAG)
    prefix = [os.fsencode(c) + b"/" for c in classes]
    for c in classes:
        h.update(os.fsencode(c) + b"\0")
    h.update(b"\1")
    names = cols.names.tobytes() if len(cols) <= _CHUNK else None
    for start in range(0, len(cols), _CHUNK):
        stop = min(start + _CHUNK, len(cols))
        offs = cols.offsets[start:stop + 1].tolist()
        blob = names if names is not None else cols.names[offs[0]:offs[-1]].tobytes()
        base = offs[0] if names is None else 0
        rows = zip(offs, offs[1:], cols.labels[start:stop].tolist(), cols.sizes[start:stop].tolist(),
                   cols.mtimes[start:stop].tolist(), cols.inos[start:stop].tolist(), cols.ctimes[start:stop].tolist())
        h.update(b"".join(b"%s%s\0%d\0%d\0%d\0%d\0%d\n" % (prefix[lab], blob[a - base:b - base], lab, size, mt, ino, ct)
                          for a, b, lab, size, mt, ino, ct in rows))
    return h.hexdigest()[:16]
