"""L1: a local-disk LMDB mirror of the source files' raw bytes.

NOTE [L1 layout and safety]
One LMDB environment per fingerprint at ``<cache_dir>/<fingerprint>/l1``, two named
databases: ``data`` (key = big-endian u64 index, value = the file's exact bytes) and
``meta`` (same key, value = size u64 + checksum u64, see NOTE [checksum]). Both are written in one
transaction per batch, so an entry is either fully there or absent: killing a writer at
any moment loses at most the open batch and a re-run resumes from the committed ones.
Reads verify the size and checksum; a mismatch is a miss, never bad bytes.
Durability: ``metasync=False`` keeps atomicity and consistency and only lets an OS crash
(not a process kill) undo the last commit. The map size is sized from the manifest
(NOTE [L1 map size] in ``l1/sizing.py``); a full map or disk aborts the transaction and
raises :class:`~cachepipe.errors.L1FullError` with the numbers, a full map with the size
the source's entries need at the rate the stored ones took.
Each process opens its own environment lazily (see NOTE [per-process handles] in
``two_level.py``).
"""
from __future__ import annotations

import errno
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import lmdb
import numpy as np

from cachepipe.checksum import checksum64
from cachepipe.errors import L1FullError
from cachepipe.l1.lmdb_check import lock_file_backed, reserve_lock_file
from cachepipe.private_files import private_dir

__all__ = ["L1Mirror"]

_KEY = struct.Struct(">Q")
# LMDB allows one handle per environment per process: (pid, path) -> open mirror.
_OPEN: dict[tuple[int, str], "L1Mirror"] = {}
_META = struct.Struct("<QQ")


