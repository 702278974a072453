"""How much of a source each cache level holds (for ``cachepipe stats``); starts nothing."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import lmdb
import numpy as np

from cachepipe.decode import DECODER_TAG
from cachepipe.embedded import EmbeddedRedis
from cachepipe.errors import L2UnavailableError
from cachepipe.l1_guard import inspect_l1
from cachepipe.l2_registry import open_store
from cachepipe.l2_store import namespace
from cachepipe.warmup import known_corrupt

__all__ = ["coverage"]


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
            try:
                present = mirror.present()
                l1.update(entries=sum(1 for i in present if i < n), disk_bytes=mirror.disk_bytes())
            except lmdb.Error as exc:
                l1["error"] = f"unreadable: {type(exc).__name__}: {exc}"
            finally:
                mirror.close()
    l1["percent"] = 100.0 * l1["entries"] / n if n else 0.0
    out["l1"] = l1
    l2 = {"kind": "none", "shards": [], "error": "", "sizes": []}
    if cfg.redis is not False:
        urls = list(cfg.redis or [])
        l2["kind"] = "embedded" if cfg.redis is None else ("cluster" if urls[0].startswith(
            "redis-cluster://") else "shards")
        if cfg.redis is None:
            server = EmbeddedRedis(cfg.cache_dir)
            if server.ping():
                urls = [server.url]
            else:
                l2["error"] = f"embedded server not running (socket {server.socket_path})"
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
    if sizes and not l2["sizes"]:  # no L2, or it cannot be read: the sizes asked for, empty
        l2["sizes"] = [_row(cache, size, 0, {}) for size in sizes]
    out["l2"] = l2
    root = Path(cfg.cache_dir)
    out["other_fingerprints"] = sorted(
        p.name for p in root.iterdir()
        if p.is_dir() and p.name != m.fingerprint and (p / "manifest.json").exists()
    ) if root.is_dir() else []
    return out


def _row(cache, size: int, present: int, partial: dict) -> dict:
    n = len(cache.manifest)
    bad = sum(1 for i in known_corrupt(cache) if i < n)  # NOTE [corrupt files]: never cached
    return {"size": size, "namespace": namespace(cache.config.prefix, cache.fingerprint, size),
            "present": present, "known_corrupt": bad, "percent": 100.0 * present / (n - bad) if n > bad else 0.0,
            "partial": partial}


def _sizes(cache, store, urls: list[str], sizes: Sequence[int] | None) -> list[dict]:
    """One row per cached size, from one scan of this source's keys on every shard."""
    n = len(cache.manifest)
    base = f"{cache.config.prefix}:{cache.fingerprint}:".encode()
    tag = DECODER_TAG.encode()  # keys of another decoder are never read (NOTE [decoder tag])
    present: dict[int, np.ndarray] = {}
    for key in store.scan(base.decode() + "*"):
        parts = key[len(base):].split(b":")  # <size>:<decoder tag>:<index>
        if len(parts) == 3 and parts[1] == tag and parts[0].isdigit() and parts[2].isdigit() \
                and int(parts[2]) < n:
            present.setdefault(int(parts[0]), np.zeros(n, dtype=bool))[int(parts[2])] = True
    rows = []
    for size in (sorted(present) if sizes is None else sizes):
        ns = open_store(urls, namespace(cache.config.prefix, cache.fingerprint, size), Counter(),
                        replicas=cache.config.replicas, timeout=cache.config.timeout)
        try:
            partial = ns.partial()
        finally:
            ns.close()
        found = present.get(size)
        rows.append(_row(cache, size, int(found.sum()) if found is not None else 0, partial))
    return rows
