"""A ``redis-server`` child process owned by its starter: the one way a server that is not
the embedded default is started (benchmarks' node shards, tests' servers).

NOTE [owned redis-server]: a benchmark or a test needs servers of its own that it kills,
restarts and reads the CPU of: a shard on 127.0.0.1 over TCP, one inside an emulated node's
network namespace bound to that node's address, one with a memory cap and an eviction
policy, io-threads, cluster mode. Each is a :class:`RedisProcess`: a child of this process
(never daemonized, so it is signalled only through its own ``Popen`` handle) that gets
SIGTERM when this process dies (``PR_SET_PDEATHSIG``: a benchmark killed with SIGKILL
leaves no server behind), persistence off, its log and socket in its own directory. Every one also listens on a private Unix
socket there (NOTE [private socket]), through which it is probed until it answers and
inspected (``INFO``): the file system is shared across network namespaces, so a server
inside an emulated node is managed exactly like one on this host. The embedded default
(``embedded.py``) daemonizes instead, to outlive the command that started it, and builds
its command line with the same :func:`server_argv`.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cachepipe.private_files import private_dir
from cachepipe.server.redis_binary import find_redis_server, server_env
from cachepipe.server.socket_path import prepare_dir, socket_path

__all__ = ["RedisProcess", "die_with_parent", "server_argv"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM):
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when its parent dies
    (``PR_SET_PDEATHSIG``, Linux; it survives the exec of ``ip netns exec``), and exits at once
    if the parent is already gone (NOTE [owned redis-server]). None where it cannot be had.

    The signal comes when the *thread* that started the child ends: start children from a
    thread that lives as long as they should (the main thread).
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the forked child
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # died before the request: nobody will signal us
            os._exit(1)
    return preexec


def server_argv(binary: str, *, unix_socket: str | os.PathLike, directory: str | os.PathLike,
                logfile: str | os.PathLike, maxmemory: int | str | None = None,
                policy: str = "noeviction") -> list[str]:
    """The command line every cachepipe-started ``redis-server`` shares: a Unix socket only
    its user may use, persistence off, ``--dir`` and ``--logfile`` absolute (the server
    changes into ``--dir`` before it opens the log), and ``maxmemory`` with ``policy``."""
    argv = [binary, "--unixsocket", os.fspath(unix_socket), "--unixsocketperm", "700", "--save", "",
            "--appendonly", "no", "--dir", os.path.abspath(directory), "--logfile", os.path.abspath(logfile)]
    if maxmemory is not None:
        argv += ["--maxmemory", str(maxmemory), "--maxmemory-policy", policy]
    return argv


def _free_port(host: str) -> int:
    """A TCP port free on ``host`` (an address of this host's network namespace)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class RedisProcess:
    """A ``redis-server`` this process started and owns (NOTE [owned redis-server]).

    Args:
        workdir: its directory (created, or tightened to, mode 0700): log, Unix socket (or
            the socket's record, NOTE [private socket]).
        bind: listen on TCP at this address too (``"127.0.0.1"``, an emulated node's
            address); None: the Unix socket only.
        port: the TCP port (with ``bind``; None: one free on ``bind``, which must then be
            an address of this host's namespace).
        maxmemory: ``maxmemory`` in Redis' syntax (``"64mb"``) or bytes; None: unlimited.
        policy: ``maxmemory-policy`` with ``maxmemory``.
        io_threads: Redis io-threads (reads on them too) when above 1.
        args: more ``--option value`` words for the server (``--cluster-enabled yes``...).
        binary: the executable (default: :func:`find_redis_server`).
        wrap: words put before the command (``ip netns exec NODE``: start it in a namespace).
        protected_mode: Redis' protected mode (off where clients of other emulated nodes,
            with no password on a network nobody else reaches, must be served).
        unix_socket: its Unix socket's path (default: in ``workdir``, NOTE [private socket]).
        timeout: seconds to wait for it to answer.

    Raises:
        RuntimeError: it did not come up (quotes its log); FileNotFoundError: no binary.
    """

    def __init__(self, workdir: str | os.PathLike, *, bind: str | None = None, port: int | None = None,
                 maxmemory: int | str | None = None, policy: str = "noeviction", io_threads: int = 1,
                 args: Sequence[str] = (), binary: str | None = None, wrap: Sequence[str] = (),
                 protected_mode: bool = True, unix_socket: str | os.PathLike | None = None,
                 timeout: float = 10.0) -> None:
        self.workdir = private_dir(Path(workdir).absolute(), follow_link=True)  # 0700: its socket lives there
        self.binary = binary or find_redis_server()
        self.bind = bind
        if bind is not None and port is None:
            port = _free_port(bind)
        self.port = port if bind is not None else 0
        self.socket = Path(unix_socket) if unix_socket else prepare_dir(socket_path(self.workdir), self.workdir)
        self.log = self.workdir / "redis.log"
        self.argv = [*wrap, *server_argv(self.binary, unix_socket=self.socket, directory=self.workdir, logfile=self.log,
                                         maxmemory=maxmemory, policy=policy), "--port", str(self.port)]
        if bind is not None:
            self.argv += ["--bind", bind]
        if not protected_mode:
            self.argv += ["--protected-mode", "no"]
        if io_threads > 1:
            self.argv += ["--io-threads", str(io_threads), "--io-threads-do-reads", "yes"]
        self.argv += list(args)
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        """``redis://BIND:PORT/0`` when it listens on TCP, else ``unix://`` and its socket."""
        if self.bind is not None:
            return f"redis://{self.bind}:{self.port}/0"
        return f"unix://{quote(os.fsencode(self.socket), safe='/')}"

    def client(self, timeout: float = 5.0) -> redis.Redis:
        """A client over its Unix socket (reachable from any network namespace) that fails
        at once on a dead server, as the cache's own clients do."""
        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=timeout,
                           socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))

    def start(self) -> None:
        """Start it (again, after :meth:`kill`: empty, as a restarted node's server is)."""
        self.socket.unlink(missing_ok=True)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=server_env(), preexec_fn=die_with_parent())
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                if self.socket.exists() and self.client(timeout=1.0).ping():
                    return
            except (redis.ConnectionError, redis.TimeoutError, OSError):  # not yet (or still loading)
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = self.log.read_text()[-500:] if self.log.exists() else "(no log)"
                raise RuntimeError(f"redis-server in {self.workdir} ({' '.join(self.argv[:2])}...) did not start: {log}")
            time.sleep(0.02)

    def cpu_seconds(self) -> float:
        """CPU the server has used so far, all its threads (``INFO cpu``)."""
        info = self.client().info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def kill(self) -> None:
        """SIGKILL it, as a node failure would (our child: signalled through its handle)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate it, then kill it after ``timeout`` seconds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> RedisProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
