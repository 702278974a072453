"""L2 over independent Redis servers: rendezvous-hashed shards with optional replicas.

NOTE [Redis ACL]
The commands cachepipe sends to a shard, all on keys under its prefix: ``MGET`` (reads),
``SET`` (writes), ``EXISTS`` (what the warm-up must do), ``HSET``/``HDEL``/``HGETALL`` (the
``<namespace>partial`` record, NOTE [fixed L2 subset]), ``SCAN`` (``stats`` and ``drop``),
``UNLINK`` (``cachepipe drop``), ``INFO``/``DBSIZE`` (memory and keys), ``PING``
(placement), and ``GET``. The clients send no ``CLIENT`` commands on connect, so an ACL user
with exactly these (docs/cache.md, Security: ``+get +mget +set +exists +unlink +hset
+hdel +hgetall +scan +info +dbsize +ping ~<prefix>:*``) never meets a denial. A ``NOPERM``
on an explicit check raises :class:`~cachepipe.errors.L2PermissionError` naming the command
and the shard, never "cannot reach"; on reads and writes it is warned about once and
counted like any other failure of the shard.
"""
from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cachepipe.backoff import ShardHealth
from cachepipe.errors import L2PermissionError, L2UnavailableError, warn_once
from cachepipe.l2.hashing import rendezvous_owners, shard_seed
from cachepipe.l2.placement import LocalityError, first_live_owner
from cachepipe.l2.redis_url import canonical, connect_url, redact
from cachepipe.l2.resp_mget import MGetConnection
from cachepipe.l2.store import PARTIAL_KEY, SampleStore, is_oom, shard_row

__all__ = ["ShardedRedisStore", "make_client"]

_NET_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)
_CHUNK = 2048  # keys per EXISTS pipeline
_READ_SIZE = 1 << 20  # values are ~200 KB: read big chunks (64 KB default: 4x more syscalls)


