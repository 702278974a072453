"""The timings of one step's exchange, as one typed record from the engine to the trainer's
time breakdown (``trainer.metrics.TimeBreakdown.add_exchange``)."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ExchangeTimings"]


@dataclass(frozen=True)
class ExchangeTimings:
    """Seconds of one step's exchange (all zero for an exchange that reports none, as DDP's).

    Attributes:
        select: top-k selection inside ``synchronize()``.
        select_overlapped: top-k selection during backward (inside backward's time).
        wait: all of ``synchronize()``.
        drained_in_backward: waiting inside backward for the previous step's pipelined
            exchange (NOTE [pipelined exchange] in comm/engine.py).
        launched_in_backward: buckets whose exchange started during backward.
    """

    select: float = 0.0
    select_overlapped: float = 0.0
    wait: float = 0.0
    drained_in_backward: float = 0.0
    launched_in_backward: int = 0
