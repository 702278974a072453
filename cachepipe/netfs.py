"""Refuse a cache dir on a network file system.

NOTE [cache dir on a network file system]
The cache dir holds the L1 LMDB mirror and the embedded Redis socket. LMDB needs a
coherent ``mmap`` and working ``fcntl`` locks between processes: NFS gives neither
(LMDB's documentation forbids remote file systems; readers then see torn pages or
another host's stale ones), a Unix socket cannot be shared through it, and a local
mirror of an NFS source kept on the same NFS saves nothing. So a cache dir whose file
system ``statfs`` reports as NFS, SMB/CIFS, 9p, AFS, Ceph, Lustre, GPFS or another
network file system is refused with an error naming it (``--cache-dir`` must be a local
disk: ``/local``, ``/scratch``, ``/tmp``, NVMe). FUSE is ambiguous (sshfs, s3fs, but
also local overlays), so it only gets a warning.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import warnings

from cachepipe.errors import CacheWarning

__all__ = ["NETWORK_FS", "check_cache_dir", "fs_magic"]

# statfs f_type magic numbers (linux/magic.h and the file systems' own headers)
NETWORK_FS = {0x6969: "NFS", 0x517B: "SMB", 0xFF534D42: "CIFS", 0xFE534D42: "SMB2",
              0x01021997: "9p", 0x5346414F: "AFS", 0x6B414653: "kAFS", 0x00C36400: "Ceph",
              0x0BD00BD0: "Lustre", 0x47504653: "GPFS", 0x73757245: "Coda", 0x013111A8: "IBRIX",
              0x19830326: "BeeGFS"}
_AMBIGUOUS = {0x65735546: "FUSE"}


class _StatFs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 112)]


def fs_magic(path: str | os.PathLike) -> int | None:
    """``statfs(path).f_type`` (Linux), or ``None`` where it cannot be asked."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    buf = _StatFs()
    if libc.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
        return None
    return buf.f_type & 0xFFFFFFFF


def check_cache_dir(path: str | os.PathLike) -> None:
    """Refuse a cache dir on a network file system (NOTE [cache dir on a network file system]).

    The nearest existing ancestor is checked when ``path`` does not exist yet.

    Raises:
        ValueError: ``path`` is on NFS, SMB/CIFS or another network file system.
    """
    probe = os.path.abspath(os.fspath(path))
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    magic = fs_magic(probe)
    if magic in NETWORK_FS:
        raise ValueError(f"--cache-dir {os.fspath(path)!r} is on {NETWORK_FS[magic]}, a network file "
                         f"system: LMDB and the Redis socket need a local disk (see docs/cache.md, "
                         f"Security); keep the source on {NETWORK_FS[magic]} and the cache on local disk")
    if magic in _AMBIGUOUS:
        warnings.warn(f"--cache-dir {os.fspath(path)!r} is on {_AMBIGUOUS[magic]}; if that is a network "
                      f"file system (sshfs, s3fs, ...) move the cache to a local disk", CacheWarning,
                      stacklevel=3)
