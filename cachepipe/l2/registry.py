"""The registry of L2 stores: which implementation serves a URL, by its scheme.

NOTE [L2 store registry]
A store is registered once under each URL scheme it serves, with the *kind* ``cachepipe
stats`` reports for it and whether cachepipe's ``replicas`` applies to it (a Redis Cluster
replicates by itself). A new L2 backend is one new file (a class with the
:class:`~cachepipe.l2.store.SampleStore` methods and the constructor of :data:`StoreFactory`)
plus one :func:`register_store` call, here for a built-in one or anywhere before the cache
opens for another (litdata's ``register_downloader(prefix, cls)``). The implementations
import the protocol module (``cachepipe/l2/store.py``) and this one imports them, so there
is no import cycle between them.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cachepipe.l2.cluster import ClusterStore
from cachepipe.l2.redis_url import redact
from cachepipe.l2.shards import ShardedRedisStore
from cachepipe.l2.store import SampleStore

__all__ = ["EMBEDDED", "NONE", "StoreFactory", "check_replicas", "open_store", "register_store", "registered_schemes", "store_kind"]

# factory(urls, *, namespace, counters, replicas, timeout) -> a store serving ``urls``
StoreFactory = Callable[..., SampleStore]

EMBEDDED, NONE = "embedded", "none"  # the L2 kinds that are no registered store (cachepipe.l2.spec)


@dataclass(frozen=True)
class _Entry:
    factory: StoreFactory
    kind: str
    replicas: bool


_STORES: dict[str, _Entry] = {}


def register_store(scheme: str, factory: StoreFactory, *, kind: str, replicas: bool = True) -> None:
    """Serve URLs ``<scheme>://...`` with ``factory`` (NOTE [L2 store registry]).

    Args:
        scheme: the URL scheme, without ``://`` (e.g. ``"redis"``).
        factory: called as ``factory(urls, namespace=, counters=, replicas=, timeout=)``.
        kind: what ``cachepipe stats`` calls this L2 (e.g. ``"shards"``); URLs of one cache
            must all be of one kind.
        replicas: whether ``replicas > 1`` (copies on distinct URLs) applies.

    Raises:
        ValueError: a malformed scheme, a reserved kind, or a scheme registered to another factory.

    Example:
        >>> register_store("dict", DictStore, kind="dict")  # doctest: +SKIP
    """
    if not scheme or "://" in scheme or not scheme.replace("-", "").replace("+", "").replace(".", "").isalnum():
        raise ValueError(f"an L2 store scheme is a URL scheme such as 'redis', got {scheme!r}")
    if kind in (EMBEDDED, NONE) or not kind:
        raise ValueError(f"an L2 store kind must be non-empty and not {EMBEDDED!r} or {NONE!r}; "
                         f"got {kind!r}")
    entry = _Entry(factory, kind, replicas)
    if _STORES.get(scheme, entry) != entry:
        raise ValueError(f"L2 store scheme {scheme}:// is registered already (to {_STORES[scheme].factory!r})")
    _STORES[scheme] = entry


def registered_schemes() -> list[str]:
    """The registered schemes, as ``scheme://``."""
    return [f"{s}://" for s in _STORES]


def _entry(url: str) -> _Entry:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in _STORES:
        raise ValueError(f"unknown L2 URL scheme in {redact(url)!r}; registered schemes: "
                         + ", ".join(registered_schemes()))
    return _STORES[scheme]


def store_kind(urls: Sequence[str]) -> str:
    """The registered kind of the store serving ``urls`` (e.g. ``"shards"``, ``"cluster"``).

    Raises:
        ValueError: empty list, unknown scheme (lists the registered ones) or mixed kinds.
    """
    if not urls:
        raise ValueError("need at least one L2 URL")
    kinds = {_entry(url).kind for url in urls}
    if len(kinds) > 1:
        raise ValueError(f"cannot mix L2 kinds {sorted(kinds)} in one cache: {[redact(u) for u in urls]}")
    return kinds.pop()


def check_replicas(urls: Sequence[str], replicas: int) -> None:
    """Raise ``ValueError`` unless ``replicas`` copies fit the store of ``urls``."""
    if replicas != 1 and not _entry(urls[0]).replicas:
        raise ValueError(f"replicas applies to plain shards; a {store_kind(urls)} L2 replicates by itself")
    if not 1 <= replicas <= len(urls):
        raise ValueError(f"replicas must be in 1..{len(urls)} (the number of shards), got {replicas}")


def open_store(urls: Sequence[str], namespace: str, counters: Counter, *, replicas: int = 1,
               timeout: float = 1.0) -> SampleStore:
    """Build the registered store for ``urls``.

    Args:
        urls: shard URLs, or redis-cluster:// seed URLs, or URLs of another registered scheme.
        namespace: key prefix ending in ``:``.
        counters: where failures and fallbacks are counted.
        replicas: copies of each value (where the store's registration allows it).
        timeout: socket connect/read timeout in seconds.

    Raises:
        ValueError: see :func:`store_kind`; ``replicas`` out of range.
    """
    store_kind(urls)
    check_replicas(urls, replicas)
    return _entry(urls[0]).factory(list(urls), namespace=namespace, counters=counters, replicas=replicas,
                                   timeout=timeout)


# NOTE [Redis Cluster URLs]: a cluster is named by the scheme ``redis-cluster://host:port``
# (one or more seed nodes); plain ``redis://``, ``rediss://`` and ``unix://`` URLs are
# independent shards placed by rendezvous hashing.
for _scheme in ("redis", "rediss", "unix"):
    register_store(_scheme, ShardedRedisStore, kind="shards")
register_store("redis-cluster", ClusterStore, kind="cluster", replicas=False)
