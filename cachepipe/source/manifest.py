"""The manifest: index -> (relpath, label, identity) of an ImageFolder tree, and its fingerprint.

Saving, loading and the reuse of a saved scan: NOTE [manifest reuse] in ``source/reuse.py``.

NOTE [changed files]
Policy: the fingerprint is a hash of every (relpath, label) and file identity (size,
mtime, inode, ctime: NOTE [file identity] in ``source/file_identity.py``), and both levels are
keyed by it (L1 directory, L2 key prefix). Any changed, added, removed or replaced file
therefore gives a new fingerprint and a fresh cache namespace; stale pixels are never
served. This costs a re-warm after a change, which is the right trade for a training set
that changes rarely: sample indices shift when files come and go, so per-entry
invalidation could not be trusted anyway. Old namespaces are listed by
``cachepipe stats`` and can be removed by hand.

NOTE [manifest pickles as its path]
A saved manifest pickles as the path of its file, the checksum this process verified and
its fingerprint and root (plus the scan fields of its pointer): a spawn or forkserver
DataLoader worker, or a warm-up worker, maps the same file (the node's processes share
its pages) instead of receiving a copy of N entries. Fork workers inherit the map itself.
Ranks that scanned at once each write the file; the file holds nothing but the scan's
result (no scan time), so what they write is the same bytes, and a worker that finds a
file other than the one its rank verified verifies it whole and takes it only with the
same fingerprint and root (the same samples). A manifest not saved
(``save_manifest=False``, ``cache=False``) pickles its arrays: compact, but a copy per
worker.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from cachepipe.errors import EmptyFolderError
from cachepipe.private_files import private_dir
from cachepipe.source.columns import Columns
from cachepipe.source.file_identity import settle
from cachepipe.source.fingerprint import fingerprint as fingerprint_of
from cachepipe.source.manifest_file import FILE_NAME, ManifestFile, ManifestFileError, write_manifest
from cachepipe.source.reuse import load_or_scan, write_pointer
from cachepipe.source.listing import SCAN_THREADS, scan_pool
from cachepipe.source.scan import Walker, by_label, no_class_folders, no_valid_file
from cachepipe.source.views import Relpaths, Samples, Targets

__all__ = ["IMG_EXTENSIONS", "Manifest"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_LEGACY = "manifest.json"  # formats 1 and 2


class Manifest:
    """An ImageFolder tree (``<root>/<class>/**/<file>``) frozen into flat arrays.

    Same classes, ``class_to_idx``, sample order and extensions as torchvision's
    ``ImageFolder``: class folders sorted by name, files found by walking each class
    folder in sorted order, extensions in :data:`IMG_EXTENSIONS`, case-insensitive;
    symlinks are followed only inside the root and each real directory is walked once
    (NOTE [symlinks in the source]). Per file it holds NOTE [manifest columns]; the lists
    torchvision code expects are lazy views of them (NOTE [lazy sample lists]).

    Args:
        root: the source root.
        classes: sorted class folder names.
        columns: the arrays (NOTE [manifest columns]).
        fingerprint: the stored fingerprint (default: computed from the arrays).
        dir_mtimes: mtime of every directory of the scan (NOTE [manifest reuse]).
        scanned_at: when the scan began (seconds since the epoch).
        follow_external_links: how the scan treated links leaving the root.

    Attributes:
        root: absolute source root (str); classes, class_to_idx.
        labels, sizes, mtimes, inos, ctimes: read-only numpy arrays (labels int32, the rest
            64-bit; times in nanoseconds).
        relpaths: each file's path relative to ``root`` (a lazy sequence of str).
        samples: ``(relpath, label)`` per file; targets: labels as ints (lazy sequences).
        fingerprint: 16 hex chars, hash of every relpath, label and identity (size,
            mtime, inode, ctime: NOTE [file identity]); independent of ``root`` so nodes
            mounting the data elsewhere agree.
        file: the saved file this manifest maps, or ``None``.
        skipped_files: entries of the scan that were not regular files (a FIFO, socket
            or device named like an image), left out with a warning; empty when loaded.

    Example:
        >>> m = Manifest.scan("/data/imagenet/train")  # doctest: +SKIP
        >>> m.samples[0], m.labels[:4], m.fingerprint  # doctest: +SKIP
    """

    def __init__(self, root: str | os.PathLike, classes: Sequence[str], columns: Columns, *,
                 fingerprint: str | None = None, dir_mtimes: dict[str, int] | None = None, scanned_at: float = 0.0,
                 follow_external_links: bool = False) -> None:
        if len(columns) and int(columns.labels.max()) >= len(classes):
            raise ValueError(f"labels reach {int(columns.labels.max())} but there are {len(classes)} classes")
        self.root = os.path.abspath(os.fspath(root))
        self.classes = list(classes)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._use(columns)
        self.fingerprint = fingerprint or fingerprint_of(self.classes, columns)
        self.dir_mtimes = dict(dir_mtimes or {})
        self.scanned_at = scanned_at
        self.follow_external_links = follow_external_links  # how the scan treated links (pointer reuse)
        self.skipped_files: list[str] = []
        self.file: ManifestFile | None = None
        self.relpaths, self.samples, self.targets = Relpaths(self), Samples(self), Targets(self)

    def _use(self, cols: Columns) -> None:
        for f in ("labels", "sizes", "mtimes", "inos", "ctimes"):
            arr = getattr(cols, f)
            if arr.flags.writeable:
                arr = arr.view()
                arr.flags.writeable = False
            setattr(self, f, arr)
        self._cols = cols
        self._prefix = [c + os.sep for c in self.classes]
        self._total = None

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        return (f"Manifest(root={self.root!r}, samples={len(self)}, classes={len(self.classes)}, "
                f"fingerprint={self.fingerprint!r})")

    def relpath(self, index: int) -> str:
        """Path of sample ``index`` relative to the root."""
        return self._prefix[self.labels[index]] + os.fsdecode(self._cols.name(index))

    def path(self, index: int) -> str:
        """Absolute path of sample ``index``."""
        return os.path.join(self.root, self.relpath(index))

    def identity(self, index: int) -> tuple[int, int, int, int]:
        """``(size, mtime_ns, inode, ctime_ns)`` of sample ``index`` at the scan (NOTE [file identity])."""
        return int(self.sizes[index]), int(self.mtimes[index]), int(self.inos[index]), int(self.ctimes[index])

    @property
    def total_bytes(self) -> int:
        """Bytes of all files (from the file's header when saved)."""
        if self._total is None:
            self._total = self.file.total_bytes if self.file is not None else int(self.sizes.sum())
        return self._total

    def kept_bytes(self, max_file_bytes: int) -> int:
        """Bytes of the files no larger than ``max_file_bytes`` (NOTE [bounded reads])."""
        largest = self.file.largest if self.file is not None else int(self.sizes.max(initial=0))
        if largest <= max_file_bytes:
            return self.total_bytes
        return int(self.sizes[self.sizes <= max_file_bytes].sum())

    def kept_count(self, max_file_bytes: int) -> int:
        """Files no larger than ``max_file_bytes``."""
        largest = self.file.largest if self.file is not None else int(self.sizes.max(initial=0))
        return len(self) if largest <= max_file_bytes else int((self.sizes <= max_file_bytes).sum())

    # -- pickling: NOTE [manifest pickles as its path] ----------------------------------
    def __reduce__(self):
        scan = (self.dir_mtimes, self.scanned_at, self.follow_external_links, self.skipped_files)
        if self.file is not None:
            return _mapped, (str(self.file.path), self.file.checksum, self.fingerprint, self.root, scan)
        return _unsaved, (self.root, self.classes, self.fingerprint, self._cols, scan)

    # -- scanning ---------------------------------------------------------------------
    @classmethod
    def scan(cls, root: str | os.PathLike, *, extensions: str | Sequence[str] | None = None,
             is_valid_file: Callable[[str], bool] | None = None, allow_empty: bool = False,
             follow_external_links: bool = False, class_to_idx: dict[str, int] | None = None,
             scan_threads: int = SCAN_THREADS) -> Manifest:
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
            class_to_idx: the classes and labels (0..n-1) a ``find_classes()`` gives (default: all, sorted).
            scan_threads: stats and listings in flight (NOTE [scan in flight]; same result).

        A manifest scanned with ``extensions``, ``is_valid_file`` or ``class_to_idx`` (or with empty classes)
        is not reused by :meth:`load_or_scan` (NOTE [manifest reuse]): those rules are not
        part of the saved pointer, so it records no directory mtimes.

        Raises:
            FileNotFoundError: ``root`` does not exist or is not a directory.
            EmptyFolderError: (a ``FileNotFoundError`` and ``ValueError``) no class folders,
                or class folders without any valid file; the message says what was found.
            ValueError: both ``extensions`` and ``is_valid_file`` given; labels of
                ``class_to_idx`` that are not 0..n-1.
        """
        if extensions is not None and is_valid_file is not None:
            raise ValueError("extensions and is_valid_file cannot both be given (as in torchvision's DatasetFolder)")
        custom = extensions is not None or is_valid_file is not None
        chosen = class_to_idx is not None and by_label(class_to_idx)
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
        with scan_pool(scan_threads) as pool:
            return cls._scan(root, entries, pool, scan_threads, started_ns, is_valid_file, custom, extensions,
                             ends if extensions is not None or not custom else None, allow_empty,
                             follow_external_links, chosen)

    @classmethod
    def _scan(cls, root: str, entries: list, pool, threads: int, started_ns: int, is_valid_file, custom: bool,
              extensions, ends, allow_empty: bool, follow_external_links: bool, chosen) -> Manifest:
        walker = Walker(root, follow_external_links, pool, threads)
        classes = walker.classes(root) if chosen is False else chosen
        if not classes:
            raise EmptyFolderError(no_class_folders(root, [e.name for e in entries]))
        walk = sorted(classes)  # torchvision walks sorted(class_to_idx)
        if chosen is not False:
            walker.mark(root, classes)
        label = {c: i for i, c in enumerate(classes)}
        files = walker.files([os.path.join(root, name) for name in walk], is_valid_file, [label[c] for c in walk])
        walker.warn()
        dir_mtimes = {".": os.stat(root).st_mtime_ns, **files.dir_mtimes}
        cols = files.rows.columns()
        empty = np.flatnonzero(np.bincount(cols.labels, minlength=len(classes)) == 0).tolist()
        if empty and not allow_empty:
            raise EmptyFolderError(no_valid_file(root, classes, empty, None if extensions is None and custom else ends))
        if custom or empty or chosen is not False:
            dir_mtimes = {}
        prefix = [os.path.join(root, c) for c in classes]
        cols = settle(cols, np.frombuffer(files.rows.devices, dtype=np.int64),  # NOTE [file identity]
                      lambda k: os.path.join(prefix[cols.labels[k]], os.fsdecode(cols.name(k))), started_ns,
                      pool.map)
        m = cls(root, classes, cols, dir_mtimes=dir_mtimes, scanned_at=started_ns / 1e9,
                follow_external_links=follow_external_links)
        m.skipped_files = files.irregular
        return m

    # -- persistence --------------------------------------------------------------------
    def save(self, cache_dir: str | os.PathLike) -> Path:
        """Write ``<cache_dir>/<fingerprint>/manifest.cpm`` (NOTE [manifest file]) unless a
        good one is there, map it (NOTE [manifest pickles as its path]) and, for a manifest
        that :meth:`load_or_scan` may reuse, write the source pointer (all atomic)."""
        cache_dir = Path(cache_dir)
        directory = private_dir(cache_dir / self.fingerprint)  # NOTE [private cache files]
        path = directory / FILE_NAME
        if self.file is None or self.file.path != path:
            try:
                saved = ManifestFile.open(path)
                if saved.fingerprint != self.fingerprint or saved.meta["root"] != self.root:  # the tree moved
                    raise ManifestFileError(f"{path} is of {saved.meta['root']!r}, fingerprint {saved.fingerprint}")
            except (OSError, ManifestFileError):
                meta = {"root": self.root, "classes": self.classes}  # the scan's time and rules: its pointer's
                checksum = write_manifest(path, meta, self._cols, self.fingerprint)
                saved = ManifestFile.open(path, verify=False, checksum=checksum)
            self._adopt(saved)
            (directory / _LEGACY).unlink(missing_ok=True)  # format 2's copy: NOTE [manifest reuse]
        if self.dir_mtimes:  # without them the manifest cannot be reused by root (Manifest.scan)
            write_pointer(self, cache_dir)
        return path

    def _adopt(self, saved: ManifestFile) -> None:
        """Serve from ``saved`` (the same files, mapped) from now on."""
        self._use(saved.columns)
        self.file = saved

    @classmethod
    def _from_file(cls, saved: ManifestFile) -> Manifest:
        meta = saved.meta
        m = cls.__new__(cls)
        m.root, m.classes = meta["root"], list(meta["classes"])
        m.class_to_idx = {c: i for i, c in enumerate(m.classes)}
        m.fingerprint, m.file = saved.fingerprint, saved
        m._use(saved.columns)
        m.dir_mtimes, m.skipped_files, m.scanned_at, m.follow_external_links = {}, [], 0.0, False  # the pointer's
        m.relpaths, m.samples, m.targets = Relpaths(m), Samples(m), Targets(m)
        return m

    @classmethod
    def load(cls, cache_dir: str | os.PathLike, fingerprint: str) -> Manifest:
        """Map a saved manifest by fingerprint (no file system scan; its checksum is verified).

        Raises:
            FileNotFoundError: no such manifest in ``cache_dir``.
            ManifestFileError: (a ``ValueError``) the file cannot be used; the message names it.
        """
        saved = ManifestFile.open(Path(cache_dir) / fingerprint / FILE_NAME)
        if saved.fingerprint != fingerprint:
            raise ManifestFileError(f"{saved.path} holds fingerprint {saved.fingerprint}, not {fingerprint}")
        return cls._from_file(saved)

    @classmethod
    def load_or_scan(cls, root: str | os.PathLike, cache_dir: str | os.PathLike, *,
                     verify: str = "dirs", rescan: bool = False, save: bool = True,
                     follow_external_links: bool = False, scan_threads: int = SCAN_THREADS,
                     shared=None) -> Manifest:
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
            scan_threads: as :meth:`scan` (also the stats of ``verify="files"``).
            shared: where other nodes' scans are published (a
                :class:`~cachepipe.shared_manifest.ManifestShare`): one is taken when the reuse
                check passes, and a new scan is published (NOTE [manifest through the store]).

        The ranks of a node scan once: the check and the scan hold a lock in ``cache_dir``
        and the others then load the saved scan (NOTE [one scan per node]).

        Raises:
            FileNotFoundError, ValueError: as :meth:`scan`; ValueError for a bad ``verify``.
        """
        return load_or_scan(cls, root, cache_dir, verify=verify, rescan=rescan, save=save,
                            follow_external_links=follow_external_links, scan_threads=scan_threads,
                            shared=shared)


def _mapped(path: str, checksum: int, fingerprint: str, root: str, scan: tuple) -> Manifest:
    """Unpickle a saved manifest: map its file again (NOTE [manifest pickles as its path])."""
    try:
        saved = ManifestFile.open(path, verify=False, checksum=checksum)
    except ManifestFileError:  # rewritten since (another rank's scan): verified whole, the same samples or none
        saved = ManifestFile.open(path)
    if saved.fingerprint != fingerprint or saved.meta["root"] != root:
        raise ManifestFileError(f"{path} now holds {saved.meta['root']!r}, fingerprint {saved.fingerprint}; "
                                f"expected {root!r}, {fingerprint}")
    m = Manifest._from_file(saved)
    m.dir_mtimes, m.scanned_at, m.follow_external_links, m.skipped_files = scan
    return m


def _unsaved(root: str, classes: list[str], fingerprint: str, cols: Columns, scan: tuple) -> Manifest:
    dir_mtimes, scanned_at, follow, skipped = scan
    m = Manifest(root, classes, cols, fingerprint=fingerprint, dir_mtimes=dir_mtimes, scanned_at=scanned_at,
                 follow_external_links=follow)
    m.skipped_files = skipped
    return m
