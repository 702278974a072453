"""Cache files readable by their owner only: directories 0700, files 0600.

NOTE [private cache files]
L1 holds the raw bytes of every source file and the manifests list their names, so a
cache directory must not widen who can read the data. Every directory the cache creates
is made 0700 and every file 0600 (LMDB's files through its ``mode`` argument, Redis'
through the umask it is started with). An existing directory owned by someone else is
refused: its owner could swap files under us. So is a symbolic link where the cache keeps
a directory of its own (``<fingerprint>/``, ``sources/``, ``redis/``, ``l1/``): writing
through it would put manifests, pointers, pid files and ``chmod`` on whatever it names
(issue 46, item 17). Only the cache dir itself may be a link (``/local/cache`` ->
``/mnt/nvme/cache``), which its user chose.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SymlinkedEntryError", "check_not_link", "private_dir", "write_private"]


class SymlinkedEntryError(PermissionError):
    """A cache dir entry is a symbolic link (NOTE [private cache files]): never followed."""


def check_not_link(path: str | os.PathLike) -> None:
    """Raise :class:`SymlinkedEntryError` when ``path`` is a symbolic link (absent is fine)."""
    if os.path.islink(path):
        raise SymlinkedEntryError(f"{path} is a symbolic link (to {os.readlink(path)}); cachepipe never "
                                  f"follows a link inside its cache dir (it would write through it): remove "
                                  f"the link")


def private_dir(path: str | os.PathLike, *, follow_link: bool = False) -> Path:
    """Create ``path`` (and missing parents) with mode 0700; tighten it if it is ours.

    Args:
        follow_link: accept ``path`` being a symbolic link to a directory (the cache dir
            itself, chosen by its user); default: refuse one (NOTE [private cache files]).

    Raises:
        PermissionError: ``path`` exists and belongs to another user;
            :class:`SymlinkedEntryError` (a ``PermissionError``): it is a symbolic link.
    """
    path = Path(path)
    if not follow_link:
        check_not_link(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{path} belongs to uid {st.st_uid}, not to this user "
                              f"({os.geteuid()}); refusing to keep cache files in it")
    if stat.S_IMODE(st.st_mode) & 0o077:
        try:
            os.chmod(path, 0o700)
        except OSError:  # a read-only file system: nothing gets written there anyway
            pass
    return path


def write_private(path: str | os.PathLike, data: bytes | Sequence) -> None:
    """Write ``data`` (bytes, or a sequence of bytes-like parts written in order) to ``path``
    atomically (temp name, then ``os.replace``), mode 0600."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in ([data] if isinstance(data, (bytes, bytearray, memoryview)) else data):
                f.write(part)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike):
    """Hold an exclusive ``flock`` on ``path`` (created 0600) for the ``with`` block; where
    the file cannot be created (a read-only or full disk) nobody else can write there
    either, so the block runs unlocked."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
