"""Lazy sequences over a manifest's arrays: its relpaths, samples and targets.

NOTE [lazy sample lists]
torchvision's ``ImageFolder`` has ``samples`` (a list of ``(path, label)``), ``imgs`` (the
same) and ``targets`` (a list of ints), and code written for it indexes, slices, iterates,
measures and compares them. Lists of 1.28M tuples cost a rank ~750 MB and are copied into
every spawn worker (and, page by page, into fork workers as reference counts change:
torch's DataLoader docs warn of it). These sequences give the same items, built when
asked from the manifest's arrays (NOTE [manifest columns]): an index gives a tuple or an
int, a slice a list, ``==`` compares with any sequence, and ``np.asarray(targets)`` is
the int32 label column itself. They pickle as their manifest, which pickles as the path of
its file (NOTE [manifest pickles as its path] in ``source/manifest.py``). A user who
assigns a list of their own to ``ds.samples`` gets torchvision's behaviour for it.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

__all__ = ["Relpaths", "Samples", "Targets"]


class _View(Sequence):
    """A read-only sequence of one item per file of ``manifest``."""

    __slots__ = ("_m",)
    __hash__ = None  # equal to lists, so unhashable as they are

    def __init__(self, manifest) -> None:
        self._m = manifest

    def __len__(self) -> int:
        return len(self._m)

    def _item(self, index: int):
        raise NotImplementedError

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        i = int(index)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {index} out of range for {n} samples")
        return self._item(i % n)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    def __reduce__(self):
        return type(self), (self._m,)

    def __repr__(self) -> str:
        head = ", ".join(repr(x) for x in self[:3])
        return f"{type(self).__name__}([{head}{', ...' if len(self) > 3 else ''}], len={len(self)})"


class Relpaths(_View):
    """Each file's path relative to the source root."""

    __slots__ = ()

    def _item(self, index: int) -> str:
        return self._m.relpath(index)


class Samples(_View):
    """``(path, label)`` per file; the path relative to the root, or joined to ``root`` when given."""

    __slots__ = ("_root",)

    def __init__(self, manifest, root: str | None = None) -> None:
        super().__init__(manifest)
        self._root = root

    def _item(self, index: int) -> tuple[str, int]:
        rel = self._m.relpath(index)
        return (rel if self._root is None else os.path.join(self._root, rel)), int(self._m.labels[index])

    def __reduce__(self):
        return Samples, (self._m, self._root)


class Targets(_View):
    """Each file's label, an ``int``; ``np.asarray(targets)`` is the label column (no copy)."""

    __slots__ = ()

    def _item(self, index: int) -> int:
        return int(self._m.labels[index])

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._m.labels[index].tolist()
        return super().__getitem__(index)

    def __iter__(self):
        labels = self._m.labels
        for start in range(0, len(labels), 1 << 16):
            yield from labels[start:start + (1 << 16)].tolist()

    def __eq__(self, other) -> bool:
        if isinstance(other, Targets):
            return bool(np.array_equal(self._m.labels, other._m.labels))
        return super().__eq__(other)

    def __array__(self, dtype=None, copy=None):
        labels = self._m.labels
        return labels if dtype is None else labels.astype(dtype)
