"""Check an LMDB data file before mapping it: a truncated file would kill the reader
with SIGBUS on the first access past its end, garbage gives ``lmdb.InvalidError``.

NOTE [LMDB header check]
``data.mdb`` starts with two meta pages (page 0 and page 1). After the 16-byte page
header each holds ``magic u32 (0xBEEFC0DE) | version u32 | address u64 | mapsize u64 |
free db (48 bytes; its first u32 is the page size) | main db (48 bytes) | last_pg u64 |
txnid u64``. The meta with the higher txnid is the committed state; every page up to its
``last_pg`` must lie inside the file. A file that fails this is reported, never mapped.
"""
from __future__ import annotations

import os
import struct

__all__ = ["data_file_problem"]

_MAGIC, _VERSION = 0xBEEFC0DE, 1
_HEAD = struct.Struct("<II")      # magic, version at offset 16
_PSIZE = struct.Struct("<I")      # free db md_pad at offset 40
_TAIL = struct.Struct("<QQ")      # last_pg, txnid at offset 136
_META_BYTES = 152


def _meta(buf: bytes) -> tuple[int, int, int] | None:
    """``(page_size, last_pg, txnid)`` of one meta page, ``None`` if it is not one."""
    if len(buf) < _META_BYTES:
        return None
    magic, version = _HEAD.unpack_from(buf, 16)
    if magic != _MAGIC or version != _VERSION:
        return None
    psize = _PSIZE.unpack_from(buf, 40)[0]
    last_pg, txnid = _TAIL.unpack_from(buf, 136)
    return psize, last_pg, txnid


def data_file_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with an LMDB ``data.mdb``, or ``None`` when it is safe to map.

    A missing or empty file is fine (LMDB initializes it).

    Raises:
        OSError: the file cannot be read at all (permissions, EIO).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return None
        first = f.read(_META_BYTES)
        meta0 = _meta(first)
        if meta0 is None:
            return f"not an LMDB file (bad magic or version in its header, {size} bytes)"
        psize = meta0[0]
        if psize < 512 or psize > 1 << 16 or psize & (psize - 1):
            return f"bad page size {psize} in its header"
        if size < 2 * psize:
            return f"truncated to {size} bytes (smaller than its two {psize}-byte meta pages)"
        f.seek(psize)
        meta1 = _meta(f.read(_META_BYTES))
    best = max((m for m in (meta0, meta1) if m is not None), key=lambda m: m[2])
    need = (best[1] + 1) * psize
    if size < need:
        return f"truncated to {size} bytes; its last commit needs {need} bytes"
    return None


# LMDB's lock file for the default 126 readers is ~8 KiB; a larger file only adds slots.
LOCK_BYTES = 64 << 10


def reserve_lock_file(path: str | os.PathLike) -> None:
    """Give ``<env>/lock.mdb`` real blocks before LMDB maps it.

    LMDB extends the lock file with ``ftruncate`` (a sparse file) and writes it through
    ``mmap``: on a full disk the first write to an unbacked page is SIGBUS, not an error.

    Raises:
        OSError: ``ENOSPC`` when the disk cannot hold it.
    """
    fd = os.open(os.path.join(path, "lock.mdb"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, max(LOCK_BYTES, os.fstat(fd).st_size))
    finally:
        os.close(fd)


def lock_file_backed(path: str | os.PathLike) -> bool:
    """Whether ``<env>/lock.mdb`` exists, may be written, and has every block allocated."""
    lock = os.path.join(path, "lock.mdb")
    try:
        st = os.stat(lock)
    except OSError:
        return False
    return os.access(lock, os.W_OK) and st.st_blocks * 512 >= st.st_size
