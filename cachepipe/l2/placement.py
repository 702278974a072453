"""Which node holds each sample's L2 value: what node-local sampling (``loaders.locality``) draws by.

NOTE [placement]
A store says where a sample is with ``node_of(indices, nodes)`` (``cachepipe/l2/store.py``),
and refuses with ``LocalityError`` when it cannot tell on ``nodes`` nodes. A node-local
store (``shm://``: the same URL names each node's own memory) places by rendezvous hashing
of the index over the node numbers (:func:`node_local_owner`): every node computes the
same homes for any node count, and each node's warm-up fills its own store with its own.
For Redis, nodes are numbered by the order of the URLs. With plain shards the i-th URL is the
server of node i (one per node, as the deployment lists them). With a Redis Cluster the
i-th ``redis-cluster://`` URL names a primary on node i, and every primary belongs to
the node whose URL has its ``host:port``, else its host (a node may run several
primaries). A sample is held by the first of its owners that answers a PING, the order
in which reads ask them (``ShardedRedisStore.get_many``; a cluster reads primaries), so
with replicas a dead shard's samples move to the node of their next replica. A sample
with no live owner gets ``-1``: whichever node draws it reads it from L1 (every node
mirrors the whole source by default), as any failed read does. Liveness is probed when
asked; a shard that dies later keeps its samples, which are then read from L1 on the
node that draws them.
"""
from __future__ import annotations

import socket
from collections.abc import Sequence

import numpy as np

from cachepipe.l2.hashing import rendezvous_owners, shard_seed

__all__ = ["LocalityError", "first_live_owner", "node_local_owner", "node_of_hosts"]


class LocalityError(ValueError):
    """The store cannot tell which node holds a sample (the message says why and what to pass)."""


def first_live_owner(owners: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """For each row of ``owners`` (shard positions, best first), the first live shard, else -1.

    Example:
        >>> first_live_owner(np.array([[0, 1], [1, 0]]), np.array([False, True])).tolist()
        [1, 1]
    """
    live = np.asarray(alive, dtype=bool)[owners]
    first = owners[np.arange(len(owners)), np.argmax(live, axis=1)]
    return np.where(live.any(axis=1), first, -1)


def node_local_owner(indices: np.ndarray, nodes: int) -> np.ndarray:
    """Home node of each index for a node-local store on ``nodes`` nodes (NOTE [placement]).

    Raises:
        ValueError: ``nodes`` < 1.

    Example:
        >>> node_local_owner(np.arange(4), 1).tolist()
        [0, 0, 0, 0]
    """
    if nodes < 1:
        raise ValueError(f"need at least one node, got {nodes}")
    seeds = [shard_seed(f"node/{k}") for k in range(nodes)]
    return rendezvous_owners(np.asarray(indices, dtype=np.int64), seeds)[:, 0].astype(np.int64)


def _address(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def node_of_hosts(servers: Sequence[tuple[str, int]], node_urls: Sequence[tuple[str, int]]) -> np.ndarray:
    """Node position of each ``(host, port)`` server: the node URL with that host:port, else that host.

    Raises:
        LocalityError: a server is on none of the nodes (names it).
    """
    nodes = [(_address(h), p) for h, p in node_urls]
    out = []
    for host, port in servers:
        addr = (_address(host), port)
        match = [k for k, n in enumerate(nodes) if n == addr] or [k for k, n in enumerate(nodes) if n[0] == addr[0]]
        if not match:
            raise LocalityError(f"Redis Cluster primary {host}:{port} is on none of the nodes named by the "
                                f"redis-cluster:// URLs ({', '.join(f'{h}:{p}' for h, p in node_urls)}); "
                                f"pass one URL per node, in node order, for locality='node'")
        out.append(match[0])
    return np.asarray(out, dtype=np.int64)
