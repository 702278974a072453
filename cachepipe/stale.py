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
cached size; the prefix glob-escaped, so ``exp[1]`` never matches ``exp1``) and their
directory. A fingerprint whose manifest is not here (its directory removed by hand, or
only another node's) is never guessed at: name it (``fingerprints=``, ``cachepipe drop
--fingerprint``) to drop its L2 keys. A named fingerprint is refused when it is the
source's current one, when its manifest here names another root, or when it is the
current one of another source here (its pointer in ``sources/``): another source's
namespace is dropped only by naming that source. Everything is checked before anything
is deleted (issue 46, items 1, 3 and 15): the fingerprints, each directory (a real
directory, not a link; writable, with everything in it), its lease (NOTE [namespace
lease]: a namespace in use is refused) and the shards (``SCAN`` answers); then the L2
keys go, then the directories. The embedded server is never started for this: when it is
not running, its keys are gone already.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path

from cachepipe.coverage import running_l2
from cachepipe.l2.registry import open_store
from cachepipe.l2.store import glob_escape
from cachepipe.lease import release_lease, take_exclusive
from cachepipe.private_files import check_not_link
from cachepipe.source.manifest_file import read_root

__all__ = ["NamespaceError", "drop", "namespace_match", "stale_fingerprints", "stale_l2_keys"]

_FINGERPRINT = re.compile(r"[0-9a-f]{16}")


class NamespaceError(OSError):
    """A namespace directory that cannot be removed (read-only, a link, not a directory):
    refused before anything was deleted."""


def namespace_match(prefix: str, fingerprint: str) -> str:
    """The ``SCAN MATCH`` glob of every key of ``fingerprint`` under ``prefix`` (every cached
    size), the prefix escaped (NOTE [stale namespaces])."""
    return f"{glob_escape(prefix)}:{glob_escape(fingerprint)}:*"


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
        return sum(1 for fp in fingerprints for _ in store.scan(namespace_match(cache.config.prefix, fp)))
    finally:
        store.close()


def _current_of_others(cache) -> dict[str, str]:
    """``{fingerprint: root}`` of the other sources' current versions (their pointers)."""
    out = {}
    for pointer in sorted((Path(cache.config.cache_dir) / "sources").glob("*.json")):
        try:
            ptr = json.loads(pointer.read_text())
            root, fp = str(ptr["root"]), str(ptr["fingerprint"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if root != cache.manifest.root:
            out[fp] = root
    return out


def _check_fingerprints(cache, fingerprints: list[str]) -> None:
    """Raise ``ValueError`` for a fingerprint ``drop`` must not touch (NOTE [stale namespaces])."""
    others = _current_of_others(cache)
    for fp in fingerprints:
        if not _FINGERPRINT.fullmatch(fp):
            raise ValueError(f"fingerprint {fp!r} is not 16 hex digits (cachepipe stats lists them)")
        if fp == cache.fingerprint:
            raise ValueError(f"fingerprint {fp} is the source's current one; only older ones are dropped")
        if fp in others:
            raise ValueError(f"fingerprint {fp} is the current one of another source, {others[fp]}; nothing "
                             f"was dropped")
        root = read_root(Path(cache.config.cache_dir) / fp)
        if root is not None and root != cache.manifest.root:
            raise ValueError(f"fingerprint {fp} is a namespace of another source, {root}; nothing was dropped "
                             f"(drop it with cachepipe drop {root} --fingerprint {fp})")


def _check_removable(directory: Path) -> None:
    """Raise :class:`NamespaceError` unless ``directory`` and everything in it can be deleted."""
    try:
        check_not_link(directory)
    except PermissionError as exc:
        raise NamespaceError(f"cannot drop {directory}: {exc}; nothing was dropped") from None
    if not directory.is_dir():
        raise NamespaceError(f"cannot drop {directory}: not a directory; nothing was dropped")
    walked = [parent for parent, _, _ in os.walk(directory)]  # links inside are unlinked, never followed
    for d in [str(directory.parent), *walked]:
        if not os.access(d, os.W_OK | os.X_OK):
            why = "on a read-only file system" if _read_only(d) else "not writable by this user"
            raise NamespaceError(f"cannot drop {directory}: {d} is {why}; nothing was dropped")


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def drop(cache, fingerprints: list[str] | None = None, *, dry_run: bool = False) -> dict:
    """Drop namespaces: their L2 keys on every shard and their directory in the cache dir.

    Everything is checked before anything is deleted (NOTE [stale namespaces]).

    Args:
        cache: a :class:`~cachepipe.TwoLevelCache` of the source (its fingerprint is kept).
        fingerprints: what to drop (default: :func:`stale_fingerprints`).
        dry_run: check and count, delete nothing.

    Returns:
        ``fingerprints``, ``l2_keys`` (deleted, or found with ``dry_run``), ``dirs``
        (directories removed, or found).

    Raises:
        ValueError: a malformed fingerprint, the current one, another source's.
        NamespaceError: a directory that cannot be removed (read-only, a link).
        NamespaceInUseError: a namespace a running process of this node uses (NOTE [namespace lease]).
        L2UnavailableError: a shard cannot be reached or refuses a command.
    """
    fingerprints = stale_fingerprints(cache) if fingerprints is None else list(fingerprints)
    _check_fingerprints(cache, fingerprints)
    base = Path(cache.config.cache_dir)
    dirs = [base / fp for fp in fingerprints if os.path.lexists(base / fp)]
    for d in dirs:
        _check_removable(d)
    leases = []
    try:
        for d in dirs:  # held until the directory is gone: no run opens it half-dropped
            leases.append(take_exclusive(d, d.name))
        keys = stale_l2_keys(cache, fingerprints)  # every shard answers SCAN before any UNLINK
        if dry_run or not fingerprints:
            return {"fingerprints": fingerprints, "l2_keys": keys, "dirs": [str(d) for d in dirs]}
        store = _store(cache)
        keys = 0
        try:
            for fp in fingerprints if store is not None else []:
                keys += store.drop(namespace_match(cache.config.prefix, fp))
        finally:
            if store is not None:
                store.close()
        for d in dirs:
            try:
                shutil.rmtree(d)
            except OSError as exc:
                raise NamespaceError(f"dropped the L2 keys of {', '.join(fingerprints)} but could not remove "
                                     f"{d}: {exc.strerror or exc}") from None
    finally:
        for fd in leases:
            release_lease(fd)
    return {"fingerprints": fingerprints, "l2_keys": keys, "dirs": [str(d) for d in dirs]}
