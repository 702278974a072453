"""How large the L1 mirror's LMDB map must be for a source, from its file count and bytes.

NOTE [L1 map size]
LMDB keeps each value on its own pages once it exceeds about half a page (an overflow
page run rounded up to whole pages), and a leaf page split on insert leaves pages half
full, so small values take about a page each too: 100k files of 1.5 KB took ~4.3 KB an
entry, and the old sizing (2 x the bytes + 64 MiB) filled at 87,744 of them. Every entry
costs at most its bytes plus one page, plus its ``meta`` record (size and checksum) and
its share of branch pages (256 bytes is a wide margin for both); doubling that leaves
room for LMDB's copy-on-write pages and its free list. So the map is
``2 x (bytes + files x (page + 256)) + 64 MiB``: for ImageNet's 1.28M files (~140 GB)
it is ~4 % larger than 2 x the bytes. The map is address space, not disk (the file grows
as pages are written), so a generous map costs nothing. ``--l1-size`` (``l1_map_size``)
sets it instead; a full map says how much the source needs (:func:`needed_map_size`).
"""
from __future__ import annotations

import mmap

__all__ = ["l1_disk_bytes", "needed_map_size"]

_ENTRY_OVERHEAD = 256
_SLACK = 64 << 20


def l1_disk_bytes(files: int, total_bytes: int) -> int:
    """Disk an L1 of ``files`` entries of ``total_bytes`` in all takes, at most (NOTE [L1 map size])."""
    return total_bytes + files * (mmap.PAGESIZE + _ENTRY_OVERHEAD)


def needed_map_size(files: int, total_bytes: int) -> int:
    """The LMDB map size for ``files`` entries of ``total_bytes`` in all (NOTE [L1 map size]).

    Example:
        >>> needed_map_size(0, 0) == 64 << 20
        True
    """
    return 2 * l1_disk_bytes(files, total_bytes) + _SLACK
