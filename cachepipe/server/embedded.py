"""The embedded default L2: a private redis-server on a Unix socket inside the cache dir.

NOTE [embedded server]
``<cache_dir>/redis/`` (mode 0700) holds ``redis.sock`` (the socket; see NOTE [private
socket] for where it goes when that path is too long), ``redis.pid``, ``server.id``
(NOTE [server identity]), ``redis.log`` and ``lock``. The server daemonizes, so it
outlives the command that started it: ``cachepipe warmup`` then a separate training
process both hit the same L2. Persistence is off (L2 is rebuilt from L1). ``maxmemory``
comes from ``l2_memory`` (the last one given for the cache dir, recorded in ``maxmemory``,
when a start gives none) with policy ``noeviction``: training reads every sample once
per epoch, a cyclic pattern that LRU turns into a 0 % hit rate when the data does not
fit, while ``noeviction`` keeps the first part cached (writes past the limit fail with
OOM, which the store counts). Starting is serialized by ``flock`` on ``lock``, so many
DataLoader workers may call :meth:`EmbeddedRedis.start` at once. A server that is
proven ours but does not answer is waited for (it may be busy) and killed only after
``stuck_after`` seconds; a pid file or socket that is not proven ours is never acted on
beyond removing our own stale files.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cachepipe.errors import CacheWarning
from cachepipe.private_files import private_dir, write_private
from cachepipe.server import idle_watch
from cachepipe.server.idle_watch import DEFAULT_IDLE_MINUTES
from cachepipe.server.identity import ServerIdentity, wait_gone
from cachepipe.server.process import server_argv
from cachepipe.server.redis_binary import find_redis_server, server_env
from cachepipe.server.socket_path import check_socket, prepare_dir, socket_path

__all__ = ["EmbeddedRedis", "check_idle", "parse_memory"]

# Redis' own convention: k/m/g are powers of 1000, kb/mb/gb (and KiB/MiB/GiB) of 1024.
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1024, "kib": 1024, "m": 1000**2, "mb": 1024**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1024**3, "gib": 1024**3, "t": 1000**4,
          "tb": 1024**4, "tib": 1024**4}


def check_idle(seconds: float) -> float:
    """``seconds`` as an embedded server's idle time (NOTE [idle embedded server]).

    Raises:
        ValueError: negative or not a finite number.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
        raise ValueError(f"idle time (--l2-idle) must be a finite number >= 0 (0: never stop), got {seconds!r} s")
    return float(seconds)


def _physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_memory(value: int | str | None) -> int:
    """Bytes from ``4gb``, ``512MiB``, ``25%`` (of physical RAM) or an int; ``None`` -> 25 %.

    Units follow Redis: ``k``/``m``/``g`` are powers of 1000, ``kb``/``mb``/``gb`` and
    ``KiB``/``MiB``/``GiB`` powers of 1024 (case-insensitive).

    Raises:
        ValueError: unparseable or non-positive.
    """
    if value is None:
        return _physical_memory() // 4
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"l2_memory (--l2-memory) must be > 0 bytes, got {value}")
        return value
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%|[a-zA-Z]*)\s*", str(value))
    if not m or (m.group(2) != "%" and m.group(2).lower() not in _UNITS):
        raise ValueError(f"l2_memory (--l2-memory): cannot parse memory size {value!r}; use e.g. "
                         f"4gb, 512mb, 2GiB, 25%")
    num, unit = float(m.group(1)), m.group(2).lower()
    if unit == "%" and num > 100:
        raise ValueError(f"l2_memory (--l2-memory) {value!r} is more than all of this machine's RAM; "
                         f"use a percentage up to 100% or a size")
    size = int(num * _physical_memory() / 100) if unit == "%" else int(num * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"l2_memory (--l2-memory) must be > 0, got {value!r}")
    return size


