"""The L2 store protocol: what every backend implements and what it may declare (the
registry that picks one by URL scheme is ``cachepipe/l2/registry.py``).

NOTE [L2 store protocol]
A store maps sample indices to encoded values (NOTE [L2 value format]) under one key
namespace ``<prefix>:<fingerprint>:<cache_size>:<decoder tag>:`` (:func:`namespace`); each
cached size has its own, so several sizes coexist in one store. Besides the values, a
namespace holds the record of what warm-up left out (``mark_partial``/``partial``, NOTE
[fixed L2 subset] in ``cachepipe/warmup.py``). A backend is a subclass of
:class:`SampleStore` with its abstract methods; its constructor is the registry's
``StoreFactory``. Reads and writes never raise on a failure: they count it in ``counters``
(a ``collections.Counter``, the names of ``cachepipe/counters.py``), warn once
(``cachepipe.errors.warn_once``) and report a miss. Only the explicit checks (``missing``,
``mark_partial``, ``scan``, ``drop``) raise :class:`~cachepipe.errors.L2UnavailableError`
with one line naming the store (never a password); ``shard_info`` reports a failure in its
rows. Keys are the namespace followed by the decimal index; ``scan`` and ``drop`` take a
Redis glob over them (:func:`glob_matcher`). What a backend does not say is declared here
with a default that is true of a backend that says nothing: no owner map, no health to
revive, every sample on one node, no server of its own whose CPU could be counted.
"""
from __future__ import annotations

import abc
import re
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from cachepipe.decode import DECODER_TAG

__all__ = ["PARTIAL_KEY", "SHARD_INFO", "SampleStore", "glob_escape", "glob_matcher", "is_oom", "namespace",
           "shard_row"]

PARTIAL_KEY = "partial"  # <namespace>partial: NOTE [fixed L2 subset]

# NOTE [shard_info keys]: every row of SampleStore.shard_info has exactly these keys (what
# capacity.py, coverage.py, cachepipe stats and warmup read), defaults as given here.
SHARD_INFO = {
    "url": "",            # the shard, printable (password as ***)
    "reachable": False,   # answered; the other numbers are meaningful only then
    "used_memory": 0,     # bytes its values take now
    "maxmemory": 0,       # bytes it may take (0: no limit of its own; then system_memory bounds it)
    "keys": 0,            # keys it holds (all namespaces)
    "policy": "",         # eviction policy: "allkeys-*" drops cached samples to make room (NOTE [evicting shards])
    "system_memory": 0,   # memory of the machine (or file system) it lives in, 0: unknown
    "error": "",          # why it is not reachable, one line
    "denied": False,      # it refused the check for lack of permission (NOTE [Redis ACL])
}


def shard_row(url: str, **fields) -> dict:
    """One ``shard_info`` row: :data:`SHARD_INFO` with ``fields`` set.

    Raises:
        ValueError: a key that is not one of NOTE [shard_info keys].
    """
    unknown = sorted(set(fields) - set(SHARD_INFO))
    if unknown:
        raise ValueError(f"shard_info has no key(s) {unknown}; its keys are {list(SHARD_INFO)}")
    return {**SHARD_INFO, "url": url, **fields}


def namespace(prefix: str, fingerprint: str, cache_size: int) -> str:
    """The key prefix ``<prefix>:<fingerprint>:<cache_size>:<decoder tag>:`` of one cached
    size of a source (NOTE [decoder tag] in ``cachepipe/decode.py``)."""
    return f"{prefix}:{fingerprint}:{cache_size}:{DECODER_TAG}:"


def glob_escape(text: str) -> str:
    """``text`` as a Redis glob that matches it literally: ``*``, ``?``, ``[``, ``]`` and ``\\``
    each behind a backslash. Every ``SCAN MATCH`` cachepipe builds from a user's prefix goes
    through it (NOTE [stale namespaces]): ``--prefix 'exp[1]'`` must never match ``exp1``.

    Example:
        >>> glob_escape("exp[1]*")
        'exp\\\\[1\\\\]\\\\*'
    """
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def glob_matcher(pattern: str) -> Callable[[bytes], bool]:
    """Whether a key matches ``pattern``, a Redis glob (``*``, ``?``, ``[a-z]``, ``[^x]``,
    ``\\`` escaping the next character), as ``SCAN MATCH`` reads it.

    Example:
        >>> glob_matcher("cp:ab*:1")(b"cp:abc:1"), glob_matcher(r"cp\\*")(b"cpx")
        (True, False)
    """
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if c == "[" and "]" in pattern[i + 1:]:
            end = pattern.index("]", i + 1)
            body, neg = pattern[i + 1:end], pattern[i + 1:i + 2] == "^"
            chars, k = [], int(neg)
            while k < len(body):  # literal characters, a-z ranges, \x the character x
                if body[k] == "\\" and k + 1 < len(body):
                    chars.append(re.escape(body[k + 1]))
                    k += 2
                    continue
                chars.append("-" if body[k] == "-" and 0 < k < len(body) - 1 else re.escape(body[k]))
                k += 1
            out.append("[" + "^" * neg + "".join(chars) + "]" if chars else "(?!)")
            i = end + 1
            continue
        out.append({"*": ".*", "?": "."}.get(c, re.escape(c)))
        i += 1
    regex = re.compile("".join(out).encode("utf-8", "surrogateescape"), re.S)
    return lambda key: regex.fullmatch(key) is not None


