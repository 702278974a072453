"""A new version of the source whose files are the old ones: its L1 is the old L1, re-keyed.

NOTE [metadata-only changes]
A ``chmod -R``, a ``touch`` that leaves the bytes alone or an ``rsync`` that rewrites
identical files changes every file's identity (ctime at least: NOTE [file identity]), so
the source gets a new fingerprint, a new namespace and, until now, a second full mirror
next to the first. The warm-up of the new fingerprint (with no L1 of its own yet, or an
empty one) therefore first looks for a stale L1 of the same root (NOTE [stale
namespaces]) whose manifest lists the same files in the same order (classes, labels and
names equal: one vectorised comparison of the mapped columns), and adopts it:

1. ``<new>/adopting.json`` names the old fingerprint, and the old ``l1`` directory is
   renamed to ``<new>/l1.adopting`` (one ``rename``: no byte is copied, the old namespace
   keeps its manifest and loses its mirror);
2. every entry whose file's identity differs between the two manifests is *suspect*: the
   file is read once (a stable read, NOTE [stable reads]) and the entry is kept if its
   stored size and XXH3 checksum (NOTE [L1 layout and safety]) are those of the bytes
   read, replaced by them otherwise (the bytes changed: never served stale), and
   deleted when the read fails or the file changed again (the warm-up then reads it);
   entries whose identity did not change are kept without a read;
3. ``l1.adopting`` is renamed to ``l1`` and ``adopting.json`` removed.

So the change costs at most one read of each changed file and L1 does not grow. A run
killed between 1 and 3 resumes at 2 (its suspects are read again, once more). The steps
run under ``flock`` on ``<new>/l1.adopt.lock``. A process still serving the old version
keeps its map of the same files, and what it may still write there is safe: it stores a
file only when its identity is the old manifest's (NOTE [changed files]), and a file that
still has its old identity has its old, and so its current, bytes. A change that adds, removes or renames files is not adopted
(indices would move): the new fingerprint is mirrored afresh as before, and ``cachepipe
drop`` removes the old one.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections import deque
from itertools import islice
from pathlib import Path

import numpy as np

from cachepipe.checksum import checksum64
from cachepipe.l1.mirror import L1Mirror
from cachepipe.l1.sizing import needed_map_size
from cachepipe.private_files import write_private
from cachepipe.source.columns import IDENTITY
from cachepipe.source.manifest import Manifest
from cachepipe.source.manifest_file import ManifestFileError
from cachepipe.source.reader import SourceFile, SourceReader
from cachepipe.stale import stale_fingerprints

__all__ = ["adopt_previous_l1", "same_files"]

_BATCH = 64


def same_files(a: Manifest, b: Manifest) -> bool:
    """Whether two manifests list the same files (relpaths and labels) in the same order."""
    ca, cb = a._cols, b._cols
    return (a.classes == b.classes and len(a) == len(b) and np.array_equal(ca.labels, cb.labels)
            and np.array_equal(ca.offsets, cb.offsets) and np.array_equal(ca.names, cb.names))


def adopt_previous_l1(cache, threads: int = 32) -> dict | None:
    """Adopt an older version's L1 for ``cache`` (NOTE [metadata-only changes]).

    Returns:
        ``None`` when there is nothing to adopt, else ``from`` (the old fingerprint),
        ``entries`` (the mirror's), ``checked`` (suspects read), ``reused`` (their bytes
        unchanged), ``replaced`` (changed bytes, stored anew), ``dropped`` (unreadable now)
        and ``bytes_read``.
    """
    if not cache.config.use_l1:
        return None
    home = cache.l1_path.parent
    state, staged = home / "adopting.json", home / "l1.adopting"
    if not state.exists() and (cache.l1_path / "data.mdb").exists():
        l1 = cache.l1
        if l1 is None or l1.entries():
            return None
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(home / "l1.adopt.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:  # a read-only cache dir: the warm-up says so when it writes
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        old = _resume(state, cache) if state.exists() else _candidate(cache)
        if old is None:
            return None
        if not state.exists():
            if (cache.l1_path / "data.mdb").exists():  # an empty mirror made by an open: give way
                cache.close()
                shutil.rmtree(cache.l1_path)
            write_private(state, json.dumps({"from": old.fingerprint}).encode())
            os.rename(Path(cache.config.cache_dir) / old.fingerprint / "l1", staged)
        cache.close()
        report = _verify(cache.manifest, old, staged, threads, cache.config.source_timeout)
        os.rename(staged, cache.l1_path)
        state.unlink()
    finally:
        os.close(fd)  # releases the lock
    return report


def _resume(state: Path, cache) -> Manifest | None:
    try:
        fp = json.loads(state.read_text())["from"]
        return Manifest.load(cache.config.cache_dir, fp)
    except (OSError, ValueError, KeyError, ManifestFileError):
        return None


def _candidate(cache) -> Manifest | None:
    """The newest stale version with a non-empty L1 and the same files."""
    found = []
    for fp in stale_fingerprints(cache):
        data = Path(cache.config.cache_dir) / fp / "l1" / "data.mdb"
        if data.exists():
            found.append((data.stat().st_mtime, fp))
    for _, fp in sorted(found, reverse=True):
        try:
            old = Manifest.load(cache.config.cache_dir, fp)
        except (OSError, ManifestFileError):
            continue
        if same_files(old, cache.manifest):
            return old
    return None


def _verify(new: Manifest, old: Manifest, staged: Path, threads: int, timeout: float) -> dict:
    """Step 2 of NOTE [metadata-only changes] on the mirror at ``staged``."""
    files, kept = new.kept_count(1 << 62), new.kept_bytes(1 << 62)
    mirror = L1Mirror(staged, needed_map_size(files, kept))
    reader = SourceReader(threads, timeout=timeout)
    report = {"from": old.fingerprint, "entries": 0, "checked": 0, "reused": 0, "replaced": 0, "dropped": 0,
              "bytes_read": 0}
    try:
        present = mirror.present()
        report["entries"] = len(present)
        differs = np.zeros(len(new), dtype=bool)
        for f in IDENTITY:
            differs |= getattr(new, f) != getattr(old, f)
        suspects = iter(present[differs[present]].tolist())
        pending: deque = deque()  # reads in flight, in index order (NOTE [reads in flight])

        def fill() -> None:
            for i in islice(suspects, 4 * threads - len(pending)):
                pending.append((i, reader.submit(new.path(i), new.identity(i))))

        fill()
        while pending:
            batch = [pending.popleft() for _ in range(min(_BATCH, len(pending)))]
            fill()
            got = reader.read([new.path(i) for i, _ in batch], [new.identity(i) for i, _ in batch],
                              started={k: task for k, (_, task) in enumerate(batch)})  # with the deadline
            _check(mirror, new, [(i, g) for (i, _), g in zip(batch, got)], report)
    finally:
        reader.close()
        mirror.close()
    return report


def _check(mirror: L1Mirror, new: Manifest, batch: list, report: dict) -> None:
    """Keep, replace or delete the entries of ``batch`` (``(index, read)``) by their bytes."""
    fresh, gone = [], []
    for (i, got), meta in zip(batch, mirror.meta_many([i for i, _ in batch])):
        report["checked"] += 1
        if not isinstance(got, SourceFile) or got.identity != new.identity(i):
            gone.append(i)
            continue
        report["bytes_read"] += got.size
        if meta == (len(got.data), checksum64(got.data)):
            report["reused"] += 1
        else:
            fresh.append((i, got.data))
    mirror.put_many(fresh)
    mirror.delete(gone)
    report["replaced"] += len(fresh)
    report["dropped"] += len(gone)
