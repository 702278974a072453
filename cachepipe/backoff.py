"""When to try a failed Redis shard again: one small backoff helper for every store.

NOTE [dead shard backoff]
A shard that fails (connection refused, timeout) is skipped until
``now + backoff.compute(failures)`` (redis-py's ``EqualJitterBackoff``: exponential, capped,
jittered), so a dead node costs one failed attempt per backoff window per process instead
of one per batch. The first success resets it. Reads skip a shard that is waiting; they go
to a replica, L1 or the source.
"""
from __future__ import annotations

import time

from redis.backoff import EqualJitterBackoff

__all__ = ["ShardHealth", "retry_delays"]


def retry_delays(base: float = 0.05, cap: float = 1.0):
    """Seconds to wait before retry 1, 2, ... (equal jitter, exponential, capped), for
    reads that may succeed a moment later (NOTE [stable reads] in ``source/reader.py``)."""
    backoff = EqualJitterBackoff(cap=cap, base=base)
    failures = 0
    while True:
        failures += 1
        yield backoff.compute(failures)


class ShardHealth:
    """Failure counter and retry deadline of one shard.

    Args:
        base: first wait in seconds.
        cap: longest wait in seconds.
    """

    __slots__ = ("backoff", "failures", "retry_at", "last_error")

    def __init__(self, base: float = 0.25, cap: float = 10.0) -> None:
        self.backoff = EqualJitterBackoff(cap=cap, base=base)
        self.failures = 0
        self.retry_at = 0.0
        self.last_error = ""

    def available(self) -> bool:
        """Whether a request may be sent now."""
        return self.failures == 0 or time.monotonic() >= self.retry_at

    def failed(self, error: BaseException) -> None:
        self.failures += 1
        self.last_error = f"{type(error).__name__}: {error}"
        self.retry_at = time.monotonic() + self.backoff.compute(self.failures)

    def succeeded(self) -> None:
        self.failures = 0
        self.retry_at = 0.0
