"""Output paths of the command line, checked before the work and written without a traceback.

NOTE [output paths checked first]: a command that writes a file at the end (``--json``,
``report --out``) or a run directory (``train --out``) used to do all its work, which can
take hours, and then end in a traceback because the path was on a read-only file system
or in a directory it may not enter. So the path is checked when the flags are, before
anything starts: the nearest existing folder on its way must be a directory this user
may write and enter, on a file system mounted read-write (``os.access`` alone says yes
to root on a read-only mount). A path can still fail later (a full disk, a folder
removed meanwhile); writing goes through :func:`write_output`, which turns that into the
same one line. Both raise ``UsageError``: exit 2 with one line naming the flag.
"""
from __future__ import annotations

import os
from pathlib import Path

from tools.cli import UsageError

__all__ = ["add_json_flag", "check_writable", "unwritable", "write_output"]


def unwritable(path: str | os.PathLike, *, directory: bool = False) -> str | None:
    """Why ``path`` cannot be created or replaced (a file, or a ``directory`` to write
    into), or None when it can (NOTE [output paths checked first])."""
    path = Path(path).absolute()
    if path.is_dir() and not directory:
        return "it is a directory"
    if path.exists() and directory and not path.is_dir():
        return "it is a file"
    folder = path if directory else path.parent
    while not os.path.lexists(folder):
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a directory"
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"{folder} is on a read-only file system"
    except OSError as exc:
        return f"{folder}: {exc.strerror or exc}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable by this user"
    return None


def check_writable(path: str | os.PathLike | None, flag: str, *, directory: bool = False) -> None:
    """Refuse an output ``path`` of ``flag`` that cannot be written (nothing when None).

    Raises:
        UsageError: one line naming the flag, the path and why.
    """
    if path is None:
        return
    why = unwritable(path, directory=directory)
    if why:
        raise UsageError(f"{flag} {path}: cannot write there ({why})")


def write_output(path: str | os.PathLike, data: str | bytes, flag: str) -> Path:
    """Write ``data`` to ``path`` atomically (``trainer.atomic_file.write_atomic``).

    Raises:
        UsageError: it could not be written (one line naming the flag and the error).
    """
    from trainer.atomic_file import write_atomic

    try:
        return write_atomic(path, data)
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename and os.fspath(exc.filename) != os.fspath(path) else ""
        raise UsageError(f"{flag} {path}: cannot write it ({exc.strerror or exc}{where})") from None


def add_json_flag(parser, what: str, *, to_file: bool = True) -> None:
    """The one ``--json`` flag of every command (``parser``: a parser or an argument group).

    ``to_file``: ``--json PATH`` writes ``what`` to PATH (the command checks PATH with
    :func:`check_writable` before any work); otherwise a switch that prints ``what`` as JSON
    instead of text (``stats``, ``drop``, ``server status``).
    """
    kind = (dict(default=None, metavar="PATH", help=f"write {what} as JSON to PATH") if to_file
            else dict(action="store_true", help=f"print {what} as JSON instead of text"))
    parser.add_argument("--json", **kind)
