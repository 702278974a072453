"""Real faults for the cache fault tests: stopped processes, sockets of other users,
small or read-only mounts, a source file whose reads fail with EIO."""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest


NOBODY = 65534


def needs_root():
    return pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, mount)")


@contextlib.contextmanager
def stopped(pid: int, resume_after: float | None = None):
    """SIGSTOP ``pid``; SIGCONT it after ``resume_after`` s (in a thread) or on exit."""
    os.kill(pid, signal.SIGSTOP)
    timer = None
    if resume_after is not None:
        timer = threading.Timer(resume_after, _cont, (pid,))
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        _cont(pid)


def _cont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


@contextlib.contextmanager
def redis_on_socket(path: Path, workdir: Path):
    """A real redis-server (our child) listening on the Unix socket ``path``; yields its process."""
    from tools.bench.harness.redis import private_redis

    server = private_redis(workdir, tcp=False, unix_socket=path)
    try:
        yield server.proc
    finally:
        server.kill()


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "1m", readonly: bool = False):
    """A real tmpfs of ``size`` mounted at ``path`` (optionally remounted read-only later
    by :func:`remount_ro`)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        if readonly:
            remount_ro(path)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount_ro(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


@contextlib.contextmanager
def on_open(path: str | os.PathLike, fault):
    """Call ``fault(n)`` (n = 0, 1, ...) each time ``path`` is opened, before the real
    ``open()``: it may change the real file (truncate, rename, touch) or raise."""
    import builtins

    target = os.path.realpath(path)
    real_open = builtins.open
    calls = [0]

    def hooked(file, *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and os.path.realpath(file) == target:
            calls[0] += 1
            fault(calls[0] - 1)
        return real_open(file, *args, **kwargs)

    builtins.open = hooked
    try:
        yield calls
    finally:
        builtins.open = real_open


def eio(first: int | None = None):
    """A fault for :func:`on_open`: ``OSError(EIO)`` on the first ``first`` opens (or all),
    as a failing NFS server or disk sector gives."""
    def fault(n: int) -> None:
        if first is None or n < first:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
    return fault


@contextlib.contextmanager
def coarse_fs(path: Path, size: str = "8M"):
    """A real ext2 file system with 128-byte inodes (timestamps in whole seconds, as on
    ext3, HFS+ or FAT) loop-mounted at ``path`` (root only)."""
    image = path.with_suffix(".img")
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    subprocess.run(["mke2fs", "-q", "-t", "ext2", "-I", "128", "-F", str(image)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        image.unlink(missing_ok=True)
