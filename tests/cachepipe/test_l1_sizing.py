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


@pytest.mark.parametrize("n, text", [(3, "3 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (421_000, "411 KiB"),
                                     (96 * 1024, "96.0 KiB"), (1.5 * 2**30, "1.50 GiB"), (5 * 2**40, "5.00 TiB")])
def test_sizes_read_in_the_unit_that_fits(n, text):
    from cachepipe.capacity import format_bytes

    assert format_bytes(n) == text


def test_a_small_l1_on_a_nearly_full_disk_says_kib_not_zero_gib(tmp_path, monkeypatch):
    from collections import namedtuple

    from cachepipe import capacity

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(capacity.shutil, "disk_usage", lambda _: usage(2**30, 2**30 - 96 * 1024, 96 * 1024))
    msg = capacity.check_l1_space(tmp_path / "l1", 400 * 1024)
    assert msg == f"L1 needs ~420 KiB on the disk of {tmp_path / 'l1'} but only 96.0 KiB is free"
    assert "0.00" not in msg
