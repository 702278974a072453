"""Whether a saved scan is still the source: the pointer of a root, and its reuse.

NOTE [manifest reuse]
Scanning a large tree on NFS costs one ``stat`` per file, so a scan is saved in the
cache directory (``<cache_dir>/<fingerprint>/manifest.cpm``, NOTE [manifest file], with a
pointer ``<cache_dir>/sources/<hash of root>.json`` holding the mtime of every directory
seen). :meth:`Manifest.load_or_scan` reuses it when every one of those directories still
has its recorded mtime: adding, removing or renaming a file (including the usual "write a
temp file, rename over the old one" replacement) changes its directory's mtime.
Directory mtimes that were within 2 s of the scan are not trusted (a file created in
the same clock tick would go unseen) and force a rescan next time. Editing a file *in
place* does not touch its directory: pass ``verify="files"`` (one stat per file, no
listing) or ``rescan=True`` to catch that. A saved manifest that cannot be used (torn,
foreign, another format, damaged, of another root) is a rescan, and the rescan rewrites
it; a format 1 or 2 ``manifest.json`` left by an older cachepipe is rescanned once into
the binary file (keeping its fingerprint: NOTE [fingerprint stable across file formats]).

NOTE [one scan per node]
The ranks of a node start together and each calls ``load_or_scan``: without coordination
every rank that finds no saved scan walks the tree itself (eight scans of ImageNet on NFS
for one node of eight GPUs). The check and the scan run under an exclusive ``fcntl`` lock
on ``<cache_dir>/sources/<hash of root>.lock``: the first rank scans and saves, the others
wait on the lock and then find its pointer and load the saved manifest (no scan). With
``rescan=True`` a rank takes a scan that began after its own call (another rank's, made
while it waited) instead of scanning again, and a scan that began after the call is taken
as it is (it is as new as this rank's own would be, racy directories included). The lock is the kernel's, so a rank killed
while scanning releases it and the next one scans. Without ``save`` (a read-only
inspection) nothing is locked or written.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cachepipe.private_files import exclusive_lock, private_dir, write_private
from cachepipe.source.file_identity import identity
from cachepipe.source.listing import SCAN_THREADS

__all__ = ["load_or_scan", "scan_lock", "write_pointer"]

_RACY_SECONDS = 2.0


class _Rescan(Exception):
    """``rescan=True`` and the saved scan is older than the call."""


def _pointer(cache_dir: str | os.PathLike, root: str) -> Path:
    return Path(cache_dir) / "sources" / f"{hashlib.sha256(os.fsencode(root)).hexdigest()[:16]}.json"


def write_pointer(m, cache_dir: str | os.PathLike) -> None:
    """Write the pointer of ``m.root`` to ``m`` (atomic, private; NOTE [private cache files])."""
    path = _pointer(cache_dir, m.root)
    private_dir(path.parent)
    write_private(path, json.dumps({"root": m.root, "fingerprint": m.fingerprint, "dir_mtimes": m.dir_mtimes,
                                    "scanned_at": m.scanned_at, "follow_external_links": m.follow_external_links},
                                   separators=(",", ":"), ensure_ascii=True).encode())  # keeps surrogates


def _unchanged(m, verify: str, threads: int = SCAN_THREADS) -> bool:
    if not m.dir_mtimes:
        return False
    racy = int((m.scanned_at - _RACY_SECONDS) * 1e9)
    for rel, mt in m.dir_mtimes.items():
        try:
            now = os.stat(os.path.join(m.root, rel)).st_mtime_ns
        except OSError:
            return False
        if now != mt or mt >= racy:
            return False
    if verify == "files":  # one stat per file, many in flight (NOTE [scan in flight])
        def same(i: int) -> bool:
            try:
                return identity(os.stat(m.path(i))) == m.identity(i)
            except OSError:
                return False

        with ThreadPoolExecutor(threads, thread_name_prefix="cachepipe-verify") as pool:
            return all(pool.map(same, range(len(m)), chunksize=256))
    return True


@contextlib.contextmanager
def scan_lock(cache_dir: str | os.PathLike, root: str):
    """Hold the exclusive lock of ``root``'s scan in ``cache_dir`` (NOTE [one scan per node])."""
    path = _pointer(cache_dir, root).with_suffix(".lock")
    try:
        private_dir(path.parent)
    except OSError:  # a read-only cache dir: no rank can save a scan there, so there is nothing to wait for
        yield
        return
    with exclusive_lock(path):
        yield


def load_or_scan(cls, root: str | os.PathLike, cache_dir: str | os.PathLike, *, verify: str = "dirs",
                 rescan: bool = False, save: bool = True, follow_external_links: bool = False,
                 scan_threads: int = SCAN_THREADS, shared=None):
    """``cls.load_or_scan`` (:meth:`cachepipe.Manifest.load_or_scan`, whose docstring this follows)."""
    if verify not in ("dirs", "files"):
        raise ValueError(f"verify must be one of 'dirs', 'files'; got {verify!r}")
    root = os.path.abspath(os.fspath(root))
    if not os.path.isdir(root):
        raise FileNotFoundError(f"source {root!r} does not exist or is not a directory")
    if not save:
        return _load_or_scan(cls, root, cache_dir, verify, rescan, save, follow_external_links, scan_threads, 0.0)
    called = time.time()
    with scan_lock(cache_dir, root):  # NOTE [one scan per node]
        return _load_or_scan(cls, root, cache_dir, verify, rescan, save, follow_external_links, scan_threads,
                             called, shared)


def _load_or_scan(cls, root: str, cache_dir, verify: str, rescan: bool, save: bool, follow_external_links: bool,
                  threads: int, called: float, shared=None):
    pointer = _pointer(cache_dir, root)
    if pointer.exists():
        try:
            with open(pointer) as f:
                ptr = json.load(f)
            waited = bool(called) and float(ptr["scanned_at"]) >= called  # another rank's scan, made as we waited
            if rescan and not waited:
                raise _Rescan
            m = cls.load(cache_dir, ptr["fingerprint"])
            m.dir_mtimes, m.scanned_at = dict(ptr["dir_mtimes"]), float(ptr["scanned_at"])
            m.follow_external_links = bool(ptr.get("follow_external_links", False))
            if m.root == root and m.follow_external_links == follow_external_links and (
                    waited or _unchanged(m, verify, threads)):
                return m
        except _Rescan:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            # an unreadable pointer, or a manifest that cannot be used: the rescan rewrites them
            if save:
                pointer.unlink(missing_ok=True)
    if shared is not None and not rescan:  # NOTE [manifest through the store]: another node's scan
        m = shared.fetch(root, cache_dir)
        if m is not None and m.follow_external_links == follow_external_links and _unchanged(m, verify, threads):
            m.save(cache_dir)  # the file is in place: writes the pointer
            return m
    m = cls.scan(root, follow_external_links=follow_external_links, scan_threads=threads)
    if save:
        m.save(cache_dir)
        if shared is not None and m.dir_mtimes:
            shared.publish(m)
    return m
