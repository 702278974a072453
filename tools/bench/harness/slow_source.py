"""A benchmark's source on an emulated slow share: the ``--source-*`` flags and the slowfs
mount they ask for.

NOTE [slow source flags]: every benchmark that reads a source (``bench cache``,
``loader``, ``feed``, ``train``, ``io``) takes ``--source-latency-ms L``, ``--source-mbps
B`` and ``--source-metadata-latency-ms M``. Given any of them, the benchmark's source
directory is served through ``cachepipe slowfs`` (a child process of the benchmark,
mounted on a fresh temporary directory, unmounted after the run) and everything reads
the mount instead: the scan, the warm-up, the uncached loaders. Unset ones take slowfs's
defaults (NOTE [slowfs profile]). Without them the source is read as it is, and a
mounted slowfs path given as SRC works as any directory does.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["SlowMount", "add_source_flags", "slow_source", "slowfs_mount", "source_profile"]

_PREFIX = "source-"


def add_source_flags(parser) -> None:
    """``--source-latency-ms``, ``--source-mbps``, ``--source-metadata-latency-ms`` (NOTE
    [slow source flags])."""
    from tools.slowfs import add_profile_flags

    group = parser.add_argument_group("slow source (NOTE [slow source flags]: any of these mounts SRC through "
                                      "cachepipe slowfs)")
    add_profile_flags(group, _PREFIX)


def source_profile(args: argparse.Namespace):
    """The :class:`~cachepipe.slowfs.SlowProfile` the ``--source-*`` flags ask for, or None
    when none is given.

    Raises:
        UsageError: a negative rate (names the flag).
    """
    from tools.slowfs import profile_from_args

    if all(getattr(args, f"source_{f}", None) is None for f in ("latency_ms", "mbps", "metadata_latency_ms")):
        return None
    return profile_from_args(args, _PREFIX)


class SlowMount:
    """A running ``cachepipe slowfs`` child: ``path`` is the mount, ``profile`` its
    profile; :meth:`stats` reads its ``--stats`` document once it has ended."""

    def __init__(self, process: subprocess.Popen, path: Path, profile, stats_path: Path) -> None:
        self.process, self.path, self.profile, self._stats = process, path, profile, stats_path
        self._doc: dict | None = None

    def stats(self) -> dict:
        """The ``--stats`` document (``{}`` if slowfs was killed before it could write one)."""
        if self._doc is None:
            self._doc = json.loads(self._stats.read_text()) if self._stats.exists() else {}
        return self._doc

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (the process is this object's child), then SIGKILL and a lazy unmount
        if it does not end within ``timeout``; returns its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        from cachepipe.slowfs.mount import clear_dead_mount

        clear_dead_mount(self.path)  # killed (by a test, or above): NOTE [dead slowfs mount]
        return self.process.returncode


@contextlib.contextmanager
def slowfs_mount(source: str | os.PathLike, profile, *, mountpoint: str | os.PathLike | None = None,
                 stall_after: int | None = None, ready_timeout: float = 30.0) -> Iterator[SlowMount]:
    """Serve ``source`` through a ``cachepipe slowfs`` child process for the ``with`` block.

    The child is a process of its own so that its FUSE threads never compete with the
    reader for this interpreter's GIL. Its output is passed through to stderr.

    Args:
        source: the directory to serve.
        profile: a :class:`~cachepipe.slowfs.SlowProfile`.
        mountpoint: an empty directory (default: a new temporary one, removed after).
        stall_after: the slowfs test hook (every request hangs after that many reads).
        ready_timeout: seconds to wait for ``mounted``.

    Raises:
        RuntimeError: slowfs ended or did not mount in time (its output is in the message).
    """
    made = mountpoint is None
    mnt = Path(tempfile.mkdtemp(prefix="cachepipe-slowfs-") if made else mountpoint).absolute()
    stats_path = Path(tempfile.mkdtemp(prefix="cachepipe-slowfs-stats-")) / "stats.json"
    cmd = [sys.executable, "-m", "tools", "slowfs", os.fspath(Path(source).absolute()), os.fspath(mnt),
           "--latency-ms", repr(profile.latency_ms), "--mbps", repr(profile.mbps), "--stats", os.fspath(stats_path)]
    if profile.metadata_latency_ms is not None:
        cmd += ["--metadata-latency-ms", repr(profile.metadata_latency_ms)]
    if stall_after is not None:
        cmd += ["--stall-after", str(stall_after)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    mount = SlowMount(proc, mnt, profile, stats_path)
    try:
        _wait_mounted(proc, mnt, ready_timeout)
        yield mount
    finally:
        mount.stop()
        mount.stats()
        shutil.rmtree(stats_path.parent, ignore_errors=True)
        if made:
            with contextlib.suppress(OSError):
                mnt.rmdir()


def _wait_mounted(proc: subprocess.Popen, mnt: Path, timeout: float) -> None:
    """Wait for the child's ``mounted MNT`` line; its other lines go to stderr, read on a
    thread so that a full pipe never blocks the child."""
    lines: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_pass_through, args=(proc.stdout, lines), daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if line == f"mounted {mnt}":
            return
    raise RuntimeError(f"cachepipe slowfs did not mount {mnt} within {timeout:g} s: " + " | ".join(seen[-5:]))


def _pass_through(stream, lines: queue.SimpleQueue) -> None:
    mounted = False
    for line in stream:
        line = line.rstrip("\n")
        if not mounted:
            lines.put(line)
            mounted = line.startswith("mounted ")
        elif not line.startswith(("Ignoring invalid max threads", "unmounted ")):
            sys.stderr.write(f"slowfs: {line}\n")
    lines.put(None)


@contextlib.contextmanager
def slow_source(args: argparse.Namespace, root: str | os.PathLike) -> Iterator[tuple[Path, str]]:
    """``root`` itself, or its slowfs mount when the ``--source-*`` flags ask for one (NOTE
    [slow source flags]); yields ``(path to read, a line describing it)``.

    Raises:
        UsageError: a bad rate, or FUSE missing here (with how to install it).
    """
    from cachepipe.slowfs.mount import fuse_missing
    from tools.cli import UsageError

    profile = source_profile(args)
    if profile is None:
        yield Path(root), "local"
        return
    missing = fuse_missing()
    if missing is not None:
        raise UsageError(f"--source-latency-ms/--source-mbps need FUSE: {missing}")
    with slowfs_mount(root, profile) as mount:
        yield mount.path, f"slowfs ({profile.describe()})"
