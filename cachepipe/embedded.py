"""The embedded default L2: a private redis-server on a Unix socket inside the cache dir.

NOTE [embedded server]
``<cache_dir>/redis/`` holds ``redis.sock`` (the socket; when that path would exceed the
~100-byte Unix socket limit it lives in the temp dir under a name hashed from the cache
dir, recorded in ``socket.path``), ``redis.pid``, ``redis.log`` and ``lock``. The server
daemonizes, so it outlives the command that started it: ``cachepipe warmup`` then a
separate training process both hit the same L2. Persistence is off (L2 is rebuilt from
L1). ``maxmemory`` comes from ``l2_memory`` with policy ``noeviction``: training reads
every sample once per epoch, a cyclic pattern that LRU turns into a 0 % hit rate when
the data does not fit, while ``noeviction`` keeps the first part cached (writes past the
limit fail with OOM, which the store counts). Starting is serialized by ``flock`` on
``lock``, so many DataLoader workers may call :meth:`EmbeddedRedis.start` at once; a pid
file whose process is gone (or is not redis-server) and a socket nobody answers on are
removed before starting.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cachepipe.redis_binary import find_redis_server, server_env

__all__ = ["EmbeddedRedis", "parse_memory"]

# Redis' own convention: k/m/g are powers of 1000, kb/mb/gb (and KiB/MiB/GiB) of 1024.
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1024, "kib": 1024, "m": 1000**2, "mb": 1024**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1024**3, "gib": 1024**3, "t": 1000**4,
          "tb": 1024**4, "tib": 1024**4}
_SOCKET_MAX = 100


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
            raise ValueError(f"l2_memory must be > 0 bytes, got {value}")
        return value
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%|[a-zA-Z]*)\s*", str(value))
    if not m or (m.group(2) != "%" and m.group(2).lower() not in _UNITS):
        raise ValueError(f"cannot parse memory size {value!r}; use e.g. 4gb, 512mb, 2GiB, 25%")
    num, unit = float(m.group(1)), m.group(2).lower()
    size = int(num * _physical_memory() / 100) if unit == "%" else int(num * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"l2_memory must be > 0, got {value!r}")
    return size


class EmbeddedRedis:
    """Start, find, inspect and stop the private Redis of a cache directory.

    Args:
        cache_dir: the cache directory.

    Example:
        >>> server = EmbeddedRedis("/tmp/cache")  # doctest: +SKIP
        >>> server.start("2gb"); server.url  # doctest: +SKIP
        'unix:///tmp/cache/redis/redis.sock'
    """

    def __init__(self, cache_dir: str | os.PathLike) -> None:
        self.dir = Path(cache_dir).absolute() / "redis"
        self.pid_path = self.dir / "redis.pid"
        self.log_path = self.dir / "redis.log"
        local = self.dir / "redis.sock"
        if len(str(local)) <= _SOCKET_MAX:
            self.socket_path = local
        else:
            tag = hashlib.sha256(str(self.dir).encode()).hexdigest()[:16]
            self.socket_path = Path(tempfile.gettempdir()) / f"cachepipe-{tag}.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def client(self, timeout: float = 1.0) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket_path), socket_timeout=timeout,
                           socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))

    def ping(self) -> bool:
        if not self.socket_path.exists():
            return False
        try:
            return bool(self.client().ping())
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return False

    def pid(self) -> int | None:
        """The pid in the pid file if that process is alive and is a redis-server."""
        try:
            pid = int(self.pid_path.read_text().strip())
            if not _alive(pid):
                return None
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"redis-server" not in f.read():
                    return None
            return pid
        except (OSError, ValueError):
            return None

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

    def _lock(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def _cleanup_stale(self) -> list[str]:
        removed = []
        pid = self.pid()
        if pid is not None:  # alive but not answering: a hung server we own
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 5.0)
        for p in (self.pid_path, self.socket_path):
            if p.exists() or p.is_symlink():
                p.unlink()
                removed.append(str(p))
        return removed

    def start(self, l2_memory: int | str | None = None, timeout: float = 10.0) -> bool:
        """Make sure the server runs; returns ``True`` if this call started it.

        A running server is reused; with ``l2_memory`` given its ``maxmemory`` is set to it.

        Raises:
            FileNotFoundError: no redis-server binary.
            RuntimeError: the server did not come up (the message quotes its log).
            ValueError: bad ``l2_memory``.
        """
        maxmemory = parse_memory(l2_memory)
        fd = self._lock()
        try:
            if self.ping():
                if l2_memory is not None:
                    self.client().config_set("maxmemory", maxmemory)
                return False
            self._cleanup_stale()
            args = [find_redis_server(), "--port", "0", "--unixsocket", str(self.socket_path),
                    "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                    "--maxmemory", str(maxmemory), "--maxmemory-policy", "noeviction",
                    "--daemonize", "yes", "--pidfile", str(self.pid_path),
                    "--logfile", str(self.log_path), "--dir", str(self.dir)]
            subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=server_env(), timeout=timeout, check=False)
            deadline = time.monotonic() + timeout
            while not self.ping():
                if time.monotonic() > deadline:
                    log = self.log_path.read_text()[-500:] if self.log_path.exists() else "(no log)"
                    raise RuntimeError(f"embedded redis-server did not start on {self.socket_path}: {log}")
                time.sleep(0.01)
            (self.dir / "socket.path").write_text(str(self.socket_path))
            return True
        finally:
            os.close(fd)

    def stop(self, timeout: float = 10.0) -> bool:
        """Shut the server down (no save); returns ``True`` if one was running."""
        fd = self._lock()
        try:
            pid = self.pid()
            running = self.ping()
            if running:
                try:
                    self.client().shutdown(nosave=True)
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    pass
            if pid is not None and not _wait_gone(pid, timeout):
                os.kill(pid, signal.SIGKILL)
                _wait_gone(pid, 5.0)
            for p in (self.pid_path, self.socket_path):
                if p.exists():
                    p.unlink()
            return running or pid is not None
        finally:
            os.close(fd)


def _alive(pid: int) -> bool:
    """Running and not a zombie (an exited daemon may wait a while for init to reap it)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (ProcessLookupError, FileNotFoundError):
        return False
    except OSError:
        return True


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        try:  # reap it if it is our child (zombie)
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.02)
    return False
