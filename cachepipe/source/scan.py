"""Walk one class folder of an ImageFolder tree the way the manifest needs it.

NOTE [symlinks in the source]
``torchvision``'s ``os.walk(followlinks=True)`` follows every link: a link to a private
file elsewhere copies its bytes into the cache, and a loop (``a/loop -> ..``) repeats
the tree, files and labels included, until the path is too long. Here:
- a link (to a file or a directory) is followed only while its real path stays inside
  the real source root; others are skipped with one warning listing them, unless
  ``follow_external_links`` (``--follow-external-links``) allows them;
- every real directory is walked once: the root and every class folder are marked as
  seen before the walk, so a link to one of them, or to a directory already walked, is
  skipped (with the warning) instead of giving its files a second index or another
  class's label;
- names are kept as the file system gives them; a name that is not UTF-8 is carried
  with ``surrogateescape`` (``os.fsdecode``) and hashed as bytes (``os.fsencode``).
The check is made at scan time; a link changed afterwards changes its directory's mtime
and so forces a rescan (NOTE [manifest reuse]). Only regular files are samples: a FIFO,
socket or device named like an image is left out with a warning (opening a FIFO blocks
until a writer comes, reading a device may never end), and so is a file that cannot be
stat'ed (a path longer than the kernel's 4 KB ``PATH_MAX``: it could never be opened),
named in the warning. What the walk keeps of each file is a row of NOTE [manifest
columns], never its ``os.stat_result``; its system calls run many at a time (NOTE [scan
in flight] in ``source/listing.py``) and its decisions are made in this order.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

from cachepipe.errors import CacheWarning
from cachepipe.source.columns import ColumnsBuilder
from cachepipe.source.listing import inside, list_tree, stat_files

__all__ = ["Files", "Walker", "by_label", "no_class_folders", "no_valid_file"]


@dataclass
class Files:
    """The files of a walk over the class folders, in sample order (rows of NOTE [manifest columns])."""

    rows: ColumnsBuilder = field(default_factory=ColumnsBuilder)
    dir_mtimes: dict[str, int] = field(default_factory=dict)  # relative to the root
    irregular: list[str] = field(default_factory=list)  # named like images, not regular files


class Walker:
    """Walks the class folders of one root, sharing the set of directories seen; its system
    calls are issued from ``pool`` (NOTE [scan in flight]), its decisions replayed in order.

    Args:
        root: the source root (absolute).
        follow_external_links: follow links whose target is outside ``root``.
        pool: the scan's thread pool (:func:`~cachepipe.source.listing.scan_pool`).
        threads: its size (how many stat chunks are kept in flight).
    """

    def __init__(self, root: str, follow_external_links: bool = False, pool: Executor | None = None,
                 threads: int = 1) -> None:
        self.root = root
        self.root_real = os.path.realpath(root)
        self.irregular: list[str] = []
        self.follow_external = follow_external_links
        self.skipped: list[tuple[str, str]] = []  # links and unlistable directories: (path, why)
        self.unstatable: list[tuple[str, str]] = []  # entries whose stat fails: (path, error)
        self.pool = pool if pool is not None else ThreadPoolExecutor(1)
        self.threads = threads
        self.seen = {self._key(root)}
        self._class_keys: dict[str, tuple[int, int]] = {}

    def classes(self, root: str) -> list[str]:
        """The class folder names of ``root``, sorted, each a distinct real directory
        inside the root (or outside it when allowed); marks them seen."""
        with os.scandir(root) as it:
            entries = sorted((e for e in it if e.is_dir()), key=lambda e: e.name)
        entries = [e for e in entries if not e.is_symlink() or self.allowed(e.path)]
        names = []
        for e, key in zip(entries, self.pool.map(lambda e: self._key(e.path), entries)):
            if key in self.seen:
                self.skipped.append((e.path, "is a link to the root or to another class folder"))
                continue
            self.seen.add(key)
            self._class_keys[e.path] = key
            names.append(e.name)
        return names

    def mark(self, root: str, classes: list[str]) -> None:
        """Mark the folders of ``classes`` (chosen by a ``find_classes()``, not listed) seen."""
        for name in classes:
            path = os.path.join(root, name)
            try:
                key = self._key(path)
            except OSError:  # a class without a folder: files() says it cannot be listed
                continue
            self.seen.add(key)
            self._class_keys[path] = key

    @staticmethod
    def _key(path: str) -> tuple[int, int]:
        st = os.stat(path)
        return st.st_dev, st.st_ino

    def allowed(self, path: str) -> bool:
        """Whether a symlink at ``path`` may be followed (records why not)."""
        real = os.path.realpath(path)
        if self.follow_external or inside(real, self.root_real):
            return True
        self.skipped.append((path, f"points outside the source root, to {real!r}"))
        return False

    def walk(self, top: str, listings: dict) -> list[tuple[str, list[str], object]]:
        """``(dirpath, file names, mtime_ns)`` of ``top`` and the directories below it, each
        real directory once, sorted by ``dirpath`` (as ``sorted(os.walk(top))``), replayed
        from ``listings`` (:func:`~cachepipe.source.listing.list_tree`)."""
        out: list[tuple[str, list[str], object]] = []
        stack = [(top, self._class_keys[top])]
        while stack:
            d, key = stack.pop()
            listing = listings[key]
            if listing.error is not None:  # os.walk skips these silently; we say so
                self.skipped.append((d, f"cannot be listed ({listing.error})"))
                continue
            files: list[str] = []
            for entry in listing.entries:
                if type(entry) is str:
                    files.append(entry)
                    continue
                name, kind, value = entry
                path = os.path.join(d, name)
                if kind == "out":
                    self.skipped.append((path, f"points outside the source root, to {value!r}"))
                elif kind == "file":
                    files.append(name)
                elif kind == "bad":  # e.g. ENAMETOOLONG: a path the kernel cannot open
                    self.unstatable.append((path, value))
                elif value in self.seen:
                    self.skipped.append((path, "is a directory already walked (a loop or a second "
                                               "link to it)"))
                else:
                    self.seen.add(value)
                    stack.append((path, value))
            out.append((d, files, listing.mtime_ns))
        out.sort(key=lambda row: row[0])
        return out

    def files(self, class_dirs: list[str], is_valid_file: Callable[[str], bool],
              labels: list[int] | None = None) -> Files:
        """Every valid regular file under ``class_dirs`` (label: ``labels``' entry, default the
        position), stat'ed, in torchvision's order; irregular ones are listed apart (see :meth:`warn`)."""
        out = Files()
        listed = [d for d in class_dirs if d in self._class_keys]
        for d in class_dirs:
            if d not in self._class_keys:  # a find_classes() class without a folder
                self.skipped.append((d, "cannot be listed (no such directory)"))
        listings = list_tree(self.pool, [(d, self._class_keys[d]) for d in listed], self.root_real,
                             self.follow_external)
        walks = []
        for top in class_dirs:
            walks.append(self.walk(top, listings) if top in self._class_keys else [])
            for dirpath, _, mtime in walks[-1]:
                if isinstance(mtime, OSError):
                    raise mtime
                out.dir_mtimes[os.path.relpath(dirpath, self.root)] = mtime
        del listings

        def valid():
            for label, top, walked in zip(range(len(class_dirs)) if labels is None else labels, class_dirs, walks):
                for dirpath, fnames, _ in walked:
                    below = os.path.relpath(dirpath, top)
                    for fname in fnames:  # sorted by the walk
                        full = os.path.join(dirpath, fname)
                        if is_valid_file(full):
                            yield full, (fname if below == "." else os.path.join(below, fname)), label

        rows = out.rows
        for (full, name, label), got in stat_files(self.pool, valid(), lambda item: item[0], self.threads):
            if got is None:  # dangling symlink: ImageFolder would fail to open it too
                continue
            if type(got) is str:
                if got == "irregular":
                    out.irregular.append(full)
                else:  # e.g. ENAMETOOLONG: a path the kernel cannot open
                    self.unstatable.append((full, got))
                continue
            rows.set_row(rows.add(name, label), got)
        self.irregular = out.irregular
        return out

    def warn(self) -> None:
        """One warning for each kind of entry left out: irregular files, files that cannot be
        stat'ed, links (if any)."""
        if self.irregular:
            n = len(self.irregular)
            shown = ", ".join(repr(p) for p in self.irregular[:5]) + (f" (and {n - 5} more)" if n > 5 else "")
            warnings.warn(f"skipped {n} source entr{'y' if n == 1 else 'ies'} named like an image but not a "
                          f"regular file (a FIFO, socket or device: reading one can block forever): {shown}",
                          CacheWarning, stacklevel=5)
        if self.unstatable:
            n = len(self.unstatable)
            shown = "; ".join(f"{_short(p)!r} ({why})" for p, why in self.unstatable[:5])
            warnings.warn(f"skipped {n} source entr{'y' if n == 1 else 'ies'} that cannot be stat'ed (e.g. a path "
                          f"over the kernel's 4 KB limit, which no process can open): {shown}"
                          + (f" (and {n - 5} more)" if n > 5 else ""), CacheWarning, stacklevel=5)
        if not self.skipped:
            return
        shown = "; ".join(f"{_short(p)!r} {why}" for p, why in self.skipped[:5])
        more = f" (and {len(self.skipped) - 5} more)" if len(self.skipped) > 5 else ""
        warnings.warn(f"skipped {len(self.skipped)} link(s) in the source: {shown}{more}; pass "
                      f"follow_external_links=True (--follow-external-links) to follow links that "
                      f"leave the root", CacheWarning, stacklevel=5)


