"""The manifest a cache serves: given, saved, or scanned once per job through a shared L2.

NOTE [manifest through the store]
Every node of a job reads the same NFS export, so one scan describes it for all: the
first node that scans publishes its manifest in the shared L2 store (Redis URLs or a
cluster; never the embedded server or ``shm://``, which are one node's) under
``<prefix>:manifest:<hash of root>:``, index 0 a JSON header (root, fingerprint, the
file's length and XXH3 checksum, the pointer's directory mtimes and scan time: NOTE
[manifest reuse]) and indices 1.. the manifest file itself (NOTE [manifest file]) in
32 MB parts. A node without a trustworthy manifest of its own (under the lock of NOTE
[one scan per node]) fetches it, writes the parts to its cache dir, opens the file with
its checksum verified (a torn or foreign value is refused, never unpickled: the header
is JSON, the file the project's own binary format) and trusts it only when the reuse
check passes against its own view of the tree (every directory's mtime, or with
``verify="files"`` every file's identity); then it saves it and its pointer, as if it had
scanned. Anything else (no value, a value that fails its checks, a store that cannot be
reached, a changed tree) is a scan, and the scan is published in turn. A write refused
for room is a warning: the nodes then scan for themselves.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections import Counter
from pathlib import Path

from cachepipe.errors import CacheWarning, L2UnavailableError
from cachepipe.private_files import private_dir, write_private
from cachepipe.source.manifest import Manifest
from cachepipe.source.manifest_file import FILE_NAME, ManifestFile, ManifestFileError

__all__ = ["ManifestShare", "manifest_of"]

_PART = 32 << 20


def manifest_of(config, manifest: Manifest | None = None, *, verify: str = "dirs", rescan: bool = False,
                save: bool = True) -> Manifest:
    """The manifest a :class:`~cachepipe.TwoLevelCache` of ``config`` serves: ``manifest``
    (saved to the cache dir with ``save``), else the saved one if unchanged, else one from
    the shared store (NOTE [manifest through the store]), else a new scan.

    Raises:
        ValueError: ``manifest`` is of another root; as :meth:`Manifest.load_or_scan`.
        FileNotFoundError: as :meth:`Manifest.load_or_scan`.
    """
    if manifest is not None and manifest.root != config.source:
        raise ValueError(f"the manifest is of {manifest.root!r}, the cache config of {config.source!r}")
    if save:  # ranks race to create it: private_dir tolerates that
        private_dir(config.cache_dir, follow_link=True)  # NOTE [private cache files]
    if manifest is not None:
        if save:
            manifest.save(config.cache_dir)
        return manifest
    share = ManifestShare.of(config) if save else None  # with share_manifest only
    try:
        return Manifest.load_or_scan(config.source, config.cache_dir, verify=verify, rescan=rescan, save=save,
                                     follow_external_links=config.follow_external_links, shared=share)
    finally:
        if share is not None:
            share.close()


class ManifestShare:
    """Publish and fetch the manifests of one L2 store (NOTE [manifest through the store]).

    Args:
        store: a :class:`~cachepipe.l2.store.SampleStore` opened in this share's namespace.
    """

    def __init__(self, store) -> None:
        self.store = store
        self.counters = Counter()

    @classmethod
    def of(cls, config, root: str | None = None) -> ManifestShare | None:
        """The share of ``config``'s L2, or ``None`` when it is not shared by the nodes."""
        l2 = config.l2
        if not config.share_manifest or not l2.enabled or l2.is_embedded:
            return None
        from cachepipe.l2.registry import open_store

        counters: Counter = Counter()
        try:
            store = open_store(l2.urls, f"{config.prefix}:manifest:{_root_key(root or config.source)}:", counters,
                               replicas=config.replicas, timeout=config.timeout, memory=l2.memory)
        except (ValueError, OSError):
            return None
        if store.node_local:
            store.close()
            return None
        share = cls(store)
        share.counters = counters
        return share

    def publish(self, m: Manifest) -> bool:
        """Store ``m``'s saved file and pointer; ``False`` (with a warning) when the store refused."""
        if m.file is None:
            return False
        data = Path(m.file.path).read_bytes()
        head = {"root": m.root, "fingerprint": m.fingerprint, "length": len(data), "checksum": m.file.checksum,
                "dir_mtimes": m.dir_mtimes, "scanned_at": m.scanned_at,
                "follow_external_links": m.follow_external_links}
        parts = [(k + 1, data[at:at + _PART]) for k, at in enumerate(range(0, len(data), _PART))]
        try:
            ok = self.store.put_many(parts) == len(parts) and self.store.put_many(
                [(0, json.dumps(head, separators=(",", ":"), ensure_ascii=True).encode())]) == 1
        except L2UnavailableError:
            ok = False
        if not ok:
            warnings.warn(f"could not publish the manifest of {m.root!r} in L2 (a shard down or full): the other "
                          f"nodes scan the source themselves", CacheWarning, stacklevel=3)
        return ok

    def fetch(self, root: str, cache_dir: str | os.PathLike) -> Manifest | None:
        """The published manifest of ``root``, written to ``cache_dir`` and verified whole,
        with its pointer's fields; ``None`` when there is none or it fails a check."""
        try:
            got = self.store.get_many([0])[0]
            if got is None:
                return None
            head = json.loads(bytes(got).decode("ascii"))
            fp, length, root_seen = str(head["fingerprint"]), int(head["length"]), head["root"]
            if root_seen != root or len(fp) != 16 or not all(ch in "0123456789abcdef" for ch in fp):
                return None
            parts = self.store.get_many(list(range(1, 1 + -(-length // _PART))))
        except (L2UnavailableError, ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None
        if any(p is None for p in parts) or sum(len(p) for p in parts) != length:
            return None
        directory = private_dir(Path(cache_dir) / fp)
        path = directory / FILE_NAME
        tmp = directory / f".{FILE_NAME}.fetched.{os.getpid()}"
        try:
            write_private(tmp, [memoryview(p) for p in parts])
            saved = ManifestFile.open(tmp)  # the whole file's checksum, verified here
            if saved.fingerprint != fp or saved.checksum != int(head["checksum"]) or saved.meta["root"] != root:
                raise ManifestFileError(f"{tmp} is not the manifest its header names")
            os.replace(tmp, path)
            m = Manifest.load(cache_dir, fp)
        except (OSError, ManifestFileError):
            tmp.unlink(missing_ok=True)
            return None
        m.dir_mtimes, m.scanned_at = dict(head["dir_mtimes"]), float(head["scanned_at"])
        m.follow_external_links = bool(head.get("follow_external_links", False))
        return m

    def close(self) -> None:
        self.store.close()


def _root_key(root: str) -> str:
    return hashlib.sha256(os.fsencode(os.path.abspath(root))).hexdigest()[:16]
