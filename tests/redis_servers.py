"""Real ``redis-server`` processes for tests (no fakes): start, kill, restart."""
from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cachepipe.server.redis_binary import find_redis_server

__all__ = ["RedisServer", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One real redis-server on 127.0.0.1, persistence off.

    Args:
        workdir: directory for its log.
        maxmemory: e.g. ``"2mb"``; with ``maxmemory_policy="noeviction"`` writes past it
            fail with OOM errors, as on a full production server.
        maxmemory_policy: Redis eviction policy.
    """

    def __init__(self, workdir: Path, maxmemory: str | None = None,
                 maxmemory_policy: str = "noeviction") -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.maxmemory = maxmemory
        self.maxmemory_policy = maxmemory_policy
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A client that fails at once on a dead server, as the cache's own do (redis-py's
        default retries for ~4 s with backoff)."""
        return redis.Redis(host="127.0.0.1", port=self.port, retry=Retry(NoBackoff(), 0))

    def start(self) -> None:
        args = [find_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                "--logfile", str(self.workdir / f"redis-{self.port}.log")]
        if self.maxmemory:
            args += ["--maxmemory", self.maxmemory, "--maxmemory-policy", self.maxmemory_policy]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.client().ping():
                    return
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def kill(self) -> None:
        """Kill the server abruptly (SIGKILL), as a node failure would."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    restart = start
