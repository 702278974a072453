"""The small base classes of the levels: the LMDB mirror is an L1 ``RawStore``, the file
reader a ``SampleSource``, and ``RawLevels`` reads through whichever source it is given."""
from __future__ import annotations

from collections import Counter

from cachepipe.l1.base import RawStore
from cachepipe.l1.mirror import L1Mirror
from cachepipe.l1.raw_levels import RawLevels
from cachepipe.source.base import SampleSource
from cachepipe.source.manifest import Manifest
from cachepipe.source.reader import SourceReader


class LoggedSource:
    """A source that reads the files and keeps the list of paths it was asked for."""

    def __init__(self) -> None:
        self.files, self.asked = SourceReader(threads=2), []

    def read(self, paths, expect=None):
        self.asked += paths
        return self.files.read(paths, expect)

    def close(self) -> None:
        self.files.close()


def test_the_implementations_fit_their_protocols(tmp_path):
    mirror = L1Mirror(tmp_path / "l1", map_size=1 << 20)
    try:
        assert isinstance(mirror, RawStore) and isinstance(SourceReader(), SampleSource)
        assert isinstance(LoggedSource(), SampleSource) and not isinstance(object(), SampleSource)
    finally:
        mirror.close()


def test_raw_levels_fill_l1_from_the_source_they_are_given(source, tmp_path):
    manifest = Manifest.scan(source)
    mirror, given = L1Mirror(tmp_path / "l1", map_size=1 << 24), LoggedSource()
    levels = RawLevels(manifest, mirror, Counter(), source=given)
    try:
        first = levels.read([0, 3, 5])
        assert given.asked == [manifest.path(i) for i in (0, 3, 5)]
        assert all(first[i] == open(manifest.path(i), "rb").read() for i in (0, 3, 5))
        assert levels.read([0, 3, 5]) == first and len(given.asked) == 3  # from L1 now
        assert levels.counters["l1_hits"] == 3 and levels.counters["source_reads"] == 3
    finally:
        levels.close()
        mirror.close()
