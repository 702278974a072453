"""Where the embedded server's Unix socket lives, and the checks before it is used.

NOTE [private socket]
The socket is ``<cache_dir>/redis/redis.sock`` (the ``redis`` directory is 0700, see
NOTE [private cache files]). When that path exceeds the ~100-byte Unix socket limit it
goes to ``$XDG_RUNTIME_DIR/cachepipe-<uid>/`` or ``<tmp>/cachepipe-<uid>/``, a directory
created 0700 and used only while it is a real directory owned by this user and closed to
everyone else; the socket's name there is a hash of the cache dir. That name is
predictable, so another user can create it first (in a shared ``/tmp``): then the start
makes a fresh private directory with ``mkdtemp`` (created 0700 by this user, with a name
nobody could guess) and records the socket path in ``<cache_dir>/redis/socket``, where
every process of the cache dir finds it; the other user's directory is never used.
Before a client connects, the socket file must be a socket owned by this user in a
private directory: a server someone else bound at that path is never talked to.
"""
from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import warnings
from pathlib import Path

from cachepipe.errors import CacheWarning
from cachepipe.private_files import write_private

__all__ = ["SOCKET_MAX", "check_socket", "prepare_dir", "socket_path"]

SOCKET_MAX = 100
_RECORD = "socket"  # <cache_dir>/redis/socket: the socket path when it is not the default


def _runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    if not base or not os.path.isdir(base):
        base = tempfile.gettempdir()
    return Path(base) / f"cachepipe-{os.geteuid()}"


def _check_private_dir(path: Path) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise PermissionError(f"socket directory {path} must be a directory owned by uid "
                              f"{os.geteuid()} with mode 0700 (it is uid {st.st_uid}, mode "
                              f"{stat.S_IMODE(st.st_mode):o}{'' if stat.S_ISDIR(st.st_mode) else ', not a directory'}); "
                              f"refusing to use it")


def socket_path(redis_dir: Path) -> Path:
    """The socket path for the embedded server whose files are in ``redis_dir``."""
    local = redis_dir / "redis.sock"
    if len(str(local)) <= SOCKET_MAX:
        return local
    try:
        recorded = os.fsdecode((redis_dir / _RECORD).read_bytes())
        if recorded.startswith("/"):
            return Path(recorded)
    except OSError:
        pass
    tag = hashlib.sha256(os.fsencode(redis_dir)).hexdigest()[:16]
    return _runtime_dir() / f"{tag}.sock"


def prepare_dir(path: Path, redis_dir: Path) -> Path:
    """Create the socket's directory (0700) if needed and check it is ours alone; returns
    the socket path to use (NOTE [private socket]).

    A shared directory (``cachepipe-<uid>`` in ``$XDG_RUNTIME_DIR`` or the temp dir) that
    is not ours alone is replaced by a fresh private one, recorded in ``redis_dir``.

    Raises:
        PermissionError: the socket's directory inside the cache dir is not ours alone.
    """
    try:
        os.mkdir(path.parent, 0o700)
    except FileExistsError:
        pass
    try:
        _check_private_dir(path.parent)
        return path
    except PermissionError as exc:
        if path.parent == redis_dir:
            raise
        prefix = f"cachepipe-{os.geteuid()}-"  # mkdtemp adds 8 characters
        fits = [d for d in (path.parent.parent, Path(tempfile.gettempdir()))
                if len(str(d / f"{prefix}12345678" / path.name)) <= SOCKET_MAX]
        fresh = Path(tempfile.mkdtemp(prefix=prefix, dir=(fits or [Path("/tmp")])[0])) / path.name
        write_private(redis_dir / _RECORD, os.fsencode(fresh))
        warnings.warn(f"{exc}; the embedded Redis listens in a fresh private directory instead: {fresh.parent}",
                      CacheWarning, stacklevel=3)
        return fresh


def check_socket(path: Path) -> bool:
    """Whether ``path`` is a socket this user may talk to (``False`` if absent).

    Raises:
        PermissionError: it exists but is not a socket owned by this user, or its
            directory is not private.
    """
    _check_private_dir(path.parent)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"{path} is {'a socket' if stat.S_ISSOCK(st.st_mode) else 'not a socket'} "
                              f"owned by uid {st.st_uid}, not by this user ({os.geteuid()}); "
                              f"refusing to use it as the embedded Redis")
    return True