def by_label(class_to_idx: dict[str, int]) -> list[str]:
    """The classes of a ``find_classes()`` mapping in label order.

    Raises:
        ValueError: the labels are not 0..n-1, each once (a manifest stores a sample's label as
            the index of its class folder).
    """
    classes = sorted(class_to_idx, key=lambda c: class_to_idx[c])
    if [class_to_idx[c] for c in classes] != list(range(len(classes))):
        raise ValueError(f"find_classes() must label its {len(classes)} classes 0..{len(classes) - 1}, each once; "
                         f"got {dict(sorted(class_to_idx.items(), key=lambda kv: kv[1])[:5])}")
    return classes


# NOTE [torchvision's messages]: an empty root and an empty class folder raise what
# torchvision's ImageFolder raises (FileNotFoundError, as EmptyFolderError is) with its
# words first, so code matching them keeps working; what cachepipe adds follows.
def no_class_folders(root: str, entries: list[str]) -> str:
    """The message for a root without class folders (NOTE [torchvision's messages])."""
    files = sorted(entries)
    shown = ", ".join(files[:5]) + (", ..." if len(files) > 5 else "")
    return (f"Couldn't find any class folder in {root}. An ImageFolder root holds one folder per class; found "
            f"{len(files)} other entries" + (f": {shown}" if files else ""))


def no_valid_file(root: str, classes: list[str], empty: list[int], ends: tuple[str, ...] | None) -> str:
    """The message for class folders without a valid file (NOTE [torchvision's messages]);
    ``ends``: the extensions, None when ``is_valid_file`` chose."""
    msg = f"Found no valid file for the classes {', '.join(sorted(classes[e] for e in empty))}. "
    if ends is not None:
        msg += f"Supported extensions are: {', '.join(ends)}"
    return msg.rstrip() + f" ({len(empty)} of {len(classes)} class folders in {root!r})"


def _short(path: str, keep: int = 120) -> str:
    """``path`` with its middle elided past ``keep`` characters (a 4 KB path in a warning line)."""
    return path if len(path) <= keep else f"{path[:keep // 2]}...{path[-keep // 2:]}"
