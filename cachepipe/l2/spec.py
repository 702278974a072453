"""Where a cache's L2 lives, resolved once at the entry point into an :class:`L2Spec`.

NOTE [L2 resolved once]
A user names L2 as ``None`` (the embedded server of the cache dir), ``False`` (no L2), a
URL or a list of URLs (the store registered for their scheme, NOTE [L2 store registry]):
``l2=`` in the Python API and ``--l2 URL`` on the command line (``redis=`` and ``--redis``
are their old names and keep working). The entry point (:class:`~cachepipe.CacheConfig`,
built by ``TwoLevelCache(...)``, the loaders and ``tools/cache_flags.py``) resolves that
once with :func:`resolve_l2` into an :class:`L2Spec` of one kind: ``"embedded"`` (with its
server count and memory), ``"none"``, or a registered store's kind (``"shards"``,
``"cluster"``, ``"shm"``, ...) with its URLs, each checked by its scheme's rule, and the
memory of a sized store (``shm``). Everything downstream reads ``spec.kind``, ``spec.urls``
and ``spec.memory`` and never re-derives them from a string.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cachepipe.l2.redis_url import redact
from cachepipe.l2.registry import EMBEDDED, NONE, canonical_url, is_sized, store_kind
from cachepipe.server.embedded import check_idle, parse_memory
from cachepipe.server.embedded_group import default_l2_servers, max_l2_servers

__all__ = ["EMBEDDED", "NONE", "L2Spec", "l2_setting", "resolve_l2"]


@dataclass(frozen=True)
class L2Spec:
    """One cache's L2, resolved (NOTE [L2 resolved once]); build it with the class methods
    or :func:`resolve_l2`.

    Attributes:
        kind: ``"embedded"``, ``"none"`` or the registered kind of ``urls``' store.
        urls: the store's URLs (store kinds only).
        servers: embedded ``redis-server`` processes (NOTE [a node's L2]); 1 otherwise.
        memory: the embedded servers' total maxmemory in bytes (``None``: keep a running
            server's, else 25 % of RAM), or a sized store's size (``shm``: ``None`` keeps
            the store's recorded one, else 25 % of RAM); ``None`` otherwise.
        idle: seconds without a client after which an embedded server stops by itself
            (NOTE [idle embedded server]; ``None``: the default, 60 minutes; 0: never);
            ``None`` for other kinds.

    Raises:
        ValueError: fields that do not fit the kind (the message never shows a password).
    """

    kind: str
    urls: tuple[str, ...] = ()
    servers: int = 1
    memory: int | None = None
    idle: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "urls", tuple(self.urls))
        if self.kind in (EMBEDDED, NONE):
            if self.urls:
                raise ValueError(f"an L2 of kind {self.kind!r} has no URLs")
        else:
            if store_kind(self.urls) != self.kind:
                raise ValueError(f"L2 URLs {[redact(u) for u in self.urls]} are of kind "
                                 f"{store_kind(self.urls)!r}, not {self.kind!r}")
            for url in self.urls:
                canonical_url(url)  # the scheme's own rule (NOTE [L2 store registry])
        if not isinstance(self.servers, int) or self.servers < 1:
            raise ValueError(f"l2_servers (--l2-servers) must be a positive int, got {self.servers!r}")
        if self.kind == EMBEDDED and self.servers > max_l2_servers():
            raise ValueError(f"l2_servers (--l2-servers) {self.servers}: at most {max_l2_servers()} on this machine "
                             f"(the default's cap of 8, or one per core; docs/cache.md, sizing)")
        if self.idle is not None and (self.kind != EMBEDDED or check_idle(self.idle) != self.idle):
            raise ValueError(f"an idle time applies to the embedded L2, not to one of kind {self.kind!r}")
        if self.kind != EMBEDDED and self.servers != 1:
            raise ValueError(f"servers apply to the embedded L2, not to one of kind {self.kind!r}")
        if self.memory is not None and not (self.kind == EMBEDDED or (self.urls and is_sized(self.urls))):
            raise ValueError(f"memory applies to the embedded L2 and to sized stores (shm://), not to one of "
                             f"kind {self.kind!r}")

    @classmethod
    def embedded(cls, servers: int | None = None, memory: int | str | None = None,
                 idle: float | None = None) -> L2Spec:
        """The embedded servers of the cache dir (``servers`` default: one per 8 cores;
        ``memory``: ``"4gb"``, ``"25%"``, bytes or ``None``; ``idle``: seconds, NOTE [idle
        embedded server])."""
        servers = default_l2_servers() if servers is None else servers
        return cls(EMBEDDED, servers=servers, memory=None if memory is None else parse_memory(memory),
                   idle=None if idle is None else check_idle(idle))

    @classmethod
    def none(cls) -> L2Spec:
        """No L2 (L1 and the source only)."""
        return cls(NONE)

    @classmethod
    def of_urls(cls, urls: Sequence[str], memory: int | str | None = None) -> L2Spec:
        """The store registered for the scheme of ``urls`` (all of one kind); ``memory``: a
        sized store's size (``"4gb"``, ``"25%"``, bytes), ignored for one that is not."""
        size = parse_memory(memory) if memory is not None and is_sized(urls) else None
        return cls(store_kind(urls), tuple(urls), memory=size)

    @property
    def enabled(self) -> bool:
        """Whether there is an L2 at all."""
        return self.kind != NONE

    @property
    def is_embedded(self) -> bool:
        return self.kind == EMBEDDED

    def __repr__(self) -> str:
        if self.kind == EMBEDDED:
            idle = "" if self.idle is None else f", idle={self.idle}"
            return f"L2Spec(kind='embedded', servers={self.servers}, memory={self.memory}{idle})"
        if self.kind == NONE:
            return "L2Spec(kind='none')"
        memory = "" if self.memory is None else f", memory={self.memory}"
        return f"L2Spec(kind={self.kind!r}, urls={tuple(redact(u) for u in self.urls)!r}{memory})"


def l2_setting(l2=None, redis=None):
    """The L2 a caller named with ``l2=`` or with its old name ``redis=`` (NOTE [L2 resolved once]).

    Raises:
        ValueError: both are given.
    """
    if l2 is not None and redis is not None:
        raise ValueError("pass l2= (or its old name redis=), not both")
    return redis if l2 is None else l2


def resolve_l2(l2: L2Spec | None | bool | str | Sequence[str] = None, *, servers: int | None = None,
               memory: int | str | None = None, idle: float | None = None) -> L2Spec:
    """The :class:`L2Spec` a user's ``l2=`` setting names (NOTE [L2 resolved once]).

    Args:
        l2: an :class:`L2Spec` (returned as is); ``None``: the embedded servers; ``False``:
            no L2; a URL or a list of URLs: the store registered for their scheme.
        servers: embedded servers (``None``: one per 8 cores); checked whatever the kind.
        memory: the embedded servers' total maxmemory, or a sized store's size (``shm://``);
            checked whatever the kind.
        idle: the embedded servers' idle time in seconds (NOTE [idle embedded server]);
            checked whatever the kind, ignored by the others.

    Raises:
        ValueError: a wrong type, an unknown scheme (lists the registered ones), mixed kinds,
            a bad port or db, bad ``servers`` or ``memory``; ``servers``/``memory`` with an
            :class:`L2Spec` (they belong in it).
    """
    if isinstance(l2, L2Spec):
        if servers is not None or memory is not None or idle is not None:
            raise ValueError("an L2Spec carries its own servers, memory and idle time; do not pass them beside it")
        return l2
    embedded = L2Spec.embedded(servers, memory, idle)  # validates them, whatever the kind
    if l2 is None:
        return embedded
    if l2 is False:
        return L2Spec.none()
    if isinstance(l2, str):
        l2 = [l2]
    if not isinstance(l2, (list, tuple)) or not all(isinstance(u, str) for u in l2):
        raise ValueError(f"l2 (redis) must be None (embedded), False (no L2), a URL or a list of URLs; "
                         f"got a {type(l2).__name__}")
    return L2Spec.of_urls(l2, embedded.memory)
