"""The time an exchange spends in top-k selection, without blocking backward on a GPU."""
from __future__ import annotations

import functools
import time

import torch

__all__ = ["SelectTimer"]


class SelectTimer:
    """Time spent in top-k selection: the clock on CPU; CUDA events on a GPU, read only in
    :meth:`take` (from ``synchronize()``), so selection inside backward never blocks the host."""

    def __init__(self):
        self.seconds, self.events = 0.0, []

    def wrap(self, select):
        @functools.wraps(select)
        def run(x, k, *args, **kwargs):
            if x.is_cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = select(x, k, *args, **kwargs)
                end.record()
                self.events.append((start, end))
                return out
            start = time.perf_counter()
            out = select(x, k, *args, **kwargs)
            self.seconds += time.perf_counter() - start
            return out

        return run

    def take(self) -> float:
        """Seconds since the last call (waits for the recorded CUDA events)."""
        total = self.seconds
        for start, end in self.events:
            end.synchronize()
            total += start.elapsed_time(end) / 1e3
        self.seconds, self.events = 0.0, []
        return total
