"""One exchange in progress, for the engine and the DDP hook: an algorithm's stages run up
to their first collective in flight, resumed until the result is there (NOTE [exchange
stages] in comm/collectives/base.py); and one step's exchanges, which the engine may keep
in flight into the next step (NOTE [pipelined exchange] in comm/engine.py)."""
from __future__ import annotations

import time

import torch

from comm.collectives.base import Stages

__all__ = ["InFlight", "StepFlights"]


class InFlight:
    """One exchange in progress: its stages run up to the first yield (NOTE [exchange stages]).

    ``finish()`` waits on each yielded ``Work`` and resumes until the result is there.
    """

    __slots__ = ("_stages", "_work", "result", "waited_s")

    def __init__(self, stages: Stages):
        self._stages, self._work, self.result, self.waited_s = stages, None, None, 0.0
        self._advance()

    @classmethod
    def completed(cls, result: torch.Tensor) -> InFlight:
        """An exchange already finished with ``result`` (restored from a checkpoint)."""
        flight = cls.__new__(cls)
        flight._stages, flight._work, flight.result, flight.waited_s = None, None, result, 0.0
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
            self._advance()
        return self.result


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
