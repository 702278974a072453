"""What the cache needs from a source: the files of a manifest, read whole and stably.

:class:`~cachepipe.source.reader.SourceReader` reads local or NFS paths; a source of
another kind (an object store) implements this protocol in a new module here and is read
by :class:`~cachepipe.l1.raw_levels.RawLevels` the same way, with the same answers: the
bytes and the identity they were read with (NOTE [file identity]), or the ``OSError``
that made the sample unreadable (never raised: one bad file is one bad sample).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from cachepipe.source.reader import SourceFile

__all__ = ["SampleSource"]


@runtime_checkable
class SampleSource(Protocol):
    """Whole-file reads by path, in order (NOTE [stable reads], NOTE [bounded reads])."""

    def read(self, paths: list[str], expect: list[tuple[int, int, int, int]] | None = None
             ) -> list[SourceFile | OSError]:
        """One :class:`SourceFile` or ``OSError`` per path; ``expect`` is each file's
        identity in the manifest (a read that differs is retried, then returned as read)."""

    def close(self) -> None:
        """Release its threads or connections in this process."""
