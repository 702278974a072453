"""L2 store protocol and what its implementations share (the registry that picks one from
the Redis URLs is ``cachepipe/l2/registry.py``).

A store maps sample indices to encoded values (see NOTE [L2 value format]) under one key
namespace ``<prefix>:<fingerprint>:<cache_size>:<decoder tag>:`` (:func:`namespace`);
each cached size has its own, so several sizes coexist in one Redis. Besides the values,
a namespace holds one hash ``<namespace>partial`` (NOTE [fixed L2 subset] in
``cachepipe/warmup.py``). Implementations never raise on a
failed read or write: they count it in ``counters`` (a ``collections.Counter``), warn,
and report a miss. Only the explicit checks (``missing``, ``shard_info``) raise
:class:`~cachepipe.errors.L2UnavailableError`.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from cachepipe.decode import DECODER_TAG

__all__ = ["PARTIAL_KEY", "SampleStore", "is_oom", "namespace"]

PARTIAL_KEY = "partial"  # <namespace>partial: NOTE [fixed L2 subset]


def namespace(prefix: str, fingerprint: str, cache_size: int) -> str:
    """The key prefix ``<prefix>:<fingerprint>:<cache_size>:<decoder tag>:`` of one cached
    size of a source (NOTE [decoder tag] in ``cachepipe/decode.py``)."""
    return f"{prefix}:{fingerprint}:{cache_size}:{DECODER_TAG}:"


@runtime_checkable
class SampleStore(Protocol):
    """What the two-level cache needs from L2."""

    def get_many(self, indices: Sequence[int]) -> list[bytes | memoryview | None]:
        """Values of ``indices`` as bytes-like objects (``None`` for a miss or a failed
        shard); one round trip per shard."""

    def put_many(self, items: Sequence[tuple[int, bytes]]) -> int:
        """Store ``(index, value)`` pairs; returns how many reached at least one shard."""

    def missing(self, indices: Sequence[int]) -> list[int]:
        """Indices lacking a value on at least one of their shards (raises if a shard is down)."""

    @property
    def nodes(self) -> int:
        """Number of nodes the URLs stand for (NOTE [placement] in ``cachepipe.l2.placement``)."""

    def node_of(self, indices: Sequence[int]) -> np.ndarray:
        """Node holding each index's value (its first live owner's), ``-1`` for none
        (NOTE [placement]); raises ``LocalityError`` when the store cannot tell."""

    def shard_info(self) -> list[dict]:
        """Per shard: ``url``, ``reachable``, ``used_memory``, ``maxmemory``, ``keys``, ``error``."""

    def mark_partial(self, node: str, uncached: int) -> None:
        """Record that warm-up of ``node`` left ``uncached`` samples out of L2 (0 clears it);
        see NOTE [fixed L2 subset] in ``cachepipe/warmup.py`` (raises if a shard is down)."""

    def partial(self) -> dict[str, int]:
        """``{node: uncached}`` as recorded by :meth:`mark_partial` on the reachable shards
        (empty: L2 is not a fixed subset; never raises)."""

    def scan(self, match: str) -> Iterator[bytes]:
        """Keys matching the glob ``match`` on every shard (or primary); raises if one is down."""

    def drop(self, match: str) -> int:
        """Delete (``UNLINK``) every key matching the glob ``match`` on every shard (or
        primary); returns how many (NOTE [stale namespaces]; raises if one is down)."""

    def close(self) -> None:
        """Drop connections."""


def is_oom(error: BaseException) -> bool:
    """Whether a Redis error is a write refused for ``maxmemory``."""
    from redis.exceptions import OutOfMemoryError

    return isinstance(error, OutOfMemoryError) or "maxmemory" in str(error) or str(error).startswith("OOM")

