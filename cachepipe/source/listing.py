"""The file system calls of a scan, many in flight: directory listings and file stats.

NOTE [scan in flight]
On NFS a ``stat`` or a ``readdir`` costs a round trip to the server (0.5-1 ms), not CPU:
1.28M files stat'ed one after another are 11-21 minutes. The scan therefore issues its
calls from a thread pool (``scan_threads``, default :data:`SCAN_THREADS`; the GIL is
released while a thread waits), in two passes whose results do not depend on which
thread finishes first:

1. :func:`list_tree` lists every real directory below the class folders, a level at a
   time, all directories of a level at once. A listing is keyed by the directory's
   ``(st_dev, st_ino)`` and holds what the walk asks of each entry (a link's target,
   whether it is a directory and its key) as names and small tuples, so the serial walk
   of NOTE [symlinks in the source] is then replayed from memory with no system call and
   gives exactly the order and the "seen" decisions it always gave.
2. :func:`stat_files` stats the files of that walk in chunks, a bounded number of chunks
   ahead, and hands them back in walk order.

What is kept of a file is its name in the listing and then its row of NOTE [manifest
columns] (never an ``os.stat_result``): a scan of 100k files peaks well under 100 MB.
Errors are those of the serial walk: a directory that cannot be listed, a file that
vanished (skipped) or cannot be stat'ed (one warning), and an error of the root itself
(the source went away) raised as it is.
"""
from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor

from cachepipe.source.file_identity import is_regular

__all__ = ["SCAN_THREADS", "Listing", "inside", "list_tree", "scan_pool", "stat_files"]

SCAN_THREADS = 32  # calls in flight: enough to hide ~1 ms of NFS latency per call at ~30k calls/s
_CHUNK = 32  # files per stat task: small enough that a folder of 100 files is 4 calls in flight
_AHEAD = 4  # chunks in flight per thread


def scan_pool(threads: int) -> ThreadPoolExecutor:
    """The pool a scan issues its calls from (``threads`` >= 1)."""
    if threads < 1:
        raise ValueError(f"scan_threads must be >= 1, got {threads}")
    return ThreadPoolExecutor(threads, thread_name_prefix="cachepipe-scan")


class Listing:
    """One directory as the walk sees it (NOTE [scan in flight]).

    Attributes:
        mtime_ns: the directory's mtime, or the ``OSError`` of its stat.
        error: why it cannot be listed (``strerror``), or ``None``.
        entries: sorted by name; a plain file is its name (``str``); anything else a tuple
            ``(name, kind, value)``: kind ``"out"`` a link leaving the root (value: its real
            path), ``"file"`` a followed link that is not a directory, ``"dir"`` a directory
            (value: its key), ``"bad"`` a directory whose stat fails (value: ``strerror``).
    """

    __slots__ = ("mtime_ns", "error", "entries")

    def __init__(self, mtime_ns, error, entries) -> None:
        self.mtime_ns, self.error, self.entries = mtime_ns, error, entries


def inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or below it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def list_dir(path: str, root_real: str, follow_external: bool) -> Listing:
    """The :class:`Listing` of ``path`` (runs in a pool thread)."""
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError as exc:
        mtime = exc
    try:
        with os.scandir(path) as it:
            found = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        return Listing(mtime, exc.strerror or str(exc), [])
    entries: list = []
    for e in found:
        link = e.is_symlink()
        if link and not follow_external:
            real = os.path.realpath(e.path)
            if not inside(real, root_real):
                entries.append((e.name, "out", real))
                continue
        try:
            is_dir = e.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            entries.append((e.name, "file", None) if link else e.name)
            continue
        try:
            st = os.stat(e.path)
            entries.append((e.name, "dir", (st.st_dev, st.st_ino)))
        except OSError as exc:
            entries.append((e.name, "bad", exc.strerror))
    return Listing(mtime, None, entries)


def list_tree(pool: Executor, tops: list[tuple[str, tuple[int, int]]], root_real: str,
              follow_external: bool) -> dict[tuple[int, int], Listing]:
    """Listings of ``tops`` (``(path, key)``) and every real directory below them, each
    directory listed once whatever the number of paths to it (NOTE [scan in flight])."""
    listings: dict[tuple[int, int], Listing] = {}
    level = []
    for path, key in tops:
        if key not in listings:
            listings[key] = None  # claimed
            level.append((path, key))
    while level:
        got = pool.map(lambda pk: list_dir(pk[0], root_real, follow_external), level)
        below = []
        for (path, key), listing in zip(level, got):
            listings[key] = listing
            for entry in listing.entries:
                if type(entry) is tuple and entry[1] == "dir" and entry[2] not in listings:
                    listings[entry[2]] = None
                    below.append((os.path.join(path, entry[0]), entry[2]))
        level = below
    return listings


def _stat_chunk(paths: list[str]) -> list:
    """Per path ``(size, mtime_ns, inode, ctime_ns, dev)``, ``"irregular"``, ``None``
    (vanished: a dangling link) or the ``strerror`` of a failed stat."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
        except FileNotFoundError:
            out.append(None)
            continue
        except OSError as exc:
            out.append(exc.strerror or str(exc))
            continue
        out.append((st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, st.st_dev) if is_regular(st)
                   else "irregular")
    return out


def stat_files(pool: Executor, files: Iterable[tuple], path_of: Callable[[tuple], str], threads: int
               ) -> Iterator[tuple[tuple, object]]:
    """``(item, result)`` for every item of ``files`` in order, ``result`` as
    :func:`_stat_chunk` gives it; at most ``threads * 4`` chunks in flight."""
    it = iter(files)
    pending: deque = deque()

    def submit() -> bool:
        chunk = [x for _, x in zip(range(_CHUNK), it)]
        if chunk:
            pending.append((chunk, pool.submit(_stat_chunk, [path_of(x) for x in chunk])))
        return bool(chunk)

    while len(pending) < threads * _AHEAD and submit():
        pass
    while pending:
        chunk, fut = pending.popleft()
        submit()
        yield from zip(chunk, fut.result())
