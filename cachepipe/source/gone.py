"""A source that went away: its file system stopped answering, or the tree was removed.

NOTE [source gone]
A network share that goes away mid-scan (the NFS server or a FUSE server such as
``cachepipe slowfs`` ended, the tree was removed) makes every later call fail, and a walk
that skips entries it cannot stat would hand on a manifest of whatever it saw before, as
if the rest had never existed. So once the scan is done the cache asks the root again
(a ``stat`` and the first entry of a ``readdir``): an error there is
:class:`SourceGoneError`, one line naming the source and what the file system said,
never a partial manifest, a traceback or a silent run on part of the data.
"""
from __future__ import annotations

import errno
import os

__all__ = ["SourceGoneError", "check_source_alive", "source_error"]

_WHY = {errno.ENOTCONN: "the file system serving it stopped answering (a network share or FUSE server, e.g. "
                        "cachepipe slowfs, that ended)",
        errno.ECONNABORTED: "the file system serving it was cut off",
        errno.ENOENT: "it was removed", errno.ESTALE: "the share's handle is stale (the server's tree changed)"}


class SourceGoneError(FileNotFoundError):
    """The source root cannot be reached any more (NOTE [source gone]); a ``FileNotFoundError``
    so that every command reports it as a missing source, in one line (``str()`` is that line)."""

    def __str__(self) -> str:
        return str(self.strerror)


def source_error(exc: OSError, root: str | os.PathLike) -> SourceGoneError | None:
    """``exc`` as a :class:`SourceGoneError` when it is about ``root`` or a path inside it
    and the share is unreachable now (``check_source_alive`` fails), else ``None``."""
    root = os.path.abspath(os.fspath(root))
    name = os.fspath(exc.filename) if isinstance(exc.filename, (str, bytes, os.PathLike)) else ""
    if not name or not (name == root or name.startswith(root.rstrip(os.sep) + os.sep)):
        return None
    try:
        check_source_alive(root)
    except SourceGoneError as gone:
        return gone
    return None


def check_source_alive(root: str | os.PathLike) -> None:
    """Raises:
        SourceGoneError: ``root`` cannot be stat'ed or listed now (names it and the reason)."""
    root = os.fspath(root)
    try:
        os.stat(root)
        with os.scandir(root) as it:
            next(it, None)
    except OSError as exc:
        why = _WHY.get(exc.errno, "the file system serving it fails")
        raise SourceGoneError(exc.errno, f"source {root!r} went away: {why} ({exc.strerror or exc}); make it "
                                         f"reachable and run again", root) from None
