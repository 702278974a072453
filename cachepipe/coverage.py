"""How much of a source each cache level holds (for ``cachepipe stats``); starts nothing."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import lmdb

from cachepipe.embedded import EmbeddedRedis
from cachepipe.errors import L2UnavailableError
from cachepipe.l1_guard import inspect_l1
from cachepipe.l2_store import open_store

__all__ = ["coverage"]


def coverage(cache) -> dict:
    """Coverage of ``cache`` (a :class:`~cachepipe.TwoLevelCache`) per level.

    Never starts the embedded server nor writes to the cache dir.

    Returns:
        ``source`` (root, samples, classes, bytes, fingerprint), ``l1`` (entries, percent,
        disk_bytes, path), ``l2`` (kind, present, percent, shards: per-shard memory/keys,
        error), ``other_fingerprints`` (stale namespaces in the cache dir).
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
    l2 = {"kind": "none", "present": 0, "percent": 0.0, "shards": [], "error": "",
          "namespace": cache.namespace}
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
                l2["present"] = n - len(store.missing(list(range(n))))
            except L2UnavailableError as exc:
                l2["error"] = str(exc)
            finally:
                store.close()
    l2["percent"] = 100.0 * l2["present"] / n if n else 0.0
    out["l2"] = l2
    root = Path(cfg.cache_dir)
    out["other_fingerprints"] = sorted(
        p.name for p in root.iterdir()
        if p.is_dir() and p.name != m.fingerprint and (p / "manifest.json").exists()
    ) if root.is_dir() else []
    return out
