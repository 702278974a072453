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
Policy: the fingerprint is a hash of every (relpath, label, size, mtime_ns), and both
levels are keyed by it (L1 directory, L2 key prefix). Any changed, added or removed file
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
from collections.abc import Sequence
from pathlib import Path

from cachepipe.private_files import private_dir, write_private
from cachepipe.scan import Walker

__all__ = ["IMG_EXTENSIONS", "Manifest"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_FORMAT = 1
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
        fingerprint: 16 hex chars, hash of every (relpath, label, size, mtime_ns);
            independent of ``root`` so nodes mounting the data elsewhere agree.

    Example:
        >>> m = Manifest.scan("/data/imagenet/train")  # doctest: +SKIP
        >>> m.samples[0], m.fingerprint  # doctest: +SKIP
    """

    def __init__(self, root: str | os.PathLike, classes: Sequence[str], relpaths: Sequence[str],
                 labels: Sequence[int], sizes: Sequence[int], mtimes: Sequence[int],
                 dir_mtimes: dict[str, int] | None = None, scanned_at: float = 0.0) -> None:
        if not (len(relpaths) == len(labels) == len(sizes) == len(mtimes)):
            raise ValueError("relpaths, labels, sizes and mtimes must have the same length")
        self.root = os.path.abspath(os.fspath(root))
        self.classes = list(classes)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.relpaths = list(relpaths)
        self.targets = [int(t) for t in labels]
        self.sizes = [int(s) for s in sizes]
        self.mtimes = [int(m) for m in mtimes]
        self.samples = list(zip(self.relpaths, self.targets))
        self.dir_mtimes = dict(dir_mtimes or {})
        self.scanned_at = scanned_at
        self.follow_external_links = False  # how the scan treated links (pointer reuse)
        h = hashlib.sha256(f"cachepipe-manifest-v{_FORMAT}\0".encode())
        for c in self.classes:
            h.update(os.fsencode(c) + b"\0")
        h.update(b"\1")
        for rel, lab, size, mt in zip(self.relpaths, self.targets, self.sizes, self.mtimes):
            h.update(os.fsencode(rel) + f"\0{lab}\0{size}\0{mt}\n".encode())
        self.fingerprint = h.hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.relpaths)

    def __repr__(self) -> str:
        return (f"Manifest(root={self.root!r}, samples={len(self)}, classes={len(self.classes)}, "
                f"fingerprint={self.fingerprint!r})")

    def path(self, index: int) -> str:
        """Absolute path of sample ``index``."""
        return os.path.join(self.root, self.relpaths[index])

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    # -- scanning ---------------------------------------------------------------------
    @classmethod
    def scan(cls, root: str | os.PathLike, *, follow_external_links: bool = False) -> Manifest:
        """Walk ``root`` with torchvision ``ImageFolder`` rules, links as NOTE [symlinks in
        the source] says (``follow_external_links`` also follows links leaving the root).

        Raises:
            FileNotFoundError: ``root`` does not exist or is not a directory.
            ValueError: no class folders, or class folders without any image file; the
                message says what was found instead.
        """
        root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(root):
            raise FileNotFoundError(f"source {root!r} does not exist or is not a directory")
        started = time.time()
        with os.scandir(root) as it:
            entries = list(it)
        walker = Walker(root, follow_external_links)
        classes = walker.classes(root)
        if not classes:
            files = sorted(e.name for e in entries)
            shown = ", ".join(files[:5]) + (", ..." if len(files) > 5 else "")
            raise ValueError(f"no class folders in {root!r} (an ImageFolder root holds one folder "
                             f"per class); found {len(files)} other entries"
                             + (f": {shown}" if files else ""))
        dir_mtimes = {".": os.stat(root).st_mtime_ns}
        relpaths, labels, sizes, mtimes, empty = [], [], [], [], []
        class_dirs = [os.path.join(root, name) for name in classes]
        for label, name in enumerate(classes):
            before = len(relpaths)
            for dirpath, fnames in walker.walk(class_dirs[label]):
                dir_mtimes[os.path.relpath(dirpath, root)] = os.stat(dirpath).st_mtime_ns
                for fname in fnames:
                    if not fname.lower().endswith(IMG_EXTENSIONS):
                        continue
                    full = os.path.join(dirpath, fname)
                    try:
                        st = os.stat(full)
                    except FileNotFoundError:  # dangling symlink: ImageFolder would fail to open it too
                        continue
                    relpaths.append(os.path.relpath(full, root))
                    labels.append(label)
                    sizes.append(st.st_size)
                    mtimes.append(st.st_mtime_ns)
            if len(relpaths) == before:
                empty.append(name)
        walker.warn()
        if empty:
            shown = ", ".join(repr(e) for e in empty[:5]) + (", ..." if len(empty) > 5 else "")
            raise ValueError(f"{len(empty)} of {len(classes)} class folders in {root!r} hold no image "
                             f"file ({'/'.join(IMG_EXTENSIONS)}): {shown}")
        m = cls(root, classes, relpaths, labels, sizes, mtimes, dir_mtimes, started)
        m.follow_external_links = follow_external_links
        return m

    # -- persistence --------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": _FORMAT, "root": self.root, "fingerprint": self.fingerprint,
                "classes": self.classes, "relpaths": self.relpaths, "labels": self.targets,
                "sizes": self.sizes, "mtimes": self.mtimes, "dir_mtimes": self.dir_mtimes,
                "scanned_at": self.scanned_at}

    @classmethod
    def from_json(cls, obj: dict) -> Manifest:
        if obj.get("format") != _FORMAT:
            raise ValueError(f"unsupported manifest format {obj.get('format')!r}")
        m = cls(obj["root"], obj["classes"], obj["relpaths"], obj["labels"], obj["sizes"],
                obj["mtimes"], obj.get("dir_mtimes"), obj.get("scanned_at", 0.0))
        if m.fingerprint != obj["fingerprint"]:
            raise ValueError("manifest file does not match its fingerprint")
        return m

    def save(self, cache_dir: str | os.PathLike) -> Path:
        """Write ``<cache_dir>/<fingerprint>/manifest.json`` and the source pointer (atomic)."""
        cache_dir = Path(cache_dir)
        path = cache_dir / self.fingerprint / "manifest.json"
        if not path.exists():
            _atomic_write_json(path, self.to_json())
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
                if st.st_size != self.sizes[i] or st.st_mtime_ns != self.mtimes[i]:
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
                files) or ``"files"`` (also stat every file: catches in-place edits).
                See NOTE [manifest reuse].
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
