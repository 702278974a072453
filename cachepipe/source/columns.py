"""The flat arrays a manifest is made of, and the builder a scan fills.

NOTE [manifest columns]
A manifest of N files is seven arrays and no per-file Python object (FFCV's ``.beton``
index, litdata's ``index.json`` chunks): ``labels`` (int32), the identity columns
``sizes``, ``mtimes``, ``inos``, ``ctimes`` (64-bit, NOTE [file identity]), and the file
names as one byte blob ``names`` with ``offsets`` (uint64, N + 1): file i's path below
its class folder is ``names[offsets[i]:offsets[i + 1]]`` (``os.fsencode``, so names that
are not UTF-8 survive), and its relpath is ``<classes[label]>/<that>``. The class folder
is not repeated per file (ImageNet's ``n01440764/`` would be a sixth of the blob).
Arrays are read-only views, of a memory-mapped file for a saved manifest (NOTE
[manifest file]), so every process of a node shares one copy of the pages, fork workers
touch no reference counts, and spawn workers receive a path, not the arrays.

A scan fills a :class:`ColumnsBuilder` row by row (typed ``array`` columns of 8 bytes a
value, never an ``os.stat_result``), or by position (``set_identity``), so that a scan
with many stats in flight can write each file's identity where it belongs.
"""
from __future__ import annotations

import os
from array import array
from dataclasses import dataclass

import numpy as np

__all__ = ["Columns", "ColumnsBuilder", "IDENTITY"]

IDENTITY = ("sizes", "mtimes", "inos", "ctimes")  # NOTE [file identity], in its order
DTYPES = {"labels": np.dtype("<i4"), "sizes": np.dtype("<i8"), "mtimes": np.dtype("<i8"),
          "inos": np.dtype("<u8"), "ctimes": np.dtype("<i8"), "offsets": np.dtype("<u8"),
          "names": np.dtype("u1")}


@dataclass(frozen=True)
class Columns:
    """The arrays of NOTE [manifest columns] (read-only views or arrays of their dtypes)."""

    labels: np.ndarray
    sizes: np.ndarray
    mtimes: np.ndarray
    inos: np.ndarray
    ctimes: np.ndarray
    offsets: np.ndarray
    names: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.labels)
        for field in ("labels", *IDENTITY, "offsets", "names"):
            arr = getattr(self, field)
            if arr.dtype != DTYPES[field] or arr.ndim != 1:
                raise ValueError(f"manifest column {field} must be 1-d {DTYPES[field]}, got {arr.dtype} {arr.shape}")
        if any(len(getattr(self, f)) != n for f in IDENTITY) or len(self.offsets) != n + 1:
            raise ValueError("manifest columns disagree on the number of files")
        if int(self.offsets[0]) != 0 or int(self.offsets[-1]) != len(self.names):
            raise ValueError("manifest name offsets do not span the name blob")

    def __len__(self) -> int:
        return len(self.labels)

    def name(self, index: int) -> bytes:
        """File ``index``'s path below its class folder, as bytes."""
        return self.names[int(self.offsets[index]):int(self.offsets[index + 1])].tobytes()


class ColumnsBuilder:
    """Rows of a manifest being scanned: a name and a label per file, then its identity."""

    def __init__(self) -> None:
        self._labels = array("i")
        self._offsets = array("Q", [0])
        self._names = bytearray()
        self._identity = {f: array("Q" if f == "inos" else "q") for f in IDENTITY}  # inode numbers are unsigned
        self.devices = array("q")  # st_dev per file: racy windows are per device (NOTE [file identity])

    def add(self, name: str, label: int) -> int:
        """Append a file (``name``: its path below the class folder); returns its row."""
        self._names += os.fsencode(name)
        self._offsets.append(len(self._names))
        self._labels.append(label)
        for col in self._identity.values():
            col.append(0)
        self.devices.append(0)
        return len(self._labels) - 1

    def set_identity(self, row: int, st: os.stat_result) -> None:
        """Record ``st`` as the identity of ``row`` (NOTE [file identity])."""
        ident = self._identity
        ident["sizes"][row], ident["mtimes"][row] = st.st_size, st.st_mtime_ns
        ident["inos"][row], ident["ctimes"][row] = st.st_ino, st.st_ctime_ns
        self.devices[row] = st.st_dev

    def set_row(self, row: int, ident: tuple[int, int, int, int, int]) -> None:
        """Record ``(size, mtime_ns, inode, ctime_ns, st_dev)`` as the identity of ``row``."""
        i = self._identity
        i["sizes"][row], i["mtimes"][row], i["inos"][row], i["ctimes"][row], self.devices[row] = ident

    def columns(self) -> Columns:
        """The arrays, views of this builder's buffers (no copy on a little-endian machine);
        add nothing after this."""
        def view(buf, native, field: str) -> np.ndarray:
            return np.frombuffer(buf, dtype=native).astype(DTYPES[field], copy=False)

        return Columns(view(self._labels, np.intc, "labels"),
                       *(view(self._identity[f], self._identity[f].typecode, f) for f in IDENTITY),
                       view(self._offsets, np.uint64, "offsets"), np.frombuffer(self._names, dtype=np.uint8))
