"""One exchange in progress, for the engine and the DDP hook: an algorithm's stages run up
to their first collective in flight, resumed until the result is there (NOTE [exchange
stages] in comm/collectives/base.py); one step's exchanges, which the engine may keep
in flight into the next step (NOTE [pipelined exchange] in comm/engine.py); and the budget
of bytes they may hold at once.

NOTE [in-flight budget]: every bucket in flight holds its exchange's buffers (the pairs it
sent and gathered, ``(1 + P) k`` pairs for ``topk_ag``) until it is finished. With all of a
step's buckets in flight at once (the DDP hook finishes them at the last bucket, the
engine in ``synchronize()``) that is ``2 (1 + P) rho`` times the whole gradient: at density
1 on 2 workers six times it, more than the model and its gradients together. So the
buckets in flight may hold at most ``max_inflight_bytes`` (default 256 MiB, ten of DDP's
25 MiB buckets): before a bucket is launched, the oldest ones in flight are finished
until its buffers fit, or none is left. At low density every bucket still overlaps
backward; at high density they go one or a few at a time, each finished as soon as the
budget needs its memory. What a bucket holds comes from
:meth:`comm.collectives.base.Exchanger.inflight_bytes`, a function of its size, the
density and the topology only, so every rank finishes the same buckets at the same point
and the collectives keep one order on every rank (NOTE [exchange stages])."""
from __future__ import annotations

import time
from collections.abc import Iterable

import torch

from comm.collectives.base import Stages

__all__ = ["InFlight", "StepFlights", "DEFAULT_INFLIGHT_BYTES", "make_room"]

DEFAULT_INFLIGHT_BYTES = 256 * 2**20  # NOTE [in-flight budget]


class InFlight:
    """One exchange in progress: its stages run up to the first yield (NOTE [exchange stages]).

    ``finish()`` waits on each yielded ``Work`` and resumes until the result is there.
    """

    __slots__ = ("_stages", "_work", "result", "waited_s", "holds")

    def __init__(self, stages: Stages, holds: int = 0):
        self._stages, self._work, self.result, self.waited_s, self.holds = stages, None, None, 0.0, holds
        self._advance()

    @classmethod
    def completed(cls, result: torch.Tensor) -> InFlight:
        """An exchange already finished with ``result`` (restored from a checkpoint)."""
        flight = cls.__new__(cls)
        flight._stages, flight._work, flight.result, flight.waited_s, flight.holds = None, None, result, 0.0, 0
        return flight

    def _advance(self) -> None:
        try:
            self._work = self._stages.send(None)
        except StopIteration as stop:
            self._work, self.result, self._stages = None, stop.value, None

    @property
    def done(self) -> bool:
        return self._stages is None

    def finish(self) -> torch.Tensor:
        """Run the remaining stages; the exchange's result."""
        while not self.done:
            if self._work is not None:
                start = time.perf_counter()
                self._work.wait()
                self.waited_s += time.perf_counter() - start
            self._work = None  # the buffers it holds may be freed by the next stage
            self._advance()
        return self.result


def make_room(flights: Iterable[InFlight | None], need: int, budget: int | None) -> None:
    """Finish the oldest of ``flights`` (in order; None: a skipped bucket) until ``need`` more
    bytes fit in ``budget`` beside what the others hold (NOTE [in-flight budget]); ``budget``
    None: no limit."""
    if budget is None:
        return
    live = [f for f in flights if f is not None and not f.done]
    held = sum(f.holds for f in live)
    for flight in live:
        if held + need <= budget:
            return
        flight.finish()
        held -= flight.holds


class StepFlights:
    """One step's exchanges in plan order: ``(bucket, InFlight)``, with None for a bucket
    skipped as non-finite (NOTE [overflow steps] in comm/engine.py); with a pipelined
    exchange also this rank's own input of each exchange (``estimates``, kept until
    :meth:`GradientExchanger.lookahead_grads` takes them; NOTE [lookahead] in
    trainer/lookahead.py)."""

    __slots__ = ("flights", "skipped", "estimates")

    def __init__(self, flights: list[tuple[int, InFlight | None]], skipped: bool,
                 estimates: list[torch.Tensor] | None = None):
        self.flights, self.skipped, self.estimates = flights, skipped, estimates

    @property
    def done(self) -> bool:
        return all(f is None or f.done for _, f in self.flights)

    def finish(self) -> None:
        """Run every exchange to its result, in plan order (every rank alike)."""
        for _, flight in self.flights:
            if flight is not None:
                flight.finish()

    def state(self) -> dict:
        """The finished results (and estimates not taken yet), for a checkpoint (call
        :meth:`finish` first)."""
        return {"buckets": [b for b, _ in self.flights], "skipped": self.skipped,
                "gradients": [None if f is None else f.result for _, f in self.flights],
                "estimates": self.estimates}

    @classmethod
    def from_state(cls, state: dict, device: torch.device) -> StepFlights:
        """The finished step :meth:`state` saved, its tensors on ``device``."""
        estimates = state.get("estimates")
        return cls([(b, None if g is None else InFlight.completed(g.to(device)))
                    for b, g in zip(state["buckets"], state["gradients"])], bool(state["skipped"]),
                   None if estimates is None else [e.to(device) for e in estimates])
