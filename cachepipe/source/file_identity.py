"""What a scan records of each source file: its identity, taken once its timestamps are settled.

NOTE [file identity]
A file's identity is ``(size, mtime_ns, inode, ctime_ns)``; the manifest records it for
every file and its fingerprint hashes it (NOTE [changed files]). Size and mtime alone
miss a replacement that keeps both: a different image padded to the old size, the old
mtime copied onto it (``os.utime``) and ``os.replace``d over the file, or on a file
system with 1-2 s timestamps simply a same-size file written in the same second. The
inode changes with every rename over the file, and the ctime with every write, rename or
``utime`` (no user can set it), so the identity tells them apart.

Timestamps are only as fine as the file system's clock: a second on ext2/ext3 and HFS+,
two on FAT, one kernel tick (1-10 ms) where they are in nanoseconds. A file written again
within the same tick keeps its identity, so a stat taken within that tick proves nothing
about what is written next. A scan therefore **settles** its stats, as git does for
"racily clean" index entries: a file whose mtime or ctime is less than one window before
the scan started is stat'ed again once the window has passed (the window is 2 s on a
device whose timestamps all end in ``.000000000``, else 50 ms). Any write after that stat
falls into a later tick and changes the identity. The wait costs nothing for a tree that
is not being written; a scan right after a copy waits up to the window, once. A file that
keeps changing for 3 s keeps its last stat (reads compare the identity again: NOTE
[stable reads]). So comparing identities is a complete check, and ``verify="files"``
needs no content reads (they would read the whole source, the very cost the cache saves).

What the identity costs: ``chmod``, ``chown``, ``touch`` and copying or restoring the tree
change it, so each gives a new fingerprint and a re-warm. Nodes agree on a fingerprint
when they read the same file system (an NFS export reports the server's inode numbers and
ctimes to every client); per-node copies of a data set give per-node fingerprints, each
node its own namespace (never a wrong sample, but no shared L2). A file system with no
stable inode numbers (some FUSE mounts) re-warms after each mount.
"""
from __future__ import annotations

import dataclasses
import os
import stat
import time
from collections.abc import Callable

import numpy as np

from cachepipe.source.columns import IDENTITY, Columns

__all__ = ["identity", "is_regular", "settle"]

_FINE_WINDOW_NS = 50_000_000  # > one kernel tick at HZ >= 100
_COARSE_WINDOW_NS = 2_000_000_000  # FAT's 2 s mtime
_MAX_WAIT_S = 3.0


def identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """``(size, mtime_ns, inode, ctime_ns)`` of a stat result (NOTE [file identity])."""
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns


def is_regular(st: os.stat_result) -> bool:
    """Whether a stat result is a regular file (a FIFO, socket or device never is a sample:
    opening or reading one can block forever)."""
    return stat.S_ISREG(st.st_mode)


def _windows(devices: np.ndarray, mtimes: np.ndarray, ctimes: np.ndarray) -> np.ndarray:
    """Racy window per file: its device's, coarse unless some timestamp on it has a sub-second part."""
    fine = np.unique(devices[(mtimes % 10**9 != 0) | (ctimes % 10**9 != 0)])
    return np.where(np.isin(devices, fine), _FINE_WINDOW_NS, _COARSE_WINDOW_NS)


def _restat(path: str) -> tuple[int, int, int, int] | None:
    try:
        return identity(os.stat(path))
    except OSError:
        return None


def settle(cols: Columns, devices: np.ndarray, path_of: Callable[[int], str], started_ns: int,
           mapper: Callable = map) -> Columns:
    """``cols`` with the racy identities (NOTE [file identity]) taken again once settled.

    Args:
        cols: the scan's columns (NOTE [manifest columns]), stats taken after ``started_ns``.
        devices: each file's ``st_dev``.
        path_of: the path of file ``i``, to stat it again.
        started_ns: when the scan began (``time.time_ns()``).
        mapper: ``map`` or a pool's, to take the second stats many at a time (NOTE [scan in flight]).

    Returns:
        The columns to record (a file that vanished keeps its first stat: its reads fail).
    """
    windows = _windows(np.asarray(devices), cols.mtimes, cols.ctimes)
    give_up = time.monotonic() + _MAX_WAIT_S
    since = started_ns
    ident = None  # copies of the identity columns, made once a file needs a second stat
    while True:
        now = ident or {f: getattr(cols, f) for f in IDENTITY}
        latest = np.maximum(now["mtimes"], now["ctimes"])
        racy = np.flatnonzero(latest >= since - windows)
        if not len(racy):
            break
        ident = ident or {f: np.array(getattr(cols, f)) for f in IDENTITY}
        wait = min((int((latest[racy] + windows[racy]).max()) - time.time_ns()) / 1e9, give_up - time.monotonic())
        if wait > 0:
            time.sleep(wait + 0.001)
        since = time.time_ns()
        changed = False
        racy = racy.tolist()
        for k, again in zip(racy, mapper(_restat, [path_of(k) for k in racy])):
            if again is None:
                continue
            changed |= again != tuple(int(ident[f][k]) for f in IDENTITY)
            for f, v in zip(IDENTITY, again):
                ident[f][k] = v
        if not changed or time.monotonic() >= give_up:
            break
    return cols if ident is None else dataclasses.replace(cols, **ident)