class L1Mirror:
    """LMDB mirror of raw file bytes, keyed by sample index.

    Args:
        path: environment directory (created).
        map_size: LMDB map size in bytes.
        readonly: open without write access and without creating anything (for
            ``cachepipe stats``; see NOTE [L1 guard] in ``l1/guard.py``).

    Example:
        >>> l1 = L1Mirror("/cache/0123abcd/l1", map_size=2**30)  # doctest: +SKIP
        >>> l1.put_many([(0, b"...jpeg bytes...")]); l1.get_many([0])  # doctest: +SKIP
    """

    @classmethod
    def shared(cls, path: str | os.PathLike, map_size: int) -> L1Mirror:
        """The process-wide writable mirror at ``path`` (opened once per process,
        reference counted by :meth:`close`)."""
        pid = os.getpid()
        for old in [k for k in _OPEN if k[0] != pid]:
            # Inherited through fork: py-lmdb refuses a second open of the same files
            # until the inherited handle is closed, and its close is fork-aware (it leaves
            # the parent's reader slots and locks alone).
            _OPEN.pop(old).env.close()
        key = (pid, os.path.abspath(os.fspath(path)))
        mirror = _OPEN.get(key)
        if mirror is None or mirror._refs == 0:
            mirror = _OPEN[key] = cls(path, map_size)
        else:
            mirror._refs += 1
        return mirror

    def __init__(self, path: str | os.PathLike, map_size: int, *, readonly: bool = False) -> None:
        if map_size < 1 << 16:
            raise ValueError(f"map_size must be >= 64 KiB, got {map_size}")
        self.path = Path(path)
        self.map_size = int(map_size)
        self.readonly = readonly
        if not readonly:
            private_dir(self.path)  # NOTE [private cache files]
            reserve_lock_file(self.path)
        # read-only: register as a reader only in an existing, writable, fully allocated
        # lock file (so a concurrent writer keeps our pages); create or write nothing else
        lock = not readonly or lock_file_backed(self.path)
        self.env = lmdb.open(str(self.path), map_size=self.map_size, max_dbs=2, readonly=readonly,
                             metasync=False, readahead=False, lock=lock, create=not readonly,
                             mode=0o600)
        self.empty = False
        if readonly:
            try:
                self.data_db = self.env.open_db(b"data", create=False)
                self.meta_db = self.env.open_db(b"meta", create=False)
            except lmdb.NotFoundError:  # a writer is creating it right now
                self.empty, self.data_db, self.meta_db = True, None, None
        else:
            with self.env.begin(write=True) as txn:  # both databases appear together
                self.data_db = self.env.open_db(b"data", txn=txn)
                self.meta_db = self.env.open_db(b"meta", txn=txn)
        self._refs = 1
        self.wanted: tuple[int, int] | None = None  # (the source's files, the map they need): full-map message

    def get_many(self, indices: Sequence[int]) -> tuple[list[bytes | None], list[int]]:
        """Read entries in one transaction.

        Returns:
            ``(values, corrupt)``: ``values[k]`` is the verified bytes of ``indices[k]`` or
            ``None`` (absent or failed verification); ``corrupt`` lists the indices whose
            entry failed verification.
        """
        out: list[bytes | None] = []
        corrupt: list[int] = []
        with self.env.begin(buffers=True) as txn:
            for i in indices:
                key = _KEY.pack(i)
                meta = txn.get(key, db=self.meta_db)
                if meta is None:
                    out.append(None)
                    continue
                value = txn.get(key, db=self.data_db)
                size, checksum = _META.unpack(meta) if len(meta) == _META.size else (-1, 0)
                if value is None or len(value) != size or checksum64(value) != checksum:
                    out.append(None)
                    corrupt.append(i)
                    continue
                out.append(bytes(value))
        return out, corrupt

    def meta_many(self, indices: Sequence[int]) -> list[tuple[int, int] | None]:
        """``(size, checksum)`` stored for each of ``indices`` (NOTE [checksum]), ``None`` if absent."""
        with self.env.begin(buffers=True) as txn:
            metas = [txn.get(_KEY.pack(i), db=self.meta_db) for i in indices]
            return [_META.unpack(m) if m is not None and len(m) == _META.size else None for m in metas]

    def has_many(self, indices: Sequence[int]) -> list[bool]:
        """Whether each of ``indices`` has an entry (its ``meta`` key alone; nothing verified)."""
        if self.empty:
            return [False] * len(indices)
        with self.env.begin(buffers=True) as txn:
            return [txn.get(_KEY.pack(i), db=self.meta_db) is not None for i in indices]

    def put_many(self, items: Sequence[tuple[int, bytes]]) -> int:
        """Write ``(index, bytes)`` pairs in one transaction; returns how many.

        Raises:
            L1FullError: the map or the disk is full (the batch is not written).
        """
        if not items:
            return 0
        try:
            with self.env.begin(write=True) as txn:
                for i, data in items:
                    key = _KEY.pack(i)
                    txn.put(key, data, db=self.data_db)
                    txn.put(key, _META.pack(len(data), checksum64(data)), db=self.meta_db)
        except lmdb.MapFullError:
            raise L1FullError(errno.ENOSPC, self._full_message()) from None
        except lmdb.Error as exc:
            if "No space left" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC:
                free = _free_bytes(self.path)
                raise L1FullError(errno.ENOSPC, f"disk of L1 mirror {self.path} is full "
                                  f"({free / 2**20:.1f} MiB free); nothing of this batch was "
                                  f"written") from None
            raise
        return len(items)

    def _full_message(self) -> str:
        stored = self.entries()
        line = (f"L1 mirror {self.path} is full: its LMDB map size is {self.map_size / 2**20:.1f} MiB "
                f"({stored} entries stored); nothing of this batch was written")
        if self.wanted:  # the sizing rule's figure, or more when the stored entries took more (NOTE [L1 map size])
            files, need = self.wanted
            if stored:
                need = max(need, int(self.map_size / stored * files * 1.1) + (64 << 20))
            mib = -(-need // 2**20)
            line += f"; the source's {files} entries need about {mib} MiB: raise it with --l1-size {mib}mb (l1_map_size=)"
        return line

    def delete(self, indices: Sequence[int]) -> None:
        """Remove entries (used after a verification failure)."""
        with self.env.begin(write=True) as txn:
            for i in indices:
                key = _KEY.pack(i)
                txn.delete(key, db=self.meta_db)
                txn.delete(key, db=self.data_db)

    def present(self) -> np.ndarray:
        """Indices with an entry, sorted (int64; from ``meta``'s keys only, no value is read)."""
        if self.empty:
            return np.zeros(0, dtype=np.int64)
        with self.env.begin() as txn:  # big-endian u64 keys, in key order: one join, one view
            keys = b"".join(txn.cursor(db=self.meta_db).iternext(values=False))
        return np.frombuffer(keys, dtype=">u8").astype(np.int64)

    def entries(self) -> int:
        if self.empty:
            return 0
        with self.env.begin() as txn:
            return txn.stat(self.meta_db)["entries"]

    def disk_bytes(self) -> int:
        return sum(f.stat().st_blocks * 512 for f in self.path.iterdir() if f.is_file())

    def close(self) -> None:
        """Drop one reference; the environment closes with the last one."""
        self._refs -= 1
        if self._refs <= 0:
            self.env.close()
            key = (os.getpid(), os.path.abspath(os.fspath(self.path)))
            if _OPEN.get(key) is self:
                del _OPEN[key]


def _free_bytes(path: Path) -> int:
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    except OSError:
        return 0
