"""Exceptions and warnings raised by cachepipe."""
from __future__ import annotations

import warnings

__all__ = ["CacheWarning", "CorruptSampleError", "EmptyFolderError", "L1FullError", "L2PermissionError",
           "L2UnavailableError", "SampleTooLargeError", "warn_once"]


class CacheWarning(RuntimeWarning):
    """A cache level misbehaved (shard down, OOM, corrupt value) and was bypassed.

    The read still returned the right sample (from another level or the source); the
    event is also counted in :meth:`cachepipe.TwoLevelCache.stats`.
    """


def warn_once(seen: set, key: str, message: str) -> None:
    """Emit a :class:`CacheWarning` the first time ``key`` is in ``seen`` (one set per
    store or level and process, so a dead shard warns once, not once per read)."""
    if key not in seen:
        seen.add(key)
        warnings.warn(message, CacheWarning, stacklevel=3)


class CorruptSampleError(ValueError):
    """A source file is not a decodable image (truncated, not an image, ...).

    Attributes:
        index: sample index in the manifest, or ``None`` when unknown.
        path: the file's path (relative to the source root), or ``None``.
        reason: what the decoder said.
    """

    def __init__(self, reason: str, *, index: int | None = None, path: str | None = None) -> None:
        self.index = index
        self.path = path
        self.reason = reason
        where = []
        if path is not None:
            where.append(f"file {path!r}")
        if index is not None:
            where.append(f"sample {index}")
        prefix = f"corrupt {', '.join(where)}: " if where else "corrupt image: "
        super().__init__(prefix + reason)

    def __reduce__(self):  # keep index/path/reason across DataLoader worker pickling
        return (_rebuild_corrupt, (self.reason, self.index, self.path))


def _rebuild_corrupt(reason: str, index: int | None, path: str | None) -> CorruptSampleError:
    return CorruptSampleError(reason, index=index, path=path)


class EmptyFolderError(FileNotFoundError, ValueError):
    """An ImageFolder root without class folders, or a class folder without a valid file.

    A ``FileNotFoundError`` as torchvision's ``ImageFolder`` raises it, and a ``ValueError``
    as cachepipe raised it before, so code catching either keeps working.
    """


class L1FullError(OSError):
    """The L1 LMDB mirror cannot take more data (map size reached or disk full).

    The environment stays consistent: the failed transaction is aborted as a whole.
    """


class L2UnavailableError(ConnectionError):
    """No L2 shard can be reached (raised by checks such as ``cachepipe warmup``, never
    by reads, which fall back to L1 and the source)."""


class L2PermissionError(L2UnavailableError):
    """A shard refused a command of an explicit check with ``NOPERM``: its ACL user lacks
    it. The message names the command and the shard (never the password)."""


class SampleTooLargeError(OSError):
    """A source file is larger than one sample may be (NOTE [bounded reads] in
    ``cachepipe/source/reader.py``); it was not read.

    Attributes:
        size: the file's size in bytes.
        limit: the limit (``CacheConfig.max_file_bytes``, ``--max-file-size``).
    """

    def __init__(self, size: int, limit: int, path: str) -> None:
        import errno

        self.size, self.limit = size, limit
        super().__init__(errno.EFBIG, f"{size / 2**20:.1f} MiB, more than the {limit / 2**20:.0f} MiB one "
                         f"sample may take (--max-file-size)", path)

    def __reduce__(self):  # keep size/limit across worker pickling
        return (type(self), (self.size, self.limit, self.filename))
