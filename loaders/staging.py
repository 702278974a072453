"""A ring of staging slots, each reused only after the fence of its last copy has completed.

NOTE [staging ring]: to reach a GPU, a batch is copied from the worker's shared memory
into page-locked (pinned) host memory, from which the GPU copies it asynchronously on a
side stream (FFCV's loader does the same). ``copy_(non_blocking=True)`` returns before
the GPU has read the pinned buffer, so a buffer that *looks* idle to the host (no Python
reference to it) may still be read by a copy in flight; writing the next batch into it
then corrupts the batch the GPU is reading. So every slot carries a *fence*: recorded
after the copy that reads the slot was enqueued, and waited on before the slot is handed
out again. The ring holds a fixed number of slots (the loader's prefetch + 2, as FFCV's
batches-ahead + 2), allocated once per shape, so nothing is allocated per batch in steady
state. The fence is a small protocol: a CUDA event on the copy's stream on a GPU; on CPU a
copy is over when it returns (``DONE``); tests plug in a fence they complete themselves.
"""
from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["Fence", "DONE", "CudaFence", "StagingRing"]


class Fence(Protocol):
    """What a slot waits for before it is written again: the end of the copy that reads it."""

    def done(self) -> bool:
        """Whether the copy is over (never blocks)."""

    def wait(self) -> None:
        """Block until the copy is over."""


class _Done:
    """The fence of a slot no copy reads (a new slot, or a copy that was synchronous)."""

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        pass

    def __repr__(self) -> str:
        return "DONE"


DONE: Fence = _Done()


class CudaFence:
    """A CUDA event recorded on ``stream`` now: done once the work enqueued there so far ran.

    Args:
        stream: the stream the copy was enqueued on.
    """

    __slots__ = ("event",)

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.event = torch.cuda.Event()
        self.event.record(stream)

    def done(self) -> bool:
        return self.event.query()

    def wait(self) -> None:
        self.event.synchronize()


class StagingRing:
    """``slots`` reusable host buffers handed out in turn, each only once its fence is done.

    Args:
        slots: ring size (>= 1); the loaders use their prefetch + 2.
        pin: allocate page-locked memory (needs CUDA); plain memory otherwise.

    Attributes:
        allocations: buffers allocated so far (one per slot and shape in steady state).
        waits: times ``acquire`` had to block on a fence that was not done yet.

    Example:
        >>> ring = StagingRing(2)
        >>> slot, buf = ring.acquire((4, 3), torch.uint8)
        >>> ring.release(slot, DONE)
    """

    def __init__(self, slots: int, *, pin: bool = False) -> None:
        if slots < 1:
            raise ValueError(f"a staging ring needs >= 1 slots, got {slots}")
        self.pin = pin
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._fences: list[Fence | None] = [DONE] * slots  # None: handed out, not released yet
        self._next = 0
        self.allocations = 0
        self.waits = 0

    def __len__(self) -> int:
        return len(self._buffers)

    def acquire(self, shape, dtype: torch.dtype,
                memory_format: torch.memory_format = torch.contiguous_format) -> tuple[int, torch.Tensor]:
        """The next slot and its buffer, after waiting for the fence of the slot's last copy.

        Raises:
            RuntimeError: the slot was handed out and never released (a caller's bug).
        """
        slot = self._next
        fence = self._fences[slot]
        if fence is None:
            raise RuntimeError(f"staging slot {slot} was acquired and not released; release every slot "
                               f"before the ring comes round to it again")
        if not fence.done():
            self.waits += 1
            fence.wait()
        self._next = (slot + 1) % len(self)
        buf = self._buffers[slot]
        if buf is None or buf.shape != torch.Size(shape) or buf.dtype != dtype or \
                not buf.is_contiguous(memory_format=memory_format):
            buf = torch.empty(shape, dtype=dtype, memory_format=memory_format, pin_memory=self.pin)
            self._buffers[slot] = buf
            self.allocations += 1
        self._fences[slot] = None
        return slot, buf

    def release(self, slot: int, fence: Fence) -> None:
        """Give ``slot`` back; it is handed out again only once ``fence`` is done."""
        self._fences[slot] = fence
