"""Namespaces of older versions of a source: find them, count their L2 keys, drop them.

NOTE [stale namespaces]
Every change to a source gives it a new fingerprint and a fresh namespace (NOTE [changed
files]). The old namespace's directory (L1 mirror, manifest, corrupt record) and its L2
keys stay: under ``noeviction`` those keys keep their memory, so the warm-up of the new
version finds L2 full of samples nobody reads. A fingerprint is *stale for a source* when
the cache dir holds its manifest with the source's root and it is not the source's
current fingerprint; only those are dropped unasked (another source sharing the cache dir,
such as the ``val`` split next to ``train``, is never touched). :func:`drop` deletes their
L2 keys (``SCAN MATCH <prefix>:<fingerprint>:*`` and ``UNLINK`` on every shard, every
cached size) and their directory. A fingerprint whose manifest is not here (its
directory removed by hand, or only another node's) is never guessed at: name it
(``fingerprints=``, ``cachepipe drop --fingerprint``) to drop its L2 keys. The embedded
server is never started for this: when it is not running, its keys are gone already.
"""
from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path

from cachepipe.coverage import running_l2
from cachepipe.l2.registry import open_store
from cachepipe.source.manifest_file import read_root

__all__ = ["drop", "stale_fingerprints", "stale_l2_keys"]

_FINGERPRINT = re.compile(r"[0-9a-f]{16}")


def stale_fingerprints(cache) -> list[str]:
    """Fingerprints of older versions of ``cache``'s source in its cache dir (NOTE [stale namespaces])."""
    root = Path(cache.config.cache_dir)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and _FINGERPRINT.fullmatch(p.name) and p.name != cache.fingerprint
                  and read_root(p) == cache.manifest.root)  # the header alone, never the arrays


def _store(cache):
    urls, _ = running_l2(cache.config)
    if not urls:
        return None
    return open_store(urls, cache.namespace, Counter(), replicas=cache.config.replicas, timeout=cache.config.timeout)


def stale_l2_keys(cache, fingerprints: list[str] | None = None) -> int:
    """L2 keys held by ``fingerprints`` (default: the stale ones) on the running shards.

    Raises:
        L2UnavailableError: a shard cannot be reached or refuses ``SCAN``.
    """
    fingerprints = stale_fingerprints(cache) if fingerprints is None else fingerprints
    store = _store(cache) if fingerprints else None
    if store is None:
        return 0
    try:
        return sum(1 for fp in fingerprints for _ in store.scan(f"{cache.config.prefix}:{fp}:*"))
    finally:
        store.close()


def drop(cache, fingerprints: list[str] | None = None, *, dry_run: bool = False) -> dict:
    """Drop namespaces: their L2 keys on every shard and their directory in the cache dir.

    Args:
        cache: a :class:`~cachepipe.TwoLevelCache` of the source (its fingerprint is kept).
        fingerprints: what to drop (default: :func:`stale_fingerprints`).
        dry_run: count, delete nothing.

    Returns:
        ``fingerprints``, ``l2_keys`` (deleted, or found with ``dry_run``), ``dirs``
        (directories removed, or found).

    Raises:
        ValueError: a malformed fingerprint, or the current one.
        L2UnavailableError: a shard cannot be reached or refuses a command.
    """
    fingerprints = stale_fingerprints(cache) if fingerprints is None else list(fingerprints)
    for fp in fingerprints:
        if not _FINGERPRINT.fullmatch(fp):
            raise ValueError(f"fingerprint {fp!r} is not 16 hex digits (cachepipe stats lists them)")
        if fp == cache.fingerprint:
            raise ValueError(f"fingerprint {fp} is the source's current one; only older ones are dropped")
    dirs = [Path(cache.config.cache_dir) / fp for fp in fingerprints]
    dirs = [d for d in dirs if d.is_dir()]
    if dry_run:
        return {"fingerprints": fingerprints, "l2_keys": stale_l2_keys(cache, fingerprints),
                "dirs": [str(d) for d in dirs]}
    store = _store(cache) if fingerprints else None
    keys = 0
    try:
        for fp in fingerprints if store is not None else []:
            keys += store.drop(f"{cache.config.prefix}:{fp}:*")
    finally:
        if store is not None:
            store.close()
    for d in dirs:
        shutil.rmtree(d)
    return {"fingerprints": fingerprints, "l2_keys": keys, "dirs": [str(d) for d in dirs]}
