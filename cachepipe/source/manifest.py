"""The manifest: index -> (relpath, label, size, mtime) of an ImageFolder tree, and its fingerprint.

NOTE [manifest reuse]
Scanning a large tree on NFS costs one ``stat`` per file, so a scan is saved in the
cache directory (``<cache_dir>/<fingerprint>/manifest.json``, with a pointer
``<cache_dir>/sources/<hash of root>.json`` holding the mtime of every directory seen).
:meth:`Manifest.load_or_scan` reuses it when every one of those directories still has
its recorded mtime: adding, removing or renaming a file (including the usual
"write a temp file, rename over the old one" replacement) changes its directory's mtime.
Directory mtimes that were within 2 s of the scan are not trusted (a file created in
the same clock tick would go unseen) and force a rescan next time. Editing a file *in
place* does not touch its directory: pass ``verify="files"`` (one stat per file, no
listing) or ``rescan=True`` to catch that.

NOTE [changed files]
Policy: the fingerprint is a hash of every (relpath, label) and file identity (size,
mtime, inode, ctime: NOTE [file identity] in ``source/file_identity.py``), and both levels are
keyed by it (L1 directory, L2 key prefix). Any changed, added, removed or replaced file
therefore gives a new fingerprint and a fresh cache namespace; stale pixels are never
served. This costs a re-warm after a change, which is the right trade for a training set
that changes rarely: sample indices shift when files come and go, so per-entry
invalidation could not be trusted anyway. Old namespaces are listed by
``cachepipe stats`` and can be removed by hand.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cachepipe.errors import EmptyFolderError
from cachepipe.private_files import private_dir, write_private
from cachepipe.source.file_identity import identity, settle
from cachepipe.source.scan import Walker

__all__ = ["IMG_EXTENSIONS", "Manifest"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_FORMAT = 2  # 2: inode and ctime in the identity (NOTE [file identity]); 1 is rescanned
_RACY_SECONDS = 2.0


def _atomic_write_json(path: Path, obj: object) -> None:
    private_dir(path.parent)  # NOTE [private cache files]
    # ensure_ascii keeps non-UTF-8 names (surrogate escapes) as \udcXX escapes
    write_private(path, json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode())


def _source_key(root: str) -> str:
    return hashlib.sha256(os.fsencode(root)).hexdigest()[:16]


def _readable(path: Path) -> bool:
    try:
        with open(path) as f:
            Manifest.from_json(json.load(f))
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


class Manifest:
    """An ImageFolder tree (``<root>/<class>/**/<file>``) frozen into a sample list.

    Same classes, ``class_to_idx``, sample order and extensions as torchvision's
    ``ImageFolder``: class folders sorted by name, files found by walking each class
    folder in sorted order, extensions in :data:`IMG_EXTENSIONS`, case-insensitive;
    symlinks are followed only inside the root and each real directory is walked once
    (NOTE [symlinks in the source]).

    Attributes:
        root: absolute source root (str).
        classes: sorted class folder names.
        class_to_idx: class name -> label.
        samples: list of ``(relpath, label)``; relpath is relative to ``root``.
        targets: list of labels.
        sizes: file sizes in bytes.
        mtimes: file mtimes in nanoseconds.
        inos, ctimes: file inode numbers and ctimes in nanoseconds.
        fingerprint: 16 hex chars, hash of every relpath, label and identity (size,
            mtime, inode, ctime: NOTE [file identity]); independent of ``root`` so nodes
            mounting the data elsewhere agree.
        skipped_files: entries of the scan that were not regular files (a FIFO, socket
            or device named like an image), left out with a warning; empty when loaded.

    Example:
        >>> m = Manifest.scan("/data/imagenet/train")  # doctest: +SKIP
        >>> m.samples[0], m.fingerprint  # doctest: +SKIP
    """

    def __init__(self, root: str | os.PathLike, classes: Sequence[str], relpaths: Sequence[str],
                 labels: Sequence[int], sizes: Sequence[int], mtimes: Sequence[int], inos: Sequence[int],
                 ctimes: Sequence[int], dir_mtimes: dict[str, int] | None = None, scanned_at: float = 0.0) -> None:
        if not (len(relpaths) == len(labels) == len(sizes) == len(mtimes) == len(inos) == len(ctimes)):
            raise ValueError("relpaths, labels, sizes, mtimes, inos and ctimes must have the same length")
        self.root = os.path.abspath(os.fspath(root))
        self.classes = list(classes)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.relpaths = list(relpaths)
        self.targets = [int(t) for t in labels]
        self.sizes = [int(s) for s in sizes]
        self.mtimes = [int(m) for m in mtimes]
        self.inos = [int(i) for i in inos]
        self.ctimes = [int(c) for c in ctimes]
        self.skipped_files: list[str] = []
        self.samples = list(zip(self.relpaths, self.targets))
        self.dir_mtimes = dict(dir_mtimes or {})
        self.scanned_at = scanned_at
        self.follow_external_links = False  # how the scan treated links (pointer reuse)
        h = hashlib.sha256(f"cachepipe-manifest-v{_FORMAT}\0".encode())
        for c in self.classes:
            h.update(os.fsencode(c) + b"\0")
        h.update(b"\1")
        for rel, lab, *ident in zip(self.relpaths, self.targets, self.sizes, self.mtimes, self.inos, self.ctimes):
            h.update(os.fsencode(rel) + f"\0{lab}\0{ident[0]}\0{ident[1]}\0{ident[2]}\0{ident[3]}\n".encode())
        self.fingerprint = h.hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.relpaths)

    def __repr__(self) -> str:
        return (f"Manifest(root={self.root!r}, samples={len(self)}, classes={len(self.classes)}, "
                f"fingerprint={self.fingerprint!r})")

    def path(self, index: int) -> str:
        """Absolute path of sample ``index``."""
        return os.path.join(self.root, self.relpaths[index])

    def identity(self, index: int) -> tuple[int, int, int, int]:
        """``(size, mtime_ns, inode, ctime_ns)`` of sample ``index`` at the scan (NOTE [file identity])."""
        return self.sizes[index], self.mtimes[index], self.inos[index], self.ctimes[index]

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    # -- scanning ---------------------------------------------------------------------
    @classmethod
    def scan(cls, root: str | os.PathLike, *, extensions: str | Sequence[str] | None = None,
             is_valid_file: Callable[[str], bool] | None = None, allow_empty: bool = False,
             follow_external_links: bool = False) -> Manifest:
        """Walk ``root`` with torchvision ``ImageFolder`` / ``DatasetFolder`` rules, links as
        NOTE [symlinks in the source] says.

        Args:
            root: ImageFolder root.
            extensions: file name endings to keep, matched against the lower-cased name
                (default :data:`IMG_EXTENSIONS`); as ``DatasetFolder(extensions=)``.
            is_valid_file: ``f(absolute path) -> bool`` instead of ``extensions``.
            allow_empty: keep class folders without a valid file (their label exists,
                no sample has it) instead of raising.
            follow_external_links: also follow links whose target leaves the root.

        A manifest scanned with ``extensions`` or ``is_valid_file`` (or with empty classes)
        is not reused by :meth:`load_or_scan` (NOTE [manifest reuse]): those rules are not
        part of the saved pointer, so it records no directory mtimes.

        Raises:
            FileNotFoundError: ``root`` does not exist or is not a directory.
            EmptyFolderError: (a ``FileNotFoundError`` and ``ValueError``) no class folders,
                or class folders without any valid file; the message says what was found.
            ValueError: both ``extensions`` and ``is_valid_file`` given.
        """
        if extensions is not None and is_valid_file is not None:
            raise ValueError("extensions and is_valid_file cannot both be given (as in torchvision's DatasetFolder)")
        custom = extensions is not None or is_valid_file is not None
        if is_valid_file is None:
            ends = IMG_EXTENSIONS if extensions is None else (
                (extensions,) if isinstance(extensions, str) else tuple(extensions))

            def is_valid_file(path: str) -> bool:
                return path.lower().endswith(ends)

        root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(root):
            raise FileNotFoundError(f"source {root!r} does not exist or is not a directory")
        started_ns = time.time_ns()
        with os.scandir(root) as it:
            entries = list(it)
        walker = Walker(root, follow_external_links)
        classes = walker.classes(root)
        if not classes:
            files = sorted(e.name for e in entries)
            shown = ", ".join(files[:5]) + (", ..." if len(files) > 5 else "")
            raise EmptyFolderError(f"no class folders in {root!r} (an ImageFolder root holds one folder "
                                   f"per class); found {len(files)} other entries"
                                   + (f": {shown}" if files else ""))
        files = walker.files([os.path.join(root, name) for name in classes], is_valid_file)
        walker.warn()
        dir_mtimes = {".": os.stat(root).st_mtime_ns, **files.dir_mtimes}
        have = set(files.labels)
        empty = [name for label, name in enumerate(classes) if label not in have]
        if empty and not allow_empty:
            shown = ", ".join(repr(e) for e in empty[:5]) + (", ..." if len(empty) > 5 else "")
            rule = "is_valid_file" if extensions is None and custom else "/".join(ends)
            raise EmptyFolderError(f"{len(empty)} of {len(classes)} class folders in {root!r} hold no valid "
                                   f"file ({rule}): {shown}")
        if custom or empty:
            dir_mtimes = {}
        ids = [identity(st) for st in settle(files.paths, files.stats, started_ns)]  # NOTE [file identity]
        columns = [list(col) for col in zip(*ids)] if ids else [[], [], [], []]
        m = cls(root, classes, [os.path.relpath(p, root) for p in files.paths], files.labels, *columns,
                dir_mtimes, started_ns / 1e9)
        m.follow_external_links = follow_external_links
        m.skipped_files = files.irregular
        return m

    # -- persistence --------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": _FORMAT, "root": self.root, "fingerprint": self.fingerprint,
                "classes": self.classes, "relpaths": self.relpaths, "labels": self.targets,
                "sizes": self.sizes, "mtimes": self.mtimes, "inos": self.inos, "ctimes": self.ctimes,
                "dir_mtimes": self.dir_mtimes,
                "scanned_at": self.scanned_at}

    @classmethod
    def from_json(cls, obj: dict) -> Manifest:
        if obj.get("format") != _FORMAT:
            raise ValueError(f"unsupported manifest format {obj.get('format')!r}")
        m = cls(obj["root"], obj["classes"], obj["relpaths"], obj["labels"], obj["sizes"],
                obj["mtimes"], obj["inos"], obj["ctimes"], obj.get("dir_mtimes"), obj.get("scanned_at", 0.0))
        if m.fingerprint != obj["fingerprint"]:
            raise ValueError("manifest file does not match its fingerprint")
        return m

    def save(self, cache_dir: str | os.PathLike) -> Path:
        """Write ``<cache_dir>/<fingerprint>/manifest.json`` and, for a manifest that
        :meth:`load_or_scan` may reuse, the source pointer (atomic)."""
        cache_dir = Path(cache_dir)
        path = cache_dir / self.fingerprint / "manifest.json"
        if not path.exists():
            _atomic_write_json(path, self.to_json())
        if self.dir_mtimes:  # without them the manifest cannot be reused by root (Manifest.scan)
            _atomic_write_json(cache_dir / "sources" / f"{_source_key(self.root)}.json",
                               {"root": self.root, "fingerprint": self.fingerprint,
                                "dir_mtimes": self.dir_mtimes, "scanned_at": self.scanned_at,
                                "follow_external_links": self.follow_external_links})
        return path

    @classmethod
    def load(cls, cache_dir: str | os.PathLike, fingerprint: str) -> Manifest:
        """Read a saved manifest by fingerprint (no file system scan).

        Raises:
            FileNotFoundError: no such manifest in ``cache_dir``.
        """
        with open(Path(cache_dir) / fingerprint / "manifest.json") as f:
            return cls.from_json(json.load(f))

    def _unchanged(self, verify: str) -> bool:
        if not self.dir_mtimes:
            return False
        racy = int((self.scanned_at - _RACY_SECONDS) * 1e9)
        for rel, mt in self.dir_mtimes.items():
            try:
                now = os.stat(os.path.join(self.root, rel)).st_mtime_ns
            except OSError:
                return False
            if now != mt or mt >= racy:
                return False
        if verify == "files":
            for i in range(len(self)):
                try:
                    st = os.stat(self.path(i))
                except OSError:
                    return False
                if identity(st) != self.identity(i):
                    return False
        return True

    @classmethod
    def load_or_scan(cls, root: str | os.PathLike, cache_dir: str | os.PathLike, *,
                     verify: str = "dirs", rescan: bool = False, save: bool = True,
                     follow_external_links: bool = False) -> Manifest:
        """Reuse the saved manifest of ``root`` if unchanged, else scan and save.

        Args:
            root: ImageFolder root.
            cache_dir: where manifests are kept.
            verify: ``"dirs"`` (stat every directory: catches added/removed/renamed
                files) or ``"files"`` (also stat every file and compare its identity:
                catches in-place edits and replacements). See NOTE [manifest reuse].
            rescan: always scan.
            save: write a new scan to ``cache_dir`` (``False``: change nothing there).
            follow_external_links: as :meth:`scan`; a saved scan made with the other
                setting is not reused.

        Raises:
            FileNotFoundError, ValueError: as :meth:`scan`; ValueError for a bad ``verify``.
        """
        if verify not in ("dirs", "files"):
            raise ValueError(f"verify must be one of 'dirs', 'files'; got {verify!r}")
        root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(root):
            raise FileNotFoundError(f"source {root!r} does not exist or is not a directory")
        pointer = Path(cache_dir) / "sources" / f"{_source_key(root)}.json"
        if not rescan and pointer.exists():
            fingerprint = None
            try:
                with open(pointer) as f:
                    ptr = json.load(f)
                fingerprint = ptr["fingerprint"]
                m = cls.load(cache_dir, fingerprint)
                m.dir_mtimes, m.scanned_at = ptr["dir_mtimes"], ptr["scanned_at"]
                m.follow_external_links = bool(ptr.get("follow_external_links", False))
                if m.root == root and m.follow_external_links == follow_external_links and m._unchanged(verify):
                    return m
            except (OSError, ValueError, KeyError, TypeError):
                # unreadable pointer or manifest: drop them so the rescan rewrites them
                if not save:
                    return cls.scan(root, follow_external_links=follow_external_links)
                pointer.unlink(missing_ok=True)
                if isinstance(fingerprint, str):
                    bad = Path(cache_dir) / fingerprint / "manifest.json"
                    if not _readable(bad):
                        bad.unlink(missing_ok=True)
        m = cls.scan(root, follow_external_links=follow_external_links)
        if save:
            m.save(cache_dir)
        return m

