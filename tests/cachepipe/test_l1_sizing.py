"""NOTE [L1 map size]: small files take a page each in LMDB; the map is sized for it."""
from __future__ import annotations

import pytest

from cachepipe import L1FullError
from cachepipe.l1.mirror import L1Mirror
from cachepipe.l1.sizing import l1_disk_bytes, needed_map_size


def _fill(path, map_size: int, n: int, size: int, wanted: tuple[int, int] | None = None) -> int:
    l1 = L1Mirror(path, map_size)
    l1.wanted = wanted
    value = bytes(size)
    try:
        for start in range(0, n, 64):
            l1.put_many([(i, value) for i in range(start, min(n, start + 64))])
        return l1.entries()
    finally:
        l1.close()


def test_small_files_fit_the_map_sized_from_their_count(tmp_path):
    n, size = 20_000, 1_500
    with pytest.raises(L1FullError):  # the old rule, 2 x the bytes (without its 64 MiB of slack)
        _fill(tmp_path / "old", 2 * n * size, n, size)
    assert _fill(tmp_path / "new", 2 * l1_disk_bytes(n, n * size), n, size) == n
    assert needed_map_size(n, n * size) == 2 * l1_disk_bytes(n, n * size) + (64 << 20)


def test_full_map_says_how_much_the_source_needs(tmp_path):
    with pytest.raises(L1FullError, match=r"the source's 5000 entries need about \d+ MiB.*--l1-size \d+mb"):
        _fill(tmp_path / "l1", 1 << 20, 5_000, 1_500, wanted=(5_000, needed_map_size(5_000, 5_000 * 1_500)))
