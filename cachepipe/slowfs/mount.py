"""Mounting slowfs: the checks before it, the dead mount a killed one leaves, and the
foreground serve loop.

NOTE [dead slowfs mount]
A slowfs killed by SIGKILL cannot unmount: its mountpoint stays a FUSE mount with no
server, where every call fails with ENOTCONN ("Transport endpoint is not connected").
The next slowfs on that mountpoint clears it (``fusermount3 -u -z``, a lazy unmount, so
a process still holding a file there does not block it), but only when both are true:
the mountpoint answers ENOTCONN (or ECONNABORTED, when it died mid-request) and ``/proc/self/mountinfo`` lists it as a ``fuse``
mount. A live mount, or a mount of any other kind, is refused, never unmounted.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from cachepipe.slowfs.profile import SlowProfile
from cachepipe.slowfs.throttle import ReadStats

__all__ = ["FUSE_INSTALL", "SlowFsError", "check_fuse", "check_mountpoint", "clear_dead_mount", "fuse_missing",
           "serve"]

FUSE_INSTALL = "apt-get install fuse3"


class SlowFsError(ValueError):
    """slowfs cannot mount: one line naming the path or what is missing."""


def fuse_missing() -> str | None:
    """Why FUSE cannot be used here (``/dev/fuse``, ``fusermount3``, libfuse 3 for mfusepy),
    with how to install it; ``None`` when it can."""
    if not os.path.exists("/dev/fuse"):
        return (f"/dev/fuse is missing: this machine (or container) has no FUSE device; load the fuse module "
                f"or run the container with --device /dev/fuse, and {FUSE_INSTALL}")
    if shutil.which("fusermount3") is None:
        return f"fusermount3 is not on PATH: {FUSE_INSTALL}"
    try:
        import mfusepy  # noqa: F401
    except ImportError as exc:
        return f"cannot load mfusepy ({exc}): pip install mfusepy, and {FUSE_INSTALL} for libfuse3"
    except OSError as exc:
        return f"mfusepy cannot load libfuse ({exc}): {FUSE_INSTALL}"
    return None


def check_fuse() -> None:
    """Raises:
        SlowFsError: FUSE cannot be used here (what is missing, and how to install it)."""
    why = fuse_missing()
    if why is not None:
        raise SlowFsError(why)


def _fuse_mounts() -> set[str]:
    """Mountpoints of FUSE file systems (``/proc/self/mountinfo``)."""
    out = set()
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) > 4 and right.split()[:1] and right.split()[0].startswith("fuse"):
            out.add(fields[4].encode().decode("unicode_escape"))  # \040 for a space
    return out


def clear_dead_mount(mountpoint: str | os.PathLike) -> bool:
    """Lazily unmount ``mountpoint`` when it is a dead FUSE mount (NOTE [dead slowfs mount]).

    Returns:
        Whether a dead mount was cleared.

    Raises:
        SlowFsError: it is a dead FUSE mount that could not be unmounted.
    """
    path = os.path.abspath(os.fspath(mountpoint))
    try:
        with os.scandir(path) as it:  # an opendir always reaches the server (a stat may be answered
            next(it, None)            # from the kernel's attribute cache for a second)
        return False
    except OSError as exc:
        if exc.errno not in (errno.ENOTCONN, errno.ECONNABORTED) or path not in _fuse_mounts():
            return False
    done = subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True, text=True)
    if done.returncode != 0:
        raise SlowFsError(f"mountpoint {path} is a dead FUSE mount (Transport endpoint is not connected) and "
                          f"fusermount3 -u -z failed: {done.stderr.strip() or done.returncode}")
    return True


def check_mountpoint(mountpoint: str | os.PathLike) -> Path:
    """The mountpoint as an absolute path, once it is an empty directory that is not a mount.

    Raises:
        SlowFsError: it does not exist, is not a directory, is mounted already or is not empty.
    """
    path = Path(mountpoint).absolute()
    if not path.exists():
        raise SlowFsError(f"mountpoint {path} does not exist (create an empty directory)")
    if not path.is_dir():
        raise SlowFsError(f"mountpoint {path} is not a directory")
    if os.path.ismount(path):
        raise SlowFsError(f"mountpoint {path} is a mount point already (another slowfs?); unmount it first")
    if any(path.iterdir()):
        raise SlowFsError(f"mountpoint {path} is not empty: slowfs mounts only on an empty directory")
    return path


def check_source(source: str | os.PathLike) -> Path:
    """Raises:
        SlowFsError: ``source`` is not a directory."""
    path = Path(source).absolute()
    if not path.is_dir():
        raise SlowFsError(f"SRC {path} is {'not a directory' if path.exists() else 'missing'}")
    return path


def serve(source: str | os.PathLike, mountpoint: str | os.PathLike, profile: SlowProfile, *,
          on_ready: Callable[[str], None] | None = None, stall_after: int | None = None,
          on_cleared: Callable[[str], None] | None = None) -> dict:
    """Serve ``source`` at ``mountpoint`` in the foreground until SIGINT/SIGTERM, then
    unmount; returns the counters (:meth:`ReadStats.document`). Call it from the main
    thread: libfuse handles the signals there (benchmarks and tests run it as a child
    process, ``tools/bench/harness/slow_source.py``).

    Args:
        source: the directory served read-only.
        mountpoint: an empty directory (a dead slowfs mount there is cleared first: NOTE
            [dead slowfs mount]).
        profile: latency and bandwidth (NOTE [slowfs profile]).
        on_ready: called with the mountpoint once the mount serves (default: print
            ``mounted MOUNTPOINT``).
        stall_after: test hook of :class:`~cachepipe.slowfs.fs.SlowFS`.
        on_cleared: called with the mountpoint when a dead mount was cleared.

    Raises:
        SlowFsError: FUSE is missing, or a bad source or mountpoint (one line).

    Example:
        >>> serve("/data/imagenet", "/mnt/slow", SlowProfile())  # doctest: +SKIP
        mounted /mnt/slow
    """
    if threading.current_thread() is not threading.main_thread():
        raise SlowFsError("slowfs serves from the main thread (libfuse's signal handling); run it as a process")
    check_fuse()
    src = check_source(source)
    if clear_dead_mount(mountpoint) and on_cleared is not None:
        on_cleared(os.path.abspath(os.fspath(mountpoint)))
    mnt = check_mountpoint(mountpoint)
    import mfusepy

    from cachepipe.slowfs.fs import SlowFS

    ready = on_ready or (lambda m: print(f"mounted {m}", flush=True))
    stats = ReadStats()
    fs = SlowFS(os.fspath(src), profile, stats, lambda: ready(os.fspath(mnt)), stall_after)
    signal.signal(signal.SIGUSR1, lambda *_: None)  # wakes the loop (SlowFS._watch_exit)
    try:
        mfusepy.FUSE(fs, os.fspath(mnt), foreground=True, nothreads=False, ro=True, use_ino=True,
                     fsname=f"slowfs:{src}", subtype="slowfs", default_permissions=True)
    except RuntimeError as exc:
        if fs.ready and exc.args == (8,):  # libfuse 3.14 returns 8 when a signal ended the loop
            return stats.document()
        raise SlowFsError(f"cannot mount {mnt}: libfuse returned {exc}") from None
    finally:
        fs.closing.set()
        sys.stdout.flush()
    return stats.document()
