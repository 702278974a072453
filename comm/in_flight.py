"""One exchange in progress, for the engine and the DDP hook: an algorithm's stages run up
to their first collective in flight, resumed until the result is there (NOTE [exchange
stages] in comm/collectives/base.py)."""
from __future__ import annotations

import time

import torch

from comm.collectives.base import Stages

__all__ = ["InFlight"]


class InFlight:
    """One exchange in progress: its stages run up to the first yield (NOTE [exchange stages]).

    ``finish()`` waits on each yielded ``Work`` and resumes until the result is there.
    """

    __slots__ = ("_stages", "_work", "result", "waited_s")

    def __init__(self, stages: Stages):
        self._stages, self._work, self.result, self.waited_s = stages, None, None, 0.0
        self._advance()

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
