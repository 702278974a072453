"""Stop an embedded ``redis-server`` nobody uses: no client for an idle time, or its directory deleted.

NOTE [idle embedded server]: the embedded server daemonizes so that ``cachepipe warmup``
and a later training run share it (NOTE [embedded server]), which also lets it outlive
everything: a test suite that makes temporary cache dirs left 17 of them running. So each
server gets a watcher, started with it: a small process of its own (this file, run by the
interpreter alone, ``-I -S``: standard library only, ~15 ms to start, no torch, no Redis
client) holding one connection to the server. Every ``poll`` seconds (at most 1) it reads ``INFO
clients``; when no client but itself has been connected for ``idle`` seconds (``--l2-idle``,
default ``DEFAULT_IDLE_MINUTES``; 0: never) it sends ``SHUTDOWN NOSAVE``. A training run
holds its connections (every loader worker's too) from its first batch to its end, so a
server in use is never idle; a server stopped while nobody used it starts again, empty, at
the next command that needs it (reads then come from L1 and refill it). Independently of
the idle time, the server is shut down as soon as its directory (``<cache_dir>/redis``) is
deleted or replaced: nothing can reach or stop it through the cache dir any more. The
final check and the ``SHUTDOWN`` run under the directory's start lock, so a command
starting or reusing the server at that moment is not cut off between its check and its
first connection. The watcher first checks that the server it reached is the process it
was started for (``INFO server``'s ``process_id``) and ends with its server: the
connection closes (a ``server stop``, a crash), and it exits at once. It is started
detached (double fork, own session), so no command waits for it or reaps it.
"""
from __future__ import annotations

import os
import select
import socket
import sys
import time

__all__ = ["DEFAULT_IDLE_MINUTES", "connect", "poll_seconds", "watch"]

DEFAULT_IDLE_MINUTES = 60.0


def poll_seconds(idle: float) -> float:
    """How often the watcher looks: a quarter of the idle time, at most 1 s, at least 50 ms."""
    return 1.0 if idle <= 0 else max(0.05, min(1.0, idle / 4))


def _send(sock: socket.socket, *words: str) -> None:
    sock.sendall(f"*{len(words)}\r\n".encode() + b"".join(f"${len(w)}\r\n{w}\r\n".encode() for w in words))


def _info(sock: socket.socket, reader, section: str) -> dict[str, str]:
    _send(sock, "INFO", section)
    head = reader.readline()
    if not head.startswith(b"$"):
        raise ConnectionError(f"unexpected reply to INFO: {head[:80]!r}")
    body = reader.read(int(head[1:]) + 2).decode(errors="replace")
    return dict(line.split(":", 1) for line in body.splitlines() if ":" in line and not line.startswith("#"))


def _dir_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_dev


def _locked(directory: str):
    """The directory's start lock, held (NOTE above); None when it cannot be opened."""
    import fcntl

    try:
        fd = os.open(os.path.join(directory, "lock"), os.O_RDWR)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def connect(sock_path: str, directory: str, pid: int):
    """``(socket, reader, home)`` connected to the server ``pid`` on ``sock_path``; ``home``
    identifies its ``directory`` now.

    Raises:
        OSError: it cannot be reached, the process there is not ``pid``, or ``directory`` is gone.
    """
    home = _dir_id(directory)
    if home is None:
        raise FileNotFoundError(f"{directory} does not exist")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sock_path)
    reader = sock.makefile("rb")
    if _info(sock, reader, "server").get("process_id") != str(pid):
        raise ConnectionError(f"the server on {sock_path} is not process {pid}")
    return sock, reader, home


def watch(sock: socket.socket, reader, directory: str, home: tuple[int, int], idle: float) -> int:
    """Watch the server of ``sock`` (from :func:`connect`; its directory ``directory``, ``home``)
    until it ends or is stopped (NOTE [idle embedded server])."""
    poll = poll_seconds(idle)
    quiet_since = time.monotonic()
    while True:
        if select.select([sock], [], [], poll)[0]:
            return 0  # the server closed the connection: it is gone
        if _dir_id(directory) != home:  # deleted or replaced: shut down without the lock (it went too)
            _send(sock, "SHUTDOWN", "NOSAVE")
            return 0
        if int(_info(sock, reader, "clients").get("connected_clients", "2")) > 1:
            quiet_since = time.monotonic()
        elif idle > 0 and time.monotonic() - quiet_since >= idle:
            lock = _locked(directory)
            try:  # checked again under the start lock
                if int(_info(sock, reader, "clients").get("connected_clients", "2")) <= 1:
                    _send(sock, "SHUTDOWN", "NOSAVE")
                    return 0
                quiet_since = time.monotonic()
            finally:
                if lock is not None:
                    os.close(lock)


def _detach() -> None:
    """Become a daemon: double fork, a session of its own, ``/`` as working directory, standard
    streams on ``/dev/null`` (the starter reads this process's stderr until it closes)."""
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def main(argv: list[str]) -> int:
    """``SOCKET DIRECTORY PID IDLE``: exit 0 once connected to the server (the watcher goes on,
    detached), 1 when it cannot be (the message on stderr)."""
    sock_path, directory, pid, idle = argv[0], argv[1], int(argv[2]), float(argv[3])
    try:
        sock, reader, home = connect(sock_path, directory, pid)  # before detaching: the starter knows it is watched
    except OSError as exc:
        print(f"cannot watch the embedded redis-server {pid} on {sock_path}: {exc}", file=sys.stderr)
        return 1
    _detach()
    try:
        return watch(sock, reader, directory, home, idle)
    except OSError:  # the server went away between two looks
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