class SampleStore(abc.ABC):
    """What the two-level cache needs from L2 (NOTE [L2 store protocol]).

    Attributes:
        node_local: every node has its own store under the same URL (``shm://``); reads
            never leave the node, so several nodes need ``locality="node"`` (NOTE
            [placement]). Default False: the URLs name the nodes' stores.
        health: per shard, the :class:`~cachepipe.backoff.ShardHealth` a reader consults
            (the embedded servers are restarted by it, ``cachepipe/l2/level.py``); default
            none.
    """

    node_local: bool = False
    health: Sequence = ()

    @abc.abstractmethod
    def get_many(self, indices: Sequence[int]) -> list:
        """Values of ``indices`` as bytes-like objects (``None`` for a miss or a failed
        shard), one round trip per shard. A value may be a read-only view (of a reply
        buffer, of a memory map) that stays valid while it is referenced."""

    @abc.abstractmethod
    def put_many(self, items: Sequence[tuple[int, bytes]]) -> int:
        """Store ``(index, value)`` pairs; returns how many were stored. A write refused
        for lack of room counts ``l2_oom`` and ``l2_write_errors`` and warns with "L2 shard
        ... is out of memory" (NOTE [fixed L2 subset]: the warm-up leaves those out)."""

    @abc.abstractmethod
    def missing(self, indices: Sequence[int]) -> list[int]:
        """Indices lacking a value (on at least one of their shards); raises
        ``L2UnavailableError`` when it cannot tell."""

    @abc.abstractmethod
    def shard_info(self) -> list[dict]:
        """One row per shard, made by :func:`shard_row` (NOTE [shard_info keys]); never raises."""

    @abc.abstractmethod
    def mark_partial(self, node: str, uncached: int) -> None:
        """Record that warm-up of ``node`` (``"<rank>/<nodes>"``) left ``uncached`` samples
        of this namespace out of L2 (0 clears it; NOTE [fixed L2 subset]); raises
        ``L2UnavailableError`` when it cannot."""

    @abc.abstractmethod
    def partial(self) -> dict[str, int]:
        """``{node: uncached}`` as recorded by :meth:`mark_partial` (empty: L2 is not a fixed
        subset); never raises."""

    @abc.abstractmethod
    def scan(self, match: str) -> Iterator[bytes]:
        """Keys (``<namespace><index>``, any namespace) matching the Redis glob ``match``
        (:func:`glob_matcher`); raises ``L2UnavailableError`` when it cannot list them."""

    @abc.abstractmethod
    def drop(self, match: str) -> int:
        """Delete every key matching ``match`` (as :meth:`scan`); returns how many (NOTE
        [stale namespaces]; raises ``L2UnavailableError`` when it cannot)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Drop this process's connections or handles (values handed out stay valid)."""

    # -- capabilities a backend may declare; the defaults are true of one that does not --
    def owners(self, indices: Sequence[int]) -> np.ndarray | None:
        """``(n, replicas)`` positions, in ``shard_info`` order, of the shards that hold
        each index, best first; ``None`` (default): the store places values itself, spread
        evenly over its ``shard_info`` rows (NOTE [L2 sizing] in ``cachepipe/capacity.py``)."""
        return None

    def node_of(self, indices: Sequence[int], nodes: int | None = None) -> np.ndarray:
        """Node (``0 .. nodes - 1``) holding each index's value, ``-1`` for none (NOTE
        [placement]); ``nodes``: the job's node count (default: what the store's URLs name).
        Default: one node holds everything.

        Raises:
            LocalityError: the store cannot place samples on ``nodes`` nodes (says what to pass).
        """
        from cachepipe.l2.placement import LocalityError

        if nodes not in (None, 1):
            raise LocalityError(f"the L2 store {type(self).__name__} cannot tell which of {nodes} nodes holds a "
                                f"sample (it declares no placement, NOTE [placement]): pass one Redis URL per "
                                f"node, or shm:// on every node")
        return np.zeros(len(indices), dtype=np.int64)

    def server_cpu_seconds(self) -> float | None:
        """CPU seconds used so far by the server processes behind the store (what a
        benchmark charges to L2 beside its readers); 0.0: it has none, reads run in the
        reader; ``None`` (default): unknown.

        Raises:
            L2UnavailableError: a server cannot be asked.
        """
        return None


def is_oom(error: BaseException) -> bool:
    """Whether a Redis error is a write refused for ``maxmemory``."""
    from redis.exceptions import OutOfMemoryError

    return isinstance(error, OutOfMemoryError) or "maxmemory" in str(error) or str(error).startswith("OOM")
