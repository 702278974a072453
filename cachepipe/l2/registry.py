"""The registry of L2 stores: which implementation serves a URL, by its scheme.

NOTE [L2 store registry]
A store is registered once under each URL scheme it serves, with the *kind* ``cachepipe
stats`` reports for it, whether cachepipe's ``replicas`` applies to it (a Redis Cluster
replicates by itself), the scheme's URL rule and whether it is sized by ``--l2-memory``.
The URL rule (``check``) is the scheme's own: it validates a URL and returns its
canonical name (``redis://`` needs a port and a db number, ``shm://`` an absolute path);
``L2Spec`` asks it for every URL, so a URL is refused in one line where it is named, and
a scheme without a rule takes any URL. A sized store gets ``memory=`` (bytes, or None:
its own default) from the L2 setting, as the embedded servers do. A new L2 backend is one
new file (a :class:`~cachepipe.l2.store.SampleStore` subclass whose constructor is
:data:`StoreFactory`) plus one :func:`register_store` call, here for a built-in one or
anywhere before the cache opens for another (litdata's ``register_downloader(prefix,
cls)``). The implementations import the protocol module (``cachepipe/l2/store.py``) and
this one imports them, so there is no import cycle between them.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cachepipe.l2 import shm_dir
from cachepipe.l2.cluster import ClusterStore
from cachepipe.l2.redis_url import canonical, redact
from cachepipe.l2.shards import ShardedRedisStore
from cachepipe.l2.shm import ShmStore
from cachepipe.l2.store import SampleStore

__all__ = ["EMBEDDED", "NONE", "StoreFactory", "canonical_url", "check_replicas", "is_sized", "open_store",
           "register_store", "registered_schemes", "store_kind"]

# factory(urls, *, namespace, counters, replicas, timeout[, memory]) -> a store serving ``urls``
StoreFactory = Callable[..., SampleStore]

EMBEDDED, NONE = "embedded", "none"  # the L2 kinds that are no registered store (cachepipe.l2.spec)


@dataclass(frozen=True)
class _Entry:
    factory: StoreFactory
    kind: str
    replicas: bool
    check: Callable[[str], str] | None
    sized: bool


_STORES: dict[str, _Entry] = {}


def register_store(scheme: str, factory: StoreFactory, *, kind: str, replicas: bool = True,
                   check: Callable[[str], str] | None = None, sized: bool = False) -> None:
    """Serve URLs ``<scheme>://...`` with ``factory`` (NOTE [L2 store registry]).

    Args:
        scheme: the URL scheme, without ``://`` (e.g. ``"redis"``).
        factory: called as ``factory(urls, namespace=, counters=, replicas=, timeout=)``, and
            ``memory=`` when ``sized``.
        kind: what ``cachepipe stats`` calls this L2 (e.g. ``"shards"``); URLs of one cache
            must all be of one kind.
        replicas: whether ``replicas > 1`` (copies on distinct URLs) applies.
        check: the scheme's URL rule, ``check(url) -> canonical name``, raising ValueError
            (one line naming the URL, never its password); None: any URL of the scheme.
        sized: the store is sized by the L2 setting's ``memory`` (``--l2-memory``).

    Raises:
        ValueError: a malformed scheme, a reserved kind, or a scheme registered to another factory.

    Example:
        >>> register_store("dir", DirStore, kind="dir", replicas=False)  # doctest: +SKIP
    """
    if not scheme or "://" in scheme or not scheme.replace("-", "").replace("+", "").replace(".", "").isalnum():
        raise ValueError(f"an L2 store scheme is a URL scheme such as 'redis', got {scheme!r}")
    if kind in (EMBEDDED, NONE) or not kind:
        raise ValueError(f"an L2 store kind must be non-empty and not {EMBEDDED!r} or {NONE!r}; "
                         f"got {kind!r}")
    entry = _Entry(factory, kind, replicas, check, sized)
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


def canonical_url(url: str) -> str:
    """The canonical name of ``url`` by its scheme's rule (NOTE [L2 store registry]).

    Raises:
        ValueError: an unknown scheme (lists the registered ones), or a URL its scheme refuses.
    """
    entry = _entry(url)
    return url if entry.check is None else entry.check(url)


def is_sized(urls: Sequence[str]) -> bool:
    """Whether the store of ``urls`` is sized by ``--l2-memory`` (raises as :func:`store_kind`)."""
    store_kind(urls)
    return _entry(urls[0]).sized


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
               timeout: float = 1.0, memory: int | None = None) -> SampleStore:
    """Build the registered store for ``urls``.

    Args:
        urls: shard URLs, or redis-cluster:// seed URLs, or URLs of another registered scheme.
        namespace: key prefix ending in ``:``.
        counters: where failures and fallbacks are counted.
        replicas: copies of each value (where the store's registration allows it).
        timeout: socket connect/read timeout in seconds.
        memory: a sized store's size in bytes (None: its own default; ``L2Spec.memory``).

    Raises:
        ValueError: see :func:`store_kind`; ``replicas`` out of range; ``memory`` for a
            store that is not sized.
    """
    store_kind(urls)
    check_replicas(urls, replicas)
    entry = _entry(urls[0])
    if memory is not None and not entry.sized:
        raise ValueError(f"a {entry.kind} L2 is not sized by l2_memory (--l2-memory)")
    sized = {"memory": memory} if entry.sized else {}
    return entry.factory(list(urls), namespace=namespace, counters=counters, replicas=replicas, timeout=timeout,
                         **sized)


# NOTE [Redis Cluster URLs]: a cluster is named by the scheme ``redis-cluster://host:port``
# (one or more seed nodes); plain ``redis://``, ``rediss://`` and ``unix://`` URLs are
# independent shards placed by rendezvous hashing.
for _scheme in ("redis", "rediss", "unix"):
    register_store(_scheme, ShardedRedisStore, kind="shards", check=canonical)
register_store("redis-cluster", ClusterStore, kind="cluster", replicas=False, check=canonical)
register_store("shm", ShmStore, kind="shm", replicas=False, check=shm_dir.canonical, sized=True)
