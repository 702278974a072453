"""Open the L1 mirror so that a broken or unwritable one degrades instead of failing.

NOTE [L1 guard]
Before LMDB maps ``data.mdb`` its header is checked (NOTE [LMDB header check]): a
truncated file would otherwise end the process with SIGBUS. What happens then:
- the file is broken (truncated, garbage, LMDB says invalid/corrupted): the writer moves
  the whole ``l1`` directory aside to ``l1.bad-<time>-<pid>`` (kept for inspection, never
  deleted) and starts an empty mirror; reads meanwhile come from L2 and the source, and
  the next warm-up refills it. Counter ``l1_quarantined``, one warning.
- the file is fine but cannot be written here (read-only directory or file system, full
  disk at open): it is opened read-only and used for reads; writes are off in this
  process. One warning.
- nothing works (the move fails too): L1 is bypassed in this process. Counter
  ``l1_errors``, one warning. A warm-up, whose work is to fill L1, stops instead (exit 6,
  naming the reason): it cannot even ask a bypassed L1 what it lacks.
A read that fails inside LMDB later bypasses L1 the same way (see ``l1/raw_levels.py``).
``cachepipe stats`` uses :func:`inspect_l1`, which only ever reads. The quarantine runs
under ``flock`` on ``<fingerprint>/l1.lock`` so that concurrent workers move the broken
directory once. A file truncated while it is mapped cannot be caught (SIGBUS); only
deleting or truncating cache files by hand does that.
"""
from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections import Counter
from pathlib import Path

import lmdb

from cachepipe.errors import CacheWarning
from cachepipe.l1.lmdb_check import data_file_problem
from cachepipe.l1.mirror import L1Mirror
from cachepipe.private_files import exclusive_lock

__all__ = ["inspect_l1", "open_l1"]

_BROKEN = (lmdb.InvalidError, lmdb.CorruptedError, lmdb.VersionMismatchError,
           lmdb.PageNotFoundError, lmdb.PanicError)


def _problem(path: Path) -> str | None:
    data = path / "data.mdb"
    if not data.exists():
        return None
    try:
        return data_file_problem(data)
    except OSError as exc:
        return f"cannot read {data}: {exc}"


@contextlib.contextmanager
def _guard(path: Path):
    with exclusive_lock(path.parent / "l1.lock"):  # read-only or full: nobody can move the directory anyway
        yield


def _warn(message: str) -> None:
    warnings.warn(message, CacheWarning, stacklevel=4)


def open_l1(path: str | os.PathLike, map_size: int, counters: Counter,
            why: list[str] | None = None) -> tuple[L1Mirror | None, bool]:
    """The process-wide mirror at ``path`` and whether it may be written (NOTE [L1 guard]).

    Args:
        why: when given, the reason L1 is bypassed is appended to it (the warm-up names it).

    Returns:
        ``(mirror, writable)``; ``(None, False)`` when L1 is bypassed.
    """
    why = [] if why is None else why
    path = Path(path)
    with _guard(path):
        problem = _problem(path)
        if problem is None:
            try:
                return L1Mirror.shared(path, map_size), True
            except _BROKEN as exc:
                problem = f"{type(exc).__name__}: {exc}"
            except (lmdb.Error, OSError) as exc:
                return _read_only(path, map_size, counters, f"{type(exc).__name__}: {exc}", why)
        dest = path.with_name(f"l1.bad-{int(time.time())}-{os.getpid()}")
        try:
            os.rename(path, dest)
        except OSError as exc:
            return _bypassed(counters, why, f"L1 mirror {path} is unusable ({problem}) and cannot be moved aside "
                             f"({exc})")
        counters["l1_quarantined"] += 1
        _warn(f"L1 mirror {path} is unusable ({problem}); moved it to {dest} and started an "
              f"empty one (reads come from L2 and the source until it is refilled)")
        try:
            return L1Mirror.shared(path, map_size), True
        except (lmdb.Error, OSError) as exc:
            return _bypassed(counters, why, f"cannot create a new L1 mirror at {path} ({exc})")


def _bypassed(counters: Counter, why: list[str], problem: str) -> tuple[None, bool]:
    counters["l1_errors"] += 1
    why.append(problem)
    warnings.warn(f"{problem}; L1 is bypassed: reads come from L2 and the source", CacheWarning, stacklevel=4)
    return None, False


def _read_only(path: Path, map_size: int, counters: Counter, error: str,
               why: list[str]) -> tuple[L1Mirror | None, bool]:
    mirror, problem = inspect_l1(path, map_size)
    if mirror is None:
        return _bypassed(counters, why, f"cannot open L1 mirror {path} ({error}; read-only: {problem})")
    _warn(f"L1 mirror {path} cannot be written here ({error}); reading it, not writing it")
    return mirror, False


def inspect_l1(path: str | os.PathLike, map_size: int = 1 << 20) -> tuple[L1Mirror | None, str | None]:
    """Open ``path`` read-only without writing anything to it (``cachepipe stats``).

    Returns:
        ``(mirror, None)``, or ``(None, problem)`` when it is absent or unusable.
    """
    path = Path(path)
    if not (path / "data.mdb").exists():
        return None, "absent"
    problem = _problem(path)
    if problem is not None:
        return None, problem
    try:
        return L1Mirror(path, map_size, readonly=True), None
    except (lmdb.Error, OSError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
