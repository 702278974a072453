"""Proof that a process is the embedded Redis server a cache dir started.

NOTE [server identity]
A pid alone proves nothing: pids are reused, and a pid file can be copied from another
cache dir. When :class:`~cachepipe.server.embedded.EmbeddedRedis` starts a server it records
``server.id``: the pid, the process start time (field 22 of ``/proc/<pid>/stat``, in clock
ticks since boot, unique per pid at any moment) and the socket path. A process is *ours*
only when it still has that pid and start time, runs as this user and holds a listening
Unix socket bound to our socket path (its inode in ``/proc/net/unix`` is among its file
descriptors). Anything else is never signalled. A server that is ours but does not
answer is *busy* (a long command, swapped out, SIGSTOPped) and is waited for; only after
``stuck_after`` seconds (default 120) without an answer is it declared stuck and killed.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from cachepipe.private_files import write_private

__all__ = ["ServerIdentity", "alive", "start_time", "wait_gone"]


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, ``None`` if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Running and not a zombie (an exited daemon may wait a while for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` s for ``pid`` to exit (reaping it if it is our child)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


# an entry of /proc/net/unix: "Num: RefCount Protocol Flags Type St Inode [Path]"
_ENTRY = re.compile(rb"^[0-9a-f]+: [0-9A-F]{8} [0-9A-F]{8} [0-9A-F]{8} [0-9A-F]{4} [0-9A-F]{2} +(\d+)(?: (.*))?$")


def _socket_inodes(path: str) -> set[str]:
    """Inodes of the Unix sockets bound to ``path`` (from ``/proc/net/unix``, whose paths are
    printed raw: a newline in a path continues the entry on the next line)."""
    want, entries = os.fsencode(path), []
    try:  # one read call for the whole table: a table read in pages skips entries while
        fd = os.open("/proc/net/unix", os.O_RDONLY)  # sockets come and go (NOTE [a missed socket entry])
        try:
            chunks = [os.read(fd, 1 << 24)]
            while chunks[-1]:
                chunks.append(os.read(fd, 1 << 24))
        finally:
            os.close(fd)
    except OSError:
        return set()
    lines = b"".join(chunks).split(b"\n")[1:]
    for line in lines:
        m = _ENTRY.match(line)
        if m:
            entries.append([m.group(1), m.group(2)])
        elif entries and entries[-1][1] is not None:
            entries[-1][1] += b"\n" + line
    return {inode.decode() for inode, name in entries if name == want}


def _listener_pid(path: str) -> int | None:
    """The pid of the process listening on Unix socket ``path`` (``SO_PEERCRED``), or None."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            s.connect(path)
            creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return struct.unpack("3i", creds)[0]


def _fds_hold(pid: int, inodes: set[str]) -> bool:
    """Whether one of ``pid``'s file descriptors is one of the sockets ``inodes``."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def _holds_socket(pid: int, path: str, tries: int = 3) -> bool:
    # NOTE [a missed socket entry]: /proc/net/unix is generated in pages while sockets come
    # and go, so under socket churn a read can miss a live entry, several reads in a row
    # (seen under load: a server that had just answered PING was "not the process named by
    # its pid file"). The table also keeps the entry of a socket whose file was unlinked
    # (a server stopped and replaced at the same path), so a found inode may be another
    # process's. Whatever the table says, a socket not found among the pid's descriptors is
    # proven the other way: the kernel's credentials of the listener on the path
    # (``SO_PEERCRED`` of a connection to it, nothing sent), which name the process that
    # listens there. Both are tried ``tries`` times, a little apart, before "not ours".
    for attempt in range(tries):
        inodes = {f"socket:[{i}]" for i in _socket_inodes(path)}
        if (inodes and _fds_hold(pid, inodes)) or _listener_pid(path) == pid:
            return True
        if attempt + 1 < tries:
            time.sleep(0.05 * (attempt + 1))
    return False


@dataclass(frozen=True)
class ServerIdentity:
    """What proves a process is the server a cache dir started (NOTE [server identity])."""

    pid: int
    start_time: int
    socket: str

    @classmethod
    def of(cls, pid: int, socket: str | os.PathLike) -> ServerIdentity | None:
        """The identity of the running process ``pid`` serving ``socket``, if it runs."""
        started = start_time(pid)
        return None if started is None else cls(pid, started, os.fspath(socket))

    @classmethod
    def load(cls, path: Path) -> ServerIdentity | None:
        """Read an identity file; ``None`` when missing or unreadable."""
        try:
            obj = json.loads(path.read_text())
            return cls(int(obj["pid"]), int(obj["start_time"]), str(obj["socket"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, path: Path) -> None:
        write_private(path, json.dumps({"pid": self.pid, "start_time": self.start_time,
                                        "socket": self.socket}).encode())

    def matches(self, socket: str | os.PathLike) -> bool:
        """Whether this process still runs, as this user, listening on ``socket``."""
        if self.socket != os.fspath(socket) or start_time(self.pid) != self.start_time:
            return False
        if not alive(self.pid):
            return False
        try:
            if os.stat(f"/proc/{self.pid}").st_uid != os.geteuid():
                return False
        except OSError:
            return False
        return _holds_socket(self.pid, self.socket)

    def kill(self, socket: str | os.PathLike) -> bool:
        """SIGKILL the process if it is proven ours; returns whether it signalled it.

        The check is made through a pidfd opened first, so the signal cannot reach a
        process that took over the pid in between.
        """
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return False
        try:
            if not self.matches(socket):
                return False
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            os.close(pidfd)
        wait_gone(self.pid, 10.0)
        return True
