"""This process's LMDB environments of ``shm://`` stores, and values read as pinned views of them.

NOTE [pinned snapshots]
A value is a numpy view of the map that holds the read transaction it came from: LMDB
never reuses pages a live snapshot can see, so no writer changes the bytes of a view
while it exists (a re-filled value goes to new pages), and the snapshot and its reader
slot end when the batch's last view dies. Nothing is unmapped under a view either:
``close`` drops the handles, and the environment closes when the last view lets go.
The reader table has 2,048 slots (``max_readers``); ``reader_check`` clears the slots of
killed processes whenever a process opens the environment. A process opens each
environment once (LMDB's rule: a second open in one process would drop the first's
locks), shared by every store object of it; a forked child closes what it inherited
(py-lmdb's close leaves the parent's reader slots and locks alone, as L1's mirror does)
and opens its own.
"""
from __future__ import annotations

import os
import struct
import threading
from collections.abc import Sequence
from pathlib import Path

import lmdb
import numpy as np

__all__ = ["KEY", "PAGE", "environment", "footprint", "forget", "read_pinned"]

KEY = struct.Struct(">Q")  # a sample index, big-endian: keys sort by index
PAGE = 4096
_MAX_READERS = 2048
_OPEN: dict[str, tuple] = {}  # environment path -> (pid, inode of data.mdb, env, values, meta): one per process
_LOCK = threading.Lock()


class _Pinned(np.ndarray):
    """A value's bytes in the map; ``snapshot`` is its read transaction (NOTE [pinned snapshots])."""


def environment(where: Path, map_size: int, create: bool) -> tuple | None:
    """This process's ``(env, values, meta)`` of the environment at ``where`` (None: there is
    none and ``create`` is False).

    Raises:
        lmdb.Error, OSError: it cannot be opened or made.
    """
    try:
        inode = os.stat(where / "data.mdb").st_ino
    except FileNotFoundError:
        inode = None
    with _LOCK:
        for path in [p for p, held in _OPEN.items() if held[0] != os.getpid()]:
            _OPEN.pop(path)[2].close()  # a parent's: py-lmdb opens nothing twice, and its close is fork-aware
        held = _OPEN.get(str(where))
        if held is not None and held[1] == inode:
            return held[2:]
        _OPEN.pop(str(where), None)  # files removed since (a drop; a reboot's empty tmpfs): closes with its views
        if not create and inode is None:
            return None
        where.mkdir(mode=0o700, exist_ok=True)
        env = lmdb.open(str(where), map_size=map_size, max_dbs=2, max_readers=_MAX_READERS, sync=False,
                        metasync=False, readahead=False, mode=0o600)
        env.reader_check()  # slots of killed readers
        inode = os.stat(where / "data.mdb").st_ino
        _OPEN[str(where)] = (os.getpid(), inode, env, env.open_db(b"values"), env.open_db(b"meta"))
        return _OPEN[str(where)][2:]


def forget(where: Path) -> None:
    """Drop this process's handle of a removed environment (it closes with its last view)."""
    with _LOCK:
        _OPEN.pop(str(where), None)


def read_pinned(env, values, indices: Sequence[int]) -> list:
    """The values of ``indices`` in one read transaction, each a read-only uint8 view of the
    map that keeps the transaction (its snapshot) open while it lives; ``None`` for a miss."""
    txn = env.begin(db=values, buffers=True)
    get, out = txn.get, []
    for i in indices:
        view = get(KEY.pack(int(i)))
        if view is None:
            out.append(None)
            continue
        value = np.frombuffer(view, np.uint8).view(_Pinned)
        value.snapshot = txn
        out.append(value)
    return out


def footprint(nbytes: int) -> int:
    """Bytes a value takes in LMDB: its own pages beyond half a page (and its entry in a
    leaf), else a share of a leaf."""
    return -(-(nbytes + 16) // PAGE) * PAGE + 64 if nbytes > PAGE // 2 else nbytes + 64
