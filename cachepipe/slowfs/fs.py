"""The FUSE operations of slowfs: SRC read-only, each request delayed as a share would
delay it (NOTE [slowfs profile]), through ``mfusepy`` (libfuse 3, multithreaded).

NOTE [slowfs requests overlap]
libfuse's multithreaded loop hands each kernel request to a worker thread, and ctypes
releases the GIL around every ``time.sleep``, so requests in flight wait out their latency
together, as an NFS client's RPC slots do; nothing but the bandwidth bucket (NOTE [shared
bandwidth]) and the counters take a lock, each for microseconds.

NOTE [slowfs caching]
The kernel keeps a file's pages only while it is open: FUSE drops them at every open
unless the file system asks to keep them (``keep_cache``, never set here), so each epoch
that reopens a file reads it from the share again, as a training set larger than RAM
does on NFS. Attributes and names are cached for FUSE's default second
(``attr_timeout``/``entry_timeout``), about as NFS's attribute cache does; the source's
inode numbers are passed through (``use_ino``) because a file's identity includes them
(NOTE [file identity]): FUSE's own numbers change when it forgets a node.
"""
from __future__ import annotations

import ctypes
import errno
import os
import signal
import stat
import threading
import time
from collections.abc import Callable

import mfusepy

from cachepipe.slowfs.profile import SlowProfile
from cachepipe.slowfs.throttle import Bandwidth, ReadStats

__all__ = ["SlowFS"]

_STAT_FIELDS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks")


def _session() -> int | None:
    """This mount's ``struct fuse_session *`` (from a FUSE thread: the context is per request)."""
    lib = getattr(mfusepy, "_libfuse", None)
    try:
        lib.fuse_get_session.restype = ctypes.c_void_p
        lib.fuse_get_session.argtypes = [ctypes.c_void_p]
        lib.fuse_session_exited.argtypes = [ctypes.c_void_p]
        return lib.fuse_get_session(ctypes.c_void_p(lib.fuse_get_context().contents.fuse))
    except (AttributeError, TypeError, ValueError, ctypes.ArgumentError):
        return None


class SlowFS(mfusepy.Operations):
    """``source`` served read-only with ``profile``'s latency and shared bandwidth.

    Args:
        source: the directory served.
        profile: the share's latency and bandwidth.
        stats: where opens, reads and bytes are counted.
        on_ready: called once the kernel has initialised the mount (prints ``mounted``).
        stall_after: test hook: after this many read calls every request hangs until the
            file system exits (a server that stops answering); ``None``: never.
    """

    use_ns = True

    def __init__(self, source: str, profile: SlowProfile, stats: ReadStats,
                 on_ready: Callable[[], None] = lambda: None, stall_after: int | None = None) -> None:
        self.root = os.path.realpath(source)
        self.profile = profile
        self.stats = stats
        self.bandwidth = Bandwidth(profile.bytes_per_s)
        self.on_ready = on_ready
        self.stall_after = stall_after
        self.closing = threading.Event()  # set when the session ends: stalled requests return
        self.ready = False  # the kernel initialised the mount

    def _real(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _wait(self, seconds: float) -> None:
        if self.stall_after is not None and self.stats.reads >= self.stall_after:
            self.closing.wait()  # the stall hook
            raise mfusepy.FuseOSError(errno.EIO)
        if seconds > 0:
            time.sleep(seconds)  # releases the GIL: requests overlap (NOTE [slowfs requests overlap])

    # -- lifetime ---------------------------------------------------------------------
    def init(self, path: str) -> None:
        threading.Thread(target=self._watch_exit, args=(_session(),), name="slowfs-exit", daemon=True).start()
        self.ready = True
        self.on_ready()

    def _watch_exit(self, session: int | None) -> None:
        """Set ``closing`` once libfuse's session has exited (SIGINT/SIGTERM), so that stalled
        requests return and the loop's workers can be joined."""
        if session is None:
            return
        exited = mfusepy._libfuse.fuse_session_exited
        while not self.closing.wait(0.05):
            if exited(ctypes.c_void_p(session)):
                self.closing.set()
                # the signal may have landed on a thread other than the loop's (main) one,
                # which then sleeps on: wake it (serve() gave SIGUSR1 a handler that does nothing)
                signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    # -- metadata -----------------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict:
        self.stats.op("getattr")
        self._wait(self.profile.metadata_s)
        st = os.lstat(self._real(path))
        out = {k: getattr(st, k) for k in _STAT_FIELDS}
        out.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return out

    def readdir(self, path: str, fh: int):
        self.stats.op("readdir")
        self._wait(self.profile.metadata_s)
        real = self._real(path)
        here = os.lstat(real)
        out = [(".", {"st_mode": here.st_mode, "st_ino": here.st_ino}, 0),
               ("..", {"st_mode": stat.S_IFDIR, "st_ino": os.lstat(os.path.dirname(real)).st_ino}, 0)]
        with os.scandir(real) as entries:  # inode numbers pass through (use_ino): an entry of 0 is hidden
            for e in entries:
                kind = stat.S_IFDIR if e.is_dir(follow_symlinks=False) else (
                    stat.S_IFLNK if e.is_symlink() else stat.S_IFREG)
                out.append((e.name, {"st_mode": kind, "st_ino": e.inode()}, 0))
        return out

    def readlink(self, path: str) -> str:
        self.stats.op("readlink")
        self._wait(self.profile.metadata_s)
        return os.readlink(self._real(path))

    def statfs(self, path: str) -> dict:
        self.stats.op("statfs")
        self._wait(self.profile.metadata_s)
        st = os.statvfs(self._real(path))
        return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                                            "f_ffree", "f_favail", "f_namemax")}

    # -- data -----------------------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise mfusepy.FuseOSError(errno.EROFS)
        self._wait(self.profile.metadata_s)
        fd = os.open(self._real(path), os.O_RDONLY)
        self.stats.opened(path)
        return fd

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._wait(self.profile.read_s)
        data = os.pread(fh, size, offset)
        self.bandwidth.take(len(data))
        self.stats.read(path, len(data))
        return data

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0
