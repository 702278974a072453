"""The record of a fingerprint's corrupt files, ``<cache_dir>/<fingerprint>/corrupt.json``
(NOTE [corrupt files] in ``cachepipe/warmup.py``): written by the warm-up, read by it and
by ``cachepipe stats``."""
from __future__ import annotations

import json

from cachepipe.private_files import write_private

__all__ = ["known_corrupt", "save_corrupt"]


def _path(cache):
    return cache.l1_path.parent / "corrupt.json"


def known_corrupt(cache) -> set[int]:
    """Indices found undecodable by earlier warm-ups of this fingerprint."""
    try:
        with open(_path(cache)) as f:
            return set(json.load(f))
    except (OSError, ValueError):
        return set()


def save_corrupt(cache, indices: set[int]) -> None:
    """Replace the record with ``indices`` (atomic, private)."""
    write_private(_path(cache), json.dumps(sorted(indices)).encode())
