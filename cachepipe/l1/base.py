"""What the cache needs from an L1: raw source-file bytes by sample index on local disk.

The LMDB mirror (:class:`~cachepipe.l1.mirror.L1Mirror`) is the implementation; another
local store (a directory of files, a different embedded database) implements these
methods and is read and filled by :class:`~cachepipe.l1.raw_levels.RawLevels` the same way.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["RawStore"]


@runtime_checkable
class RawStore(Protocol):
    """Raw bytes of source files by sample index (values verified on read).

    Attributes:
        path: where it lives, for messages.
    """

    path: object

    def get_many(self, indices: Sequence[int]) -> tuple[list[bytes | None], list[int]]:
        """The bytes of ``indices`` (``None``: absent or failed verification) and the
        indices that failed verification (counted as corrupt, then read from the source)."""

    def put_many(self, items: Sequence[tuple[int, bytes]]) -> int:
        """Store ``(index, bytes)`` pairs; returns how many were written.

        Raises:
            L1FullError: no room left.
        """

    def present(self) -> set[int]:
        """Indices held (what the warm-up need not read again)."""

    def disk_bytes(self) -> int:
        """Bytes it occupies on disk."""

    def close(self) -> None:
        """Release its handles in this process."""
