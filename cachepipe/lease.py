"""Which namespaces a running process uses: a lease every user of one holds, that ``drop`` tests.

NOTE [namespace lease]
``cachepipe drop`` deletes a namespace's L2 keys and its directory (L1 mirror, manifest).
A run still reading that namespace (it started before its source changed, so its
fingerprint is now an older one) would re-create the keys on its next misses, under a
namespace whose manifest is gone, so that ``stats`` and ``drop`` could never find them again,
and would lose its L1 and the manifest its new DataLoader workers map (issue 46, item 3).
So a namespace in use is never dropped: every process that opens a namespace for reads
and writes (:class:`~cachepipe.TwoLevelCache`, on its first use in the process) holds a
shared ``flock`` on ``<cache_dir>/<fingerprint>/lease`` for as long as the cache is open
(forked DataLoader workers share their parent's; spawned ones take their own). ``drop``
takes it exclusively without waiting; when any process holds it, the namespace is refused
as in use, before anything is deleted, and ``drop`` keeps it while it deletes, so no run
opens the namespace half-dropped. The process that builds the cache (a rank) takes it at
once, so that the lease does not lapse between its loaders' workers; a cache collected
without ``close()`` lets go of it then. A lock dies with its process (``kill -9`` included),
so a lease is never stale and needs no refresh, no clock and no Redis command. It is
node-local, as the cache dir is: a run on another node reading the same L2 namespace is not
seen, but its node keeps the manifest, so the keys it re-creates are found by ``stats`` and
``drop`` there. A directory where the lease cannot be taken (read-only) holds none: writes
into it fail anyway.
"""
from __future__ import annotations

import errno
import fcntl
import os
import weakref
from pathlib import Path

__all__ = ["Lease", "NamespaceInUseError", "hold_lease", "release_lease", "take_exclusive"]

LEASE = "lease"


class NamespaceInUseError(RuntimeError):
    """A namespace is held by a running process of this node (NOTE [namespace lease])."""


def _open(directory: Path) -> int | None:
    """The lease file of ``directory`` opened (created when it can be), ``None`` when there is none."""
    path = directory / LEASE
    flags = os.O_NOFOLLOW | os.O_CLOEXEC  # a link named lease is no lease
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            return None
    try:  # read-only: an existing lease still locks
        return os.open(path, os.O_RDONLY | flags)
    except OSError:
        return None


class Lease:
    """A shared lease held by this process (NOTE [namespace lease]); let go by :meth:`release`
    or when the object is collected."""

    def __init__(self, fd: int) -> None:
        self.pid = os.getpid()
        self._close = weakref.finalize(self, os.close, fd)

    def release(self) -> None:
        """Let go (once; in a forked child, only the child's copy is forgotten)."""
        if self.pid == os.getpid():
            self._close()
        else:
            self._close.detach()


def hold_lease(directory: str | os.PathLike) -> Lease | None:
    """Hold the shared lease of the namespace directory ``directory`` (:meth:`Lease.release`
    lets go), ``None`` when none can be held there (no such directory, read-only and never
    leased, or a ``drop`` holds it right now)."""
    directory = Path(directory)
    if os.path.islink(directory) or not directory.is_dir():
        return None
    fd = _open(directory)
    if fd is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # a drop holds it: the namespace is going away
        os.close(fd)
        return None
    return Lease(fd)


def release_lease(fd: int | None) -> None:
    """Let go of the exclusive lease of :func:`take_exclusive` (``None``: nothing)."""
    if fd is not None:
        os.close(fd)


def take_exclusive(directory: str | os.PathLike, fingerprint: str) -> int | None:
    """Hold the lease of ``directory`` exclusively (``drop``): its fd, ``None`` when the
    directory has no lease file and cannot get one (read-only: nothing can be deleted there).

    Raises:
        NamespaceInUseError: a process of this node holds it.
    """
    fd = _open(Path(directory))
    if fd is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise NamespaceInUseError(f"namespace {fingerprint} is in use by a running process of this node (a "
                                  f"training run or loader opened it; NOTE [namespace lease]): nothing was "
                                  f"dropped; drop it after that run ends") from None
    return fd
