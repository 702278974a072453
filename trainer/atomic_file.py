"""Writing a file atomically: the one helper for checkpoints, metrics, reports and the tools' JSON.

NOTE [atomic files]
A reader (a resumed run, ``cachepipe report``, a benchmark's parent process) must see the
old file or the new one, never half of one. So every file is written under a temporary
name in the same folder and moved over the old one with ``os.replace``. The temporary file
is made with ``open(..., 0o666)``, not ``mkstemp``: mkstemp makes it 0600, and these files
get the umask's mode like any other the user writes (the cache's own files are private
instead: NOTE [private cache files] in ``cachepipe/private_files.py``). ``comm`` imports
torch only, so ``comm.omgs.save_profile`` writes its one JSON file the same way itself.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: str | os.PathLike, data: bytes | bytearray | memoryview | str, *,
                 fsync: bool = False) -> Path:
    """Replace ``path`` with ``data`` (``str`` is written as UTF-8) atomically, creating its
    folder; returns ``Path(path)``.

    Args:
        path: the file to write.
        data: its new content.
        fsync: flush the data to the disk before the rename (checkpoints).

    Raises:
        OSError: it cannot be written; the previous file at ``path`` is kept.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
