"""How much of a source each cache level holds (for ``cachepipe stats`` and the warm-up's
report); starts nothing.

NOTE [evicting shards]
A shard whose ``maxmemory-policy`` is ``allkeys-*`` (lru, lfu, random) makes room for a
write by evicting other keys, cached samples included, and refuses nothing: the warm-up's
own count (present before + written) then overstates L2, and each warm-up or training
write-back evicts what the last one wrote, so coverage shrinks run after run. cachepipe
asks for ``noeviction`` (NOTE [fixed L2 subset]); with an evicting shard the warm-up warns
once per shard and process and counts the samples really present afterwards (one
pipelined ``EXISTS`` pass over the partition). ``volatile-*`` policies evict only keys
with a TTL, which cachepipe never sets, so they behave as ``noeviction`` here.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import warnings

import lmdb
import numpy as np

from cachepipe.decode import DECODER_TAG
from cachepipe.errors import CacheWarning, L2UnavailableError
from cachepipe.l1.corrupt_record import known_corrupt
from cachepipe.l1.guard import inspect_l1
from cachepipe.l2.registry import open_store
from cachepipe.l2.store import glob_escape, namespace
from cachepipe.server.embedded_group import EmbeddedGroup
from cachepipe.source.manifest_file import read_root

__all__ = ["coverage", "evicting_shards", "l2_used", "running_l2", "warm_coverage"]

_WARNED: set[str] = set()  # shards warned about (NOTE [evicting shards])


def coverage(cache, sizes: Sequence[int] | None = None) -> dict:
    """Coverage of ``cache`` (a :class:`~cachepipe.TwoLevelCache`) per level.

    Never starts the embedded server nor writes to the cache dir. L2 is scanned once
    (``SCAN MATCH <prefix>:<fingerprint>:*`` on every shard), which finds every cached size.

    Args:
        sizes: the cached sizes to report (also those with nothing in L2); ``None``: every
            size found in L2.

    Returns:
        ``source`` (root, samples, classes, bytes, fingerprint), ``l1`` (entries, percent,
        disk_bytes, path), ``l2`` (kind, shards: per-shard memory/keys, error, ``sizes``:
        per cached size ``size``, ``namespace``, ``present`` (samples with a copy in L2),
        ``known_corrupt`` (files the warm-up recorded as corrupt: never in L2), ``percent``
        (of the samples that are not known corrupt), ``partial`` (``{node: samples left out}`` when warm-up left L2 a
        fixed subset, NOTE [fixed L2 subset])), ``other_fingerprints`` (stale namespaces
        in the cache dir).
    """
    m = cache.manifest
    n = len(m)
    cfg = cache.config
    out = {"source": {"root": m.root, "samples": n, "classes": len(m.classes),
                      "bytes": m.total_bytes, "fingerprint": m.fingerprint}}
    l1 = {"path": str(cache.l1_path), "entries": 0, "percent": 0.0, "disk_bytes": 0, "error": ""}
    if cfg.use_l1 and (cache.l1_path / "data.mdb").exists():
        mirror, problem = inspect_l1(cache.l1_path)  # read-only, writes nothing (NOTE [L1 guard])
        if mirror is None:
            l1["error"] = f"unusable: {problem} (reads bypass it; the next warm-up moves it aside)"
        else:
            try:  # an L1 is one fingerprint's, so its keys are sample indices: the count is its coverage
                l1.update(entries=mirror.entries(), disk_bytes=mirror.disk_bytes())
            except lmdb.Error as exc:
                l1["error"] = f"unreadable: {type(exc).__name__}: {exc}"
            finally:
                mirror.close()
    l1["percent"] = 100.0 * l1["entries"] / n if n else 0.0
    out["l1"] = l1
    l2 = {"kind": cfg.l2.kind, "shards": [], "error": "", "sizes": []}
    if cfg.l2.enabled:
        urls, l2["error"] = running_l2(cfg)
        if urls:
            store = open_store(urls, cache.namespace, Counter(), replicas=cfg.replicas,
                               timeout=cfg.timeout)
            try:
                l2["shards"] = store.shard_info()
                l2["sizes"] = _sizes(cache, store, urls, sizes)
            except L2UnavailableError as exc:
                l2["error"] = str(exc)
            finally:
                store.close()
    if sizes and not l2["sizes"] and not l2["shards"]:  # no L2 (or not running): the sizes asked for, empty
        l2["sizes"] = [_row(cache, size, 0, {}, _known_corrupt_count(cache)) for size in sizes]
    out["l2"] = l2
    root = Path(cfg.cache_dir)
    out["other_fingerprints"] = sorted(
        p.name for p in root.iterdir()
        if p.is_dir() and p.name != m.fingerprint and read_root(p) is not None
    ) if root.is_dir() else []
    return out


def running_l2(cfg) -> tuple[list[str], str]:
    """The L2 URLs of a :class:`~cachepipe.CacheConfig` without starting anything, and why
    there are none: of the embedded servers, those that run (a server's keys die with it).

    A recorded server that is down (a ``redis-N/`` left by a run with more servers) holds
    no key and is left out; the others are still read (issue 46, item 4). One that runs
    but does not answer (busy, stopped) holds keys: it is kept, so that reading it fails
    loudly instead of its keys being taken for absent.
    """
    if not cfg.l2.is_embedded:
        return list(cfg.l2.urls), ""
    servers = EmbeddedGroup.found(cfg.cache_dir).servers
    running = [s.url for s in servers if s.ping() or s.identity() is not None]
    if running:
        return running, ""
    return [], f"embedded server not running (socket {servers[0].socket_path})"


def _known_corrupt_count(cache) -> int:
    n = len(cache.manifest)
    return sum(1 for i in known_corrupt(cache) if i < n)  # NOTE [corrupt files]: never cached


def _row(cache, size: int, present: int, partial: dict, bad: int) -> dict:
    n = len(cache.manifest)
    return {"size": size, "namespace": namespace(cache.config.prefix, cache.fingerprint, size),
            "present": present, "known_corrupt": bad, "percent": 100.0 * present / (n - bad) if n > bad else 0.0,
            "partial": partial}


def _sizes(cache, store, urls: list[str], sizes: Sequence[int] | None) -> list[dict]:
    """One row per cached size, from one scan of this source's keys on every shard."""
    n = len(cache.manifest)
    base = f"{cache.config.prefix}:{cache.fingerprint}:".encode()
    cut = len(base)
    tag = DECODER_TAG.encode()  # keys of another decoder are never read (NOTE [decoder tag])
    found: dict[bytes, list[int]] = {}
    for key in store.scan(glob_escape(base.decode()) + "*"):  # linear: one append per key, one array per size
        parts = key[cut:].split(b":")  # <size>:<decoder tag>:<index>
        if len(parts) == 3 and parts[1] == tag and parts[2].isdigit():
            found.setdefault(parts[0], []).append(int(parts[2]))
    present: dict[int, np.ndarray] = {}
    for size, idx in found.items():
        if size.isdigit():
            idx = np.asarray(idx, dtype=np.int64)
            mask = present.setdefault(int(size), np.zeros(n, dtype=bool))
            mask[idx[idx < n]] = True  # replicas give a key twice: counted once
    bad = _known_corrupt_count(cache)
    rows = []
    for size in (sorted(present) if sizes is None else sizes):
        ns = open_store(urls, namespace(cache.config.prefix, cache.fingerprint, size), Counter(),
                        replicas=cache.config.replicas, timeout=cache.config.timeout)
        try:
            partial = ns.partial()
        finally:
            ns.close()
        mask = present.get(size)
        rows.append(_row(cache, size, int(mask.sum()) if mask is not None else 0, partial, bad))
    return rows


def l2_used(cache) -> int:
    """Memory used by the reachable L2 shards together (0 without L2)."""
    if cache.store is None:
        return 0
    return sum(row["used_memory"] for row in cache.store.shard_info() if row["reachable"])


def evicting_shards(store) -> list[str]:
    """The shards of ``store`` (``None``: no L2) whose policy evicts cached samples; warns
    once per shard and process (NOTE [evicting shards])."""
    rows = [r for r in (store.shard_info() if store is not None else []) if r["policy"].startswith("allkeys-")]
    for row in rows:
        if row["url"] not in _WARNED:
            _WARNED.add(row["url"])
            warnings.warn(f"L2 shard {row['url']} uses maxmemory-policy {row['policy']}: Redis evicts cached "
                          f"samples to make room for new ones, so coverage shrinks as the shard fills (every "
                          f"warm-up and training epoch); the warm-up counts the samples really present. Set "
                          f"maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction) to keep a fixed "
                          f"subset", CacheWarning, stacklevel=3)
    return [r["url"] for r in rows]


def warm_coverage(cache, report: dict, part: list[int], missing: int, left_out: int, not_samples: set[int],
                  evicting: list[str]) -> dict:
    """``l2_cached``, ``l2_uncached`` and ``l2_coverage`` of the partition after a warm-up
    (NOTE [fixed L2 subset]): uncached are the samples left out for lack of room, before
    writing or refused while writing; ``not_samples`` (corrupt, unreadable or changed
    files) count in neither. With ``evicting`` shards the samples present are counted
    afresh (NOTE [evicting shards]).

    Args:
        report: the warm-up's counts (``l2_written``, ``l2_full``).
        part: the partition; ``missing``: how many of it lacked a value before the run;
        ``left_out``: how many of those were not attempted for lack of room.
    """
    if cache.store is None:
        return {"l2_cached": 0, "l2_uncached": 0, "l2_coverage": 0.0}
    if evicting:
        absent = set(cache.store.missing(part))
        cached, uncached = len(part) - len(absent), len(absent - not_samples)
    else:
        cached = len(part) - missing + report["l2_written"]
        uncached = left_out + report["l2_full"]
    return {"l2_cached": cached, "l2_uncached": uncached,
            "l2_coverage": cached / (cached + uncached) if cached + uncached else 1.0}
