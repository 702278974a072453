"""The directory of an ``shm://`` store: its URL rule, where it lives, whether it may be
used, its size limit and what it takes.

NOTE [shm store directory]
``shm://`` names the per-user default ``/dev/shm/cachepipe-<uid>``; ``shm:///abs/path``
another directory (no host, user, password, port, query or fragment: one line naming the
URL otherwise). It holds one LMDB environment per namespace (``<namespace>/``, NOTE [shm
store] in ``shm.py``) and ``limit``, the store's size in bytes: the ``--l2-memory`` last
given (written atomically), else 25 % of RAM, shared by every namespace in it as one
embedded Redis's ``maxmemory`` is. Before a store is used (:func:`check`):
- the directory (and every existing part of it) must be this user's, mode 0700 (made so
  when it is created; tightened when it is ours), and not a symlink: a store another user
  made, or could change, is refused;
- it must be on a tmpfs (``statfs``; ``/dev/shm`` is one): the point of the store is
  memory every process maps, and on a disk it would be L1 again;
- the limit must fit the tmpfs's size and the machine's RAM, and when a limit is set
  (given for the first time or changed) it must fit what they have free beside the store
  (Docker's default ``/dev/shm`` is 64 MiB: the message says ``--shm-size``).
A refused store is one line naming the URL; reads then go to L1 (NOTE [shm failures]).
A directory that does not exist (tmpfs is empty after a reboot) is a cold store: it is
created by the first write, and reads before that miss. What the store takes is what
its files hold in the tmpfs (``st_blocks``: written pages, not the sparse map).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

from cachepipe.l2.redis_url import redact
from cachepipe.netfs import fs_magic
from cachepipe.private_files import write_private
from cachepipe.server.embedded import parse_memory

__all__ = ["TMPFS_MAGIC", "ShmRefused", "canonical", "check", "default_path", "free_bytes", "path_of",
           "read_limit", "record_limit", "used_bytes"]

TMPFS_MAGIC = 0x01021994
_LIMIT = "limit"


class ShmRefused(OSError):
    """An ``shm://`` store that must not be used here; the message is one line naming its URL.

    Attributes:
        why: what is wrong, without the URL.
    """

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"L2 store {url}: {why}")
        self.why = why


def default_path() -> Path:
    """``/dev/shm/cachepipe-<uid>``: the store ``shm://`` names for this user."""
    return Path("/dev/shm") / f"cachepipe-{os.geteuid()}"


def path_of(url: str) -> Path:
    """The directory ``url`` names (NOTE [shm store directory]; raises as :func:`canonical`)."""
    canonical(url)
    path = unquote(urlsplit(url).path)
    return Path(os.path.normpath(path)) if path not in ("", "/") else default_path()


def canonical(url: str) -> str:
    """The URL rule of ``shm://`` (NOTE [shm store directory]): ``shm://`` or ``shm://`` plus
    an absolute path, normalised.

    Raises:
        ValueError: anything else, in one line naming the URL.
    """
    parts, shown = urlsplit(url), redact(url)
    rule = "shm:// (this user's /dev/shm/cachepipe-<uid>) or shm:///absolute/path"
    if parts.scheme != "shm":
        raise ValueError(f"{shown!r} is not an shm:// URL: use {rule}")
    if parts.netloc or parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ValueError(f"L2 URL {shown!r}: an shm:// URL takes no host, user, password, port or query: use {rule}")
    path = unquote(parts.path)
    if path in ("", "/"):
        return "shm://"
    if "\0" in path:
        raise ValueError(f"L2 URL {shown!r}: the path holds a NUL byte")
    return "shm://" + os.path.normpath(path)


def _owned(url: str, path: Path) -> None:
    """Refuse ``path`` unless it is a real directory of this user; tighten it to 0700."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ShmRefused(url, f"{path} is not a directory (a symlink or a file): refusing to keep samples there")
    if st.st_uid != os.geteuid():
        raise ShmRefused(url, f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}): a store "
                           f"another user made is never used; pass another shm:///path")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)


def _meminfo(field: str) -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def free_bytes(path: Path) -> tuple[int, int]:
    """(size, free bytes) of the file system holding ``path``."""
    vfs = os.statvfs(path)
    return vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize


def check(url: str, path: Path, limit: int, *, setting: bool, create: bool) -> bool:
    """Refuse ``path`` as the store of ``url`` unless NOTE [shm store directory] holds;
    returns whether the directory exists (``create``: made first).

    Args:
        limit: the store's size in bytes; ``setting``: it is being set (checked against
            what is free, not only against the totals).

    Raises:
        ShmRefused: one line naming ``url`` and what is wrong.
    """
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    magic = fs_magic(probe)
    if magic is not None and magic != TMPFS_MAGIC:
        raise ShmRefused(url, f"{path} is not on a tmpfs ({probe} is a file system of type {magic:#x}): an shm:// "
                           f"store lives in memory; use shm:// (/dev/shm) or a path on a tmpfs")
    if not path.exists() and not (probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)):
        raise ShmRefused(url, f"{path} cannot be written ({probe} is not a directory this user may write in)")
    if path.exists() or create:
        try:
            for part in [path, *path.parents][:len(path.relative_to(probe).parts)][::-1]:
                part.mkdir(mode=0o700, exist_ok=True)
            _owned(url, path)
        except ShmRefused:
            raise
        except OSError as exc:
            raise ShmRefused(url, f"{path} cannot be written ({exc.strerror or exc})") from None
    size, free = free_bytes(probe)
    ram = _meminfo("MemTotal")
    if limit > size or (ram and limit > ram):
        small, total = ("the tmpfs", size) if limit > size else ("RAM", ram)
        raise ShmRefused(url, f"--l2-memory {_mib(limit)} is more than {small} holds ({_mib(total)} at {probe}): lower "
                           f"--l2-memory, or give the tmpfs more (in Docker: docker run --shm-size=...)")
    used = used_bytes(path) if path.exists() else 0
    room = min(free, _meminfo("MemAvailable") or free) + used
    if setting and limit > room:
        raise ShmRefused(url, f"--l2-memory {_mib(limit)} is more than is free for it ({_mib(room)} of the "
                           f"{_mib(size)} tmpfs at {probe}, this store's {_mib(used)} included): lower --l2-memory, "
                           f"or free memory (in Docker: docker run --shm-size=...)")
    return path.exists()


def read_limit(path: Path) -> int | None:
    """The limit recorded in the store ``path`` (None: none, or unreadable)."""
    try:
        return max(1, int((path / _LIMIT).read_text()))
    except (OSError, ValueError):
        return None


def record_limit(path: Path, limit: int) -> None:
    """Record ``limit`` as the store's size (atomic, 0600)."""
    write_private(path / _LIMIT, str(int(limit)).encode())


def default_limit() -> int:
    """25 % of RAM, as the embedded Redis's default."""
    return parse_memory(None)


def used_bytes(path: Path) -> int:
    """Bytes the store's files hold in memory (written pages of every environment in it)."""
    total = 0
    try:
        entries = list(os.scandir(path))
    except OSError:
        return 0
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            for name in ("data.mdb", "lock.mdb"):
                try:
                    total += os.lstat(os.path.join(entry.path, name)).st_blocks * 512
                except OSError:
                    pass
    return total
