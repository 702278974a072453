"""Will the work fit? Estimate L2 memory per shard and L1 disk space before writing.

NOTE [L2 sizing]
The decoded size of a sample depends on its aspect ratio, which only its header tells.
The estimate reads the headers of up to 32 samples to be written (Pillow reads only the
header), applies the resize policy, and adds Redis' per-key overhead (~96 bytes + key).
Needed memory on a shard = samples it must receive x that average x 1.05; it must fit in
``maxmemory - used_memory`` (or in the machine's memory when maxmemory is 0).
"""
from __future__ import annotations

import io
import os
import shutil

import numpy as np
from PIL import Image

from cachepipe.decode import resized_shape
from cachepipe.l2.codec import encoded_size
from cachepipe.source.reader import open_regular

__all__ = ["L2_MARGIN", "estimate_sample_bytes", "format_bytes", "key_bytes", "l2_fitting", "l2_shortfalls",
           "check_l1_space"]

_KEY_OVERHEAD = 96
_SAMPLE = 32
L2_MARGIN = 1.05  # NOTE [L2 sizing]: needed memory = samples x their average bytes x this


def key_bytes(namespace: str) -> int:
    """What a sample costs in Redis beside its value: the per-key overhead and the key
    (``namespace`` + the index) (NOTE [L2 sizing])."""
    return _KEY_OVERHEAD + len(namespace) + 8


def estimate_sample_bytes(cache, indices: list[int], *, keep: bool = False) -> int:
    """Average bytes one sample of ``indices`` takes in Redis (header + pixels + key overhead).
    With ``keep`` (a warm-up in this process) the samples L1 lacks are read whole and kept
    for the warm-up's own read of them (:meth:`~cachepipe.l1.raw_levels.RawLevels.peek`:
    one read of each file per job); otherwise only their headers are read."""
    if not len(indices):
        return 0
    rng = np.random.default_rng(0)
    pick = sorted(rng.choice(indices, size=min(_SAMPLE, len(indices)), replace=False).tolist())
    cached = cache.l1.get_many(pick)[0] if cache.l1 is not None else [None] * len(pick)
    absent = [i for i, data in zip(pick, cached) if data is None]
    cache._open()
    got = dict(zip(absent, cache._raw.peek(absent))) if absent and keep else {}
    cached = [got[i].data if getattr(got.get(i), "data", None) is not None else data for i, data in zip(pick, cached)]
    sizes = []
    for i, data in zip(pick, cached):
        try:  # Pillow reads only the header; no level is filled here; never a FIFO (NOTE [bounded reads])
            with (io.BytesIO(data) if data is not None else open_regular(cache.manifest.path(i))) as f, \
                    Image.open(f) as img:
                h, w = resized_shape(img.height, img.width, cache.config.cache_size)
            sizes.append(encoded_size(h, w))
        except Exception:  # corrupt files are reported by the warm-up itself
            continue
    if not sizes:
        side = cache.config.cache_size
        sizes = [encoded_size(side, side)]
    return int(np.mean(sizes)) + key_bytes(cache.namespace)


def _limit(row: dict) -> int:
    return row["maxmemory"] or row.get("system_memory", 0)


def _counts(store, info: list[dict], indices: list[int]) -> list[int]:
    owners = store.owners(indices)  # None: the store spreads keys evenly itself (a cluster)
    if owners is not None:
        return np.bincount(owners.ravel(), minlength=len(info)).tolist()
    return [-(-len(indices) // max(1, len(info)))] * len(info)


def l2_shortfalls(store, indices: list[int], per_sample: int) -> list[str]:
    """One message per shard that cannot take its share of ``indices`` (empty: fits)."""
    info = store.shard_info()
    problems = []
    for row, count in zip(info, _counts(store, info, indices)):
        if not row["reachable"] or count == 0 or not _limit(row):
            continue
        need = int(count * per_sample * L2_MARGIN)
        limit = _limit(row)
        free = limit - row["used_memory"]
        if need > free:
            problems.append(
                f"L2 shard {row['url']} is too small: {count} samples need ~{need / 2**20:.1f} MiB "
                f"(~{per_sample / 1024:.0f} KiB each) but only {max(free, 0) / 2**20:.1f} MiB of "
                f"{limit / 2**20:.1f} MiB is free; it needs maxmemory >= "
                f"{-(-(row['used_memory'] + need) // 2**20)}mb (--l2-memory for the embedded "
                f"server), or more shards")
    return problems


def l2_fitting(store, indices: list[int], per_sample: int) -> list[int]:
    """The fixed subset of ``indices`` that L2 has room for (NOTE [fixed L2 subset]):
    each shard takes its samples in the order of ``indices`` while its free memory lasts
    (a sample with replicas needs room on all its shards)."""
    info = store.shard_info()
    # a write needs room for its value twice while Redis holds it in the query buffer too
    room = [None if not _limit(row) else
            max(0, int((_limit(row) - row["used_memory"] - per_sample) / (per_sample * L2_MARGIN)))
            if row["reachable"] else 0 for row in info]
    placed = store.owners(indices)
    if placed is None:  # a store that spreads keys evenly itself (a cluster)
        known = [r for r in room if r is not None]
        return list(indices) if not known else list(indices)[:min(known) * len(room)]
    keep = []
    for i, owners in zip(indices, placed.tolist()):
        if all(room[s] is None or room[s] > 0 for s in owners):
            for s in owners:
                if room[s] is not None:
                    room[s] -= 1
            keep.append(i)
    return keep


def check_l1_space(path: str | os.PathLike, need_bytes: int) -> str | None:
    """A message when the disk holding ``path`` has less than ``need_bytes`` (+5 %) free."""
    probe = os.fspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe) or "."
    free = shutil.disk_usage(probe).free
    need = int(need_bytes * 1.05)
    if need > free:
        return f"L1 needs ~{format_bytes(need)} on the disk of {path} but only {format_bytes(free)} is free"
    return None


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps the figure at least 1 (``412 KiB``,
    ``1.50 GiB``, ``3 B``): a small cache on a nearly full disk reads "~412 KiB ... 96.0 KiB
    is free", not "~0.00 GiB ... 0.00 GiB"."""
    value, unit = float(n), 0
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    while abs(value) >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    if unit == 0:
        return f"{int(value)} B"
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{digits}f} {units[unit]}"
