"""L2 over one Redis Cluster (``redis-cluster://host:port``): the cluster places and replicates."""
from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from cachepipe.backoff import ShardHealth
from cachepipe.errors import L2UnavailableError, warn_once
from cachepipe.l2.placement import LocalityError, node_of_hosts
from cachepipe.l2.redis_url import credentials, redact, split_url
from cachepipe.l2.shards import make_client
from cachepipe.l2.store import PARTIAL_KEY, SampleStore, is_oom, shard_row

__all__ = ["ClusterStore"]

_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError, RedisClusterException,
           redis.ResponseError)
_CHUNK = 2048


def _node(url: str) -> ClusterNode:
    hostport = split_url(url)[2].split("/", 1)[0].split("?", 1)[0]  # never the user part (NOTE [Redis URL credentials])
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a cluster URL looks like redis-cluster://host:port, got {redact(url)!r}")
    return ClusterNode(host, int(port))


class ClusterStore(SampleStore):
    """Values in a Redis Cluster; keys hash to slots, MGETs are split per node by redis-py
    (one pipelined round trip per node per batch). Replication is the cluster's own.

    Args:
        urls: one or more ``redis-cluster://host:port`` seed nodes.
        namespace, counters, replicas, timeout: as :class:`~cachepipe.l2.shards.ShardedRedisStore`
            (``replicas`` must be 1).
    """

    def __init__(self, urls: Sequence[str], *, namespace: str, counters: Counter,
                 replicas: int = 1, timeout: float = 1.0) -> None:
        if replicas != 1:
            raise ValueError("replicas must be 1 for a Redis Cluster (it replicates by itself)")
        self.urls = [redact(u) for u in urls]  # messages only; _node() reads host and port
        self._seeds = list(urls)
        self._username, self._password = credentials(urls[0])  # NOTE [Redis URL credentials]
        self.namespace = namespace
        self.counters = counters
        self.timeout = timeout
        self.health = [ShardHealth()]  # the cluster as one
        self._client: RedisCluster | None = None
        self._warned: set = set()

    @property
    def client(self) -> RedisCluster:
        if self._client is None:
            self._client = RedisCluster(startup_nodes=[_node(u) for u in self._seeds],
                                        username=self._username, password=self._password,
                                        socket_timeout=self.timeout,
                                        socket_connect_timeout=self.timeout,
                                        retry=Retry(NoBackoff(), 0))
        return self._client

    def node_of(self, indices: Sequence[int], nodes: int | None = None) -> np.ndarray:
        """Node of the primary owning each index's slot, -1 where it does not answer (NOTE
        [placement]); the i-th seed URL names node i, so ``nodes`` must be the URL count.

        Raises:
            LocalityError: ``nodes`` is not the URL count, the cluster cannot be asked for
                its slots, or a primary is on none of the nodes named by the URLs.
        """
        from redis.crc import key_slot

        if nodes is not None and nodes != len(self.urls):
            raise LocalityError(f"{nodes} nodes need one Redis URL per node, in node order (--l2 "
                                f"redis-cluster://host:port of a primary on each node), but {len(self.urls)} "
                                f"URL(s) were given")

        slots, error = None, None
        try:
            for node in self.client.get_nodes():  # any live node knows the slot map
                try:
                    slots = self.client.cluster_slots(target_nodes=node)
                    break
                except _ERRORS as exc:
                    error = exc
        except _ERRORS as exc:
            error = exc
        if slots is None:
            self._client = None
            raise LocalityError(f"cannot ask Redis Cluster {self.urls[0]} which node holds which slot "
                                f"({type(error).__name__}: {error})")
        primaries = sorted({tuple(owners["primary"]) for owners in slots.values()})
        slot_owner = np.full(16384, -1, dtype=np.int64)
        for (lo, hi), owners in slots.items():
            slot_owner[int(lo):int(hi) + 1] = primaries.index(tuple(owners["primary"]))
        node = node_of_hosts(primaries, [(n.host, n.port) for n in map(_node, self.urls)])
        alive = np.zeros(len(primaries), dtype=bool)
        for k, (host, port) in enumerate(primaries):
            client = make_client(f"redis://{host}:{port}/0", self.timeout, self._username, self._password)
            try:
                alive[k] = bool(client.ping())
            except _ERRORS:
                pass
            finally:
                client.close()
        owner = slot_owner[[key_slot(f"{self.namespace}{int(i)}".encode()) for i in indices]]
        known = np.maximum(owner, 0)  # a slot no primary covers has no holder, as a dead one
        return np.where((owner >= 0) & alive[known], node[known], -1)

    def _failed(self, exc: BaseException, what: str) -> None:
        self.health[0].failed(exc)
        self.counters["l2_errors"] += 1
        self._client = None  # rediscover the topology next time
        warn_once(self._warned, "down", f"Redis Cluster {self.urls[0]} failed on {what} "
                  f"({type(exc).__name__}: {exc}); reading from L1/source and retrying with backoff")

    def get_many(self, indices: Sequence[int]) -> list[bytes | None]:
        if not indices:
            return []
        if not self.health[0].available():
            self.counters["l2_skipped"] += len(indices)
            return [None] * len(indices)
        try:
            values = self.client.mget_nonatomic([f"{self.namespace}{i}" for i in indices])
        except _ERRORS as exc:
            self._failed(exc, "read")
            return [None] * len(indices)
        self.health[0].succeeded()
        return list(values)

    def put_many(self, items: Sequence[tuple[int, bytes]]) -> int:
        if not items:
            return 0
        if not self.health[0].available():
            self.counters["l2_write_errors"] += len(items)
            return 0
        try:
            pipe = self.client.pipeline()
            for i, v in items:
                pipe.set(f"{self.namespace}{i}", v)
            results = pipe.execute(raise_on_error=False)
        except _ERRORS as exc:
            self._failed(exc, "write")
            self.counters["l2_write_errors"] += len(items)
            return 0
        self.health[0].succeeded()
        ok = 0
        for r in results:
            if isinstance(r, Exception):
                self.counters["l2_write_errors"] += 1
                if is_oom(r):
                    self.counters["l2_oom"] += 1
                    warn_once(self._warned, "oom", f"Redis Cluster {self.urls[0]} is out of memory; "
                              f"samples it cannot hold are served from L1/source")
            else:
                ok += 1
        return ok

    def missing(self, indices: Sequence[int]) -> list[int]:
        out = []
        for start in range(0, len(indices), _CHUNK):
            chunk = list(indices[start:start + _CHUNK])
            try:
                pipe = self.client.pipeline()
                for i in chunk:
                    pipe.exists(f"{self.namespace}{i}")
                found = pipe.execute()
            except _ERRORS as exc:
                self._client = None
                raise L2UnavailableError(f"cannot reach Redis Cluster {self.urls[0]}: {exc}") from None
            out.extend(i for i, f in zip(chunk, found) if not f)
        return out

    def mark_partial(self, node: str, uncached: int) -> None:
        try:
            if uncached > 0:
                self.client.hset(self.namespace + PARTIAL_KEY, node, uncached)
            else:
                self.client.hdel(self.namespace + PARTIAL_KEY, node)
        except _ERRORS as exc:
            self._client = None
            raise L2UnavailableError(f"cannot reach Redis Cluster {self.urls[0]}: {exc}") from None

    def partial(self) -> dict[str, int]:
        if not self.health[0].available():
            return {}
        try:
            fields = self.client.hgetall(self.namespace + PARTIAL_KEY)
        except _ERRORS:
            self._client = None
            return {}
        return {k.decode(errors="replace"): int(v) for k, v in fields.items() if v.isdigit()}

    def scan(self, match: str) -> Iterator[bytes]:
        try:  # redis-py scans every primary in turn
            yield from self.client.scan_iter(match=match, count=_CHUNK * 4)
        except _ERRORS as exc:
            self._client = None
            raise L2UnavailableError(f"cannot reach Redis Cluster {self.urls[0]}: {exc}") from None

    def drop(self, match: str) -> int:
        deleted = 0
        try:
            batch = []
            for key in itertools.chain(self.client.scan_iter(match=match, count=_CHUNK * 4), [None]):
                if key is not None:
                    batch.append(key)
                if batch and (key is None or len(batch) == _CHUNK):
                    pipe = self.client.pipeline()  # routes each key to its slot's primary
                    for k in batch:
                        pipe.unlink(k)
                    deleted += sum(pipe.execute())
                    batch = []
        except _ERRORS as exc:
            self._client = None
            raise L2UnavailableError(f"cannot reach Redis Cluster {self.urls[0]}: {exc}") from None
        return deleted

    def shard_info(self) -> list[dict]:
        try:
            nodes = self.client.get_primaries()
            rows = []
            for node in nodes:
                mem = self.client.info("memory", target_nodes=node)
                keys = self.client.dbsize(target_nodes=node)
                rows.append(shard_row(f"redis://{node.host}:{node.port}", reachable=True,
                                      used_memory=int(mem["used_memory"]), maxmemory=int(mem.get("maxmemory", 0)),
                                      keys=int(keys), policy=str(mem.get("maxmemory_policy", "")),
                                      system_memory=int(mem.get("total_system_memory", 0))))
            return rows
        except _ERRORS as exc:
            self._client = None
            return [shard_row(self.urls[0], error=f"{type(exc).__name__}: {exc}")]

    def server_cpu_seconds(self) -> float:
        """CPU of every primary so far, all threads (``INFO cpu``)."""
        try:
            return sum(float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
                       for info in self.client.info("cpu", target_nodes=RedisCluster.PRIMARIES).values())
        except _ERRORS as exc:
            self._client = None
            raise L2UnavailableError(f"cannot reach Redis Cluster {self.urls[0]}: {exc}") from None

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # closing a dead cluster must never raise
                pass
            self._client = None