def _quiet_connects() -> dict:
    """Arguments that keep redis-py from sending commands of its own on connect (``CLIENT
    SETINFO``, and in redis-py 8 ``CLIENT MAINT_NOTIFICATIONS``), whichever release it is."""
    params = inspect.signature(redis.Redis.__init__).parameters
    kwargs = {"driver_info": None} if "driver_info" in params else {"lib_name": None, "lib_version": None}
    if "maint_notifications_config" in params:
        from redis.maint_notifications import MaintNotificationsConfig

        kwargs["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    return kwargs


_QUIET = _quiet_connects()


def make_client(url: str, timeout: float, username: str | None = None, password: str | None = None) -> redis.Redis:
    """A client with no hidden retries (failures are handled by NOTE [dead shard backoff])
    that sends only the commands of NOTE [Redis ACL]; ``username``/``password`` (a Redis
    Cluster node's) when the URL has none (NOTE [Redis URL credentials])."""
    auth = {k: v for k, v in (("username", username), ("password", password)) if v is not None}
    return redis.Redis.from_url(connect_url(url), socket_timeout=timeout, socket_connect_timeout=timeout,
                                retry=Retry(NoBackoff(), 0), retry_on_timeout=False,
                                health_check_interval=0, socket_read_size=_READ_SIZE, **auth, **_QUIET)


def _why(exc: BaseException, command: str = "") -> str:
    """An error as one line; a reply that is not RESP says the server is not Redis, and a
    NOPERM names the command the Redis user may not run (NOTE [Redis ACL])."""
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return (f"permission denied: the Redis user may not run {command or 'a command'} ({exc}); grant it "
                f"(the ACL in docs/cache.md, Security)")
    if isinstance(exc, redis.exceptions.InvalidResponse) or (
            isinstance(exc, redis.ConnectionError) and "unexpected" in str(exc)):
        return f"not a Redis server ({type(exc).__name__}: {exc})"
    return f"{type(exc).__name__}: {exc}"


def _failed_check(name: str, command: str, exc: BaseException) -> L2UnavailableError:
    """The error an explicit check raises: a permission error for NOPERM, else unreachable."""
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return L2PermissionError(f"L2 shard {name} refused {command}: {_why(exc, command)}")
    return L2UnavailableError(f"cannot reach L2 shard {name}: {_why(exc)}")


class ShardedRedisStore(SampleStore):
    """Values spread over ``urls`` by rendezvous hashing of the index, ``replicas`` copies each.

    Reads ask the first owner, then the next replica for what it missed; a write goes to
    every owner. One MGET / pipeline per shard per batch. See NOTE [rendezvous hashing].

    Args:
        urls: ``redis://host:port/db``, ``rediss://...`` or ``unix:///path.sock`` URLs.
        namespace: key prefix ending in ``:``.
        counters: failure/fallback counters (``l2_errors``, ``l2_oom``, ``l2_skipped``,
            ``l2_fallbacks``, ``l2_write_errors``).
        replicas: copies per value, ``1..len(urls)``.
        timeout: socket timeout in seconds.
    """

    def __init__(self, urls: Sequence[str], *, namespace: str, counters: Counter,
                 replicas: int = 1, timeout: float = 1.0) -> None:
        names = [canonical(u) for u in urls]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate shard URLs: {[redact(u) for u in urls]}")
        if not 1 <= replicas <= len(urls):
            raise ValueError(f"replicas must be in 1..{len(urls)} (the number of shards), got {replicas}")
        self.urls = list(urls)
        self.names = [redact(u) for u in urls]  # for messages (NOTE [Redis URL names])
        self.namespace = namespace
        self.counters = counters
        self.replicas = replicas
        self.seeds = [shard_seed(n) for n in names]
        self.clients = [make_client(u, timeout) for u in self.urls]
        # NOTE [zero-copy MGET] (l2/resp_mget.py): reads skip redis-py's copies, except over TLS
        self.readers = [None if u.startswith("rediss:") else MGetConnection(u, timeout) for u in self.urls]
        self.health = [ShardHealth() for _ in self.urls]
        self._warned: set = set()

    def key(self, index: int) -> str:
        return f"{self.namespace}{index}"

    def owners(self, indices: Sequence[int]) -> np.ndarray:
        """``(n, replicas)`` shard positions of ``indices``."""
        return rendezvous_owners(indices, self.seeds, self.replicas)

    def node_of(self, indices: Sequence[int], nodes: int | None = None) -> np.ndarray:
        """Node of each index's first live owner, -1 where none answers (NOTE [placement]):
        the i-th URL is node i's server, so ``nodes`` must be the URL count.

        Raises:
            LocalityError: ``nodes`` is not the number of URLs.
        """
        if nodes is not None and nodes != len(self.urls):
            raise LocalityError(f"{nodes} nodes need one Redis URL per node, in node order (--l2 URL of node 0's "
                                f"server, then node 1's, ...; or --l2 shm:// on every node), but {len(self.urls)} "
                                f"URL(s) were given")
        alive = np.zeros(len(self.urls), dtype=bool)
        for s, client in enumerate(self.clients):
            try:
                alive[s] = bool(client.ping())
            except (*_NET_ERRORS, redis.ResponseError):
                pass
        return first_live_owner(self.owners(np.asarray(indices, dtype=np.int64)), alive)

    def _failed(self, s: int, exc: BaseException, what: str) -> None:
        self.health[s].failed(exc)
        self.counters["l2_errors"] += 1
        if isinstance(exc, (redis.AuthenticationError, redis.exceptions.NoPermissionError)):
            warn_once(self._warned, f"auth{s}", f"L2 shard {self.names[s]} refused cachepipe's {what} "
                      f"({type(exc).__name__}: {exc}): check the password in its URL and the Redis user's ACL "
                      f"(docs/cache.md, Security); reading from replicas/L1/source and retrying it with backoff")
            return
        warn_once(self._warned, f"down{s}", f"L2 shard {self.names[s]} failed on {what} "
                  f"({type(exc).__name__}: {exc}); reading from replicas/L1/source and retrying "
                  f"it with backoff")

    def get_many(self, indices: Sequence[int]) -> list[bytes | None]:
        n = len(indices)
        out: list[bytes | None] = [None] * n
        if n == 0:
            return out
        idx = np.asarray(indices, dtype=np.int64)
        owners = self.owners(idx)
        pending = np.arange(n)
        for rank in range(self.replicas):
            if pending.size == 0:
                break
            shards = owners[pending, rank]
            still = []
            for s in np.unique(shards):
                pos = pending[shards == s]
                if not self.health[s].available():
                    self.counters["l2_skipped"] += len(pos)
                    still.append(pos)
                    continue
                try:
                    keys = [self.key(int(i)) for i in idx[pos]]
                    reader = self.readers[s]
                    values = reader.mget(keys) if reader else self.clients[s].mget(keys)
                except (*_NET_ERRORS, redis.exceptions.NoPermissionError) as exc:  # NOTE [MGET connection errors]
                    self._failed(int(s), exc, "read")
                    still.append(pos)
                    continue
                except redis.RedisError as exc:  # a reply that is not Redis' (NOTE [Redis URL names])
                    self.counters["l2_errors"] += 1
                    warn_once(self._warned, f"resp{s}", f"L2 shard {self.names[s]} refused a read: {exc}")
                    still.append(pos)
                    continue
                self.health[s].succeeded()
                miss = []
                for p, v in zip(pos.tolist(), values):
                    if v is None:
                        miss.append(p)
                    else:
                        out[p] = v
                        if rank:
                            self.counters["l2_fallbacks"] += 1
                still.append(np.asarray(miss, dtype=np.int64))
            pending = np.concatenate(still) if still else np.empty(0, dtype=np.int64)
        return out

    def put_many(self, items: Sequence[tuple[int, bytes]]) -> int:
        if not items:
            return 0
        idx = np.asarray([i for i, _ in items], dtype=np.int64)
        owners = self.owners(idx)
        stored = np.zeros(len(items), dtype=bool)
        for s in np.unique(owners):
            pos = np.nonzero((owners == s).any(axis=1))[0]
            if not self.health[s].available():
                self.counters["l2_write_errors"] += len(pos)
                continue
            pipe = self.clients[s].pipeline(transaction=False)
            for p in pos.tolist():
                pipe.set(self.key(items[p][0]), items[p][1])
            try:
                results = pipe.execute(raise_on_error=False)
            except (*_NET_ERRORS, redis.RedisError) as exc:
                self._failed(int(s), exc, "write")
                self.counters["l2_write_errors"] += len(pos)
                continue
            self.health[s].succeeded()
            for p, r in zip(pos.tolist(), results):
                if isinstance(r, Exception):
                    self.counters["l2_write_errors"] += 1
                    if is_oom(r):
                        self.counters["l2_oom"] += 1
                        warn_once(self._warned, f"oom{s}", f"L2 shard {self.names[s]} is out of memory "
                                  f"(maxmemory reached): samples it cannot hold are served from "
                                  f"L1/source; raise --l2-memory or add shards")
                    else:
                        warn_once(self._warned, f"werr{s}", f"L2 shard {self.names[s]} refused a write: {r}")
                else:
                    stored[p] = True
        return int(stored.sum())

    def missing(self, indices: Sequence[int]) -> list[int]:
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size == 0:
            return []
        owners = self.owners(idx)
        lacking = np.zeros(idx.size, dtype=bool)
        for s in range(len(self.urls)):
            pos = np.nonzero((owners == s).any(axis=1))[0]
            for start in range(0, pos.size, _CHUNK):
                chunk = pos[start:start + _CHUNK]
                pipe = self.clients[s].pipeline(transaction=False)
                for p in chunk.tolist():
                    pipe.exists(self.key(int(idx[p])))
                try:
                    found = pipe.execute()
                except (*_NET_ERRORS, redis.RedisError) as exc:
                    raise _failed_check(self.names[s], "EXISTS", exc) from None
                lacking[chunk[~np.asarray(found, dtype=bool)]] = True
        return idx[lacking].tolist()

    def shard_info(self) -> list[dict]:
        info = []
        for url, client in zip(self.names, self.clients):
            row = shard_row(url)
            try:
                mem = client.info("memory")
                row.update(reachable=True, used_memory=int(mem["used_memory"]),
                           maxmemory=int(mem.get("maxmemory", 0)), keys=int(client.dbsize()),
                           policy=str(mem.get("maxmemory_policy", "")),
                           system_memory=int(mem.get("total_system_memory", 0)))
            except (*_NET_ERRORS, redis.RedisError) as exc:
                row["error"] = _why(exc, "INFO and DBSIZE")
                row["denied"] = isinstance(exc, redis.exceptions.NoPermissionError)
            info.append(row)
        return info

    def mark_partial(self, node: str, uncached: int) -> None:
        for name, client in zip(self.names, self.clients):  # on every shard: any one answers readers
            try:
                if uncached > 0:
                    client.hset(self.namespace + PARTIAL_KEY, node, uncached)
                else:
                    client.hdel(self.namespace + PARTIAL_KEY, node)
            except (*_NET_ERRORS, redis.RedisError) as exc:
                raise _failed_check(name, "HSET" if uncached > 0 else "HDEL", exc) from None

    def partial(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s, client in enumerate(self.clients):
            if not self.health[s].available():
                continue
            try:
                fields = client.hgetall(self.namespace + PARTIAL_KEY)
            except (*_NET_ERRORS, redis.RedisError):
                continue
            out.update({k.decode(errors="replace"): int(v) for k, v in fields.items() if v.isdigit()})
        return out

    def scan(self, match: str) -> Iterator[bytes]:
        for name, client in zip(self.names, self.clients):
            try:
                yield from client.scan_iter(match=match, count=_CHUNK * 4)
            except (*_NET_ERRORS, redis.RedisError) as exc:
                raise _failed_check(name, "SCAN", exc) from None

    def drop(self, match: str) -> int:
        deleted = 0
        for name, client in zip(self.names, self.clients):
            try:
                batch = []
                for key in client.scan_iter(match=match, count=_CHUNK * 4):  # deleting while scanning is safe
                    batch.append(key)
                    if len(batch) == _CHUNK:
                        deleted += client.unlink(*batch)
                        batch = []
                deleted += client.unlink(*batch) if batch else 0
            except (*_NET_ERRORS, redis.RedisError) as exc:
                raise _failed_check(name, "SCAN or UNLINK", exc) from None
        return deleted

    def server_cpu_seconds(self) -> float:
        """CPU of every shard's server so far, all threads (``INFO cpu``)."""
        total = 0.0
        for name, client in zip(self.names, self.clients):
            try:
                info = client.info("cpu")
            except (*_NET_ERRORS, redis.RedisError) as exc:
                raise _failed_check(name, "INFO", exc) from None
            total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return total

    def close(self) -> None:
        for c in [*self.clients, *filter(None, self.readers)]:
            try:
                c.close()
            except Exception:  # closing a dead connection must never raise
                pass