class EmbeddedRedis:
    """Start, find, inspect and stop the private Redis of a cache directory.

    Args:
        cache_dir: the cache directory.
        stuck_after: seconds a server proven ours may go without answering before
            :meth:`start` or :meth:`stop` kills it (NOTE [server identity]).
        index: which of the cache dir's servers (NOTE [a node's L2] in
            ``cachepipe.server.embedded_group``): 0 lives in ``redis/``, ``i`` in ``redis-i/``.
        default_share: the share of the default 25 % of RAM a new server takes when no
            ``l2_memory`` was ever given for it (its group's 1/N).
        idle: seconds without a client after which a server this object starts stops by
            itself (NOTE [idle embedded server]); ``None``: ``DEFAULT_IDLE_MINUTES``; 0: never.

    Example:
        >>> server = EmbeddedRedis("/tmp/cache")  # doctest: +SKIP
        >>> server.start("2gb"); server.url  # doctest: +SKIP
        'unix:///tmp/cache/redis/redis.sock'
    """

    def __init__(self, cache_dir: str | os.PathLike, *, stuck_after: float = 120.0, index: int = 0,
                 default_share: float = 1.0, idle: float | None = None) -> None:
        if not stuck_after > 0:
            raise ValueError(f"stuck_after must be > 0 seconds, got {stuck_after}")
        self.idle = DEFAULT_IDLE_MINUTES * 60 if idle is None else check_idle(idle)
        self.dir = Path(cache_dir).absolute() / ("redis" if index == 0 else f"redis-{index}")
        self.pid_path = self.dir / "redis.pid"
        self.id_path = self.dir / "server.id"
        self.log_path = self.dir / "redis.log"
        self.memory_path = self.dir / "maxmemory"  # the last l2_memory given: a restart keeps it
        self.socket_path = socket_path(self.dir)
        self.stuck_after = stuck_after
        self.default_share = default_share  # of 25 % of RAM, when no size was ever given (NOTE [a group's memory])

    @property
    def url(self) -> str:
        """``unix://`` and the socket path, percent-quoted: a cache dir may hold ``#``, ``?``,
        ``%``, tabs or newlines, which a URL parser would otherwise cut or decode."""
        return f"unix://{quote(os.fsencode(self.socket_path), safe='/')}"

    def client(self, timeout: float = 1.0) -> redis.Redis:
        """A client of the socket (checked first, NOTE [private socket]).

        Raises:
            PermissionError: the socket or its directory is not this user's alone.
        """
        check_socket(self.socket_path)
        return redis.Redis(unix_socket_path=str(self.socket_path), socket_timeout=timeout,
                           socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))

    def ping(self) -> bool:
        """Whether our server answers (``False`` for a socket that is not ours)."""
        try:
            return check_socket(self.socket_path) and bool(self.client().ping())
        except (redis.RedisError, OSError):  # down, busy (BUSY, LOADING) or not ours
            return False

    def identity(self) -> ServerIdentity | None:
        """The identity of the running server this cache dir started, if proven."""
        ident = ServerIdentity.load(self.id_path)
        return ident if ident is not None and ident.matches(self.socket_path) else None

    def pid(self) -> int | None:
        """The pid of the server this cache dir started, when it runs (NOTE [server identity])."""
        ident = self.identity()
        return ident.pid if ident else None

    def status(self) -> dict:
        """``running``, ``pid``, ``socket``, ``used_memory``, ``maxmemory``, ``keys``."""
        row = {"running": False, "pid": self.pid(), "socket": str(self.socket_path),
               "used_memory": 0, "maxmemory": 0, "keys": 0}
        if self.ping():
            c = self.client()
            mem = c.info("memory")
            row.update(running=True, used_memory=int(mem["used_memory"]),
                       maxmemory=int(mem["maxmemory"]), keys=int(c.dbsize()))
        return row

    def _last_maxmemory(self) -> int:
        """The maxmemory last given for this cache dir, else its share of 25 % of RAM (NOTE [embedded server])."""
        try:
            return int(self.memory_path.read_text())
        except (OSError, ValueError):
            return max(1, int(parse_memory(None) * self.default_share))

    def _lock(self, create: bool = True) -> int | None:
        """Hold the cache dir's server lock; None (no lock) when ``create`` is False and the
        directory does not exist: nothing was started from it, and it is not made."""
        if not create and not self.dir.is_dir():
            return None
        private_dir(self.dir)
        try:
            fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:  # a read-only file system: an existing lock still serializes
            if exc.errno != errno.EROFS:
                raise
            fd = os.open(self.dir / "lock", os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def _wait_answer(self, ident: ServerIdentity) -> bool:
        """Wait for a silent server of ours: ``True`` when it answers, ``False`` when it
        exited or stayed silent for ``stuck_after`` seconds (then it is killed)."""
        deadline = time.monotonic() + self.stuck_after
        while time.monotonic() < deadline:
            if not ident.matches(self.socket_path):
                return False
            if self.ping():
                return True
            time.sleep(0.1)
        ident.kill(self.socket_path)
        return False

    def _remove_stale(self) -> None:
        """Remove our pid, identity and socket files (a socket of another user stays)."""
        for p in (self.pid_path, self.id_path, self.socket_path):
            try:
                if p != self.socket_path or os.lstat(p).st_uid == os.geteuid():
                    p.unlink(missing_ok=True)
            except FileNotFoundError:
                pass
            except OSError as exc:  # a read-only file system keeps them; start() cannot run there anyway
                if exc.errno != errno.EROFS:
                    raise

    def start(self, l2_memory: int | str | None = None, timeout: float = 10.0) -> bool:
        """Make sure the server runs; returns ``True`` if this call started it.

        A running server is reused; with ``l2_memory`` given its ``maxmemory`` is set to it.
        Without it a new server gets the ``l2_memory`` last given for this cache dir (so a
        server restarted after ``cachepipe server stop`` keeps its size), else 25 % of RAM.
        One of ours that does not answer is waited for up to ``stuck_after`` seconds.

        Raises:
            FileNotFoundError: no redis-server binary.
            PermissionError: the socket or its directory belongs to someone else.
            RuntimeError: the server did not come up (the message quotes its log).
            ValueError: bad ``l2_memory``.
        """
        maxmemory = parse_memory(l2_memory) if l2_memory is not None else self._last_maxmemory()
        fd = self._lock()
        try:
            self.socket_path = prepare_dir(self.socket_path, self.dir)  # NOTE [private socket]
            check_socket(self.socket_path)
            ident = self.identity()
            if self.ping() or (ident is not None and self._wait_answer(ident)):
                if l2_memory is not None:
                    self.client().config_set("maxmemory", maxmemory)
                    write_private(self.memory_path, str(maxmemory).encode())
                return False
            self._remove_stale()
            args = [*server_argv(find_redis_server(), unix_socket=self.socket_path, directory=self.dir,
                                 logfile=self.log_path, maxmemory=maxmemory),
                    "--port", "0", "--daemonize", "yes", "--pidfile", str(self.pid_path)]
            subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=server_env(), timeout=timeout, check=False, umask=0o077)
            deadline = time.monotonic() + timeout
            while not self.ping():
                if time.monotonic() > deadline:
                    log = self.log_path.read_text()[-500:] if self.log_path.exists() else "(no log)"
                    raise RuntimeError(f"embedded redis-server did not start on {self.socket_path}: {log}")
                time.sleep(0.01)
            pid = int(self.pid_path.read_text().strip())
            ident = ServerIdentity.of(pid, self.socket_path)
            if ident is None or not ident.matches(self.socket_path):
                raise RuntimeError(f"embedded redis-server on {self.socket_path} is not the process "
                                   f"{pid} named by {self.pid_path}")
            ident.save(self.id_path)
            if l2_memory is not None:
                write_private(self.memory_path, str(maxmemory).encode())
            self._watch(pid)
            return True
        finally:
            os.close(fd)

    def _watch(self, pid: int) -> None:
        """Start the server's watcher, detached, once it is connected (NOTE [idle embedded server])."""
        res = subprocess.run([sys.executable, "-I", "-S", idle_watch.__file__, str(self.socket_path), str(self.dir),
                              str(pid), repr(float(self.idle))], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, timeout=30, check=False)
        if res.returncode:
            warnings.warn(f"{res.stderr.strip() or 'the idle watcher failed'}: it keeps running until "
                          f"`cachepipe server stop --cache-dir {self.dir.parent}`", CacheWarning, stacklevel=3)

    def stop(self, timeout: float = 10.0) -> bool:
        """Shut the server down (no save); returns ``True`` if one was running.

        A server of ours that does not answer is waited for (it may be busy), then sent
        SHUTDOWN; one still silent, or not gone, after ``stuck_after`` seconds is killed.
        A process that is not proven ours is never signalled.

        Args:
            timeout: socket timeout of the SHUTDOWN command in seconds.
        """
        fd = self._lock(create=False)  # a missing cache dir is not created
        try:
            ident = self.identity()
            running = self.ping() or (ident is not None and self._wait_answer(ident))
            if running:
                try:
                    self.client(timeout=timeout).shutdown(nosave=True)
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    pass
            if ident is not None and not wait_gone(ident.pid, self.stuck_after):
                ident.kill(self.socket_path)
            self._remove_stale()
            return running or ident is not None
        finally:
            if fd is not None:
                os.close(fd)
